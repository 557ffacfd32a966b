"""Commands that run a team: `ask`, `eval`, `train`, and `compare` of two runs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from searchteam.cli.app import app, console, err_console, quiet_libraries, user_errors
from searchteam.cli.flags import QUESTION_FLAGS, RUN_FLAGS, RunFlags, config_flag, shared_flags
from searchteam.errors import ConfigError
from searchteam.rl.config import TrainConfig
from searchteam.train.config import TrainRunConfig

if TYPE_CHECKING:
    from searchteam.types import Episode


@app.command()
@shared_flags(RUN_FLAGS)
def ask(
    question: Annotated[str, typer.Argument(help="The question to answer.")],
    flags: RunFlags,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and trace as JSON.")] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Print each turn as it finishes (with --json: one JSON line per turn, then the answer's).",
        ),
    ] = False,
) -> None:
    """Answer one question and show what each agent did."""
    from searchteam.eval.summary import episode_trace
    from searchteam.factory import build_components, build_sampling
    from searchteam.runtime import make_backends, run_episodes
    from searchteam.runtime.turns import TurnFeed
    from searchteam.teams.base import WITHDRAWN
    from searchteam.types import Question

    with user_errors():
        quiet_libraries()
        cfg = flags.load()
        parts = build_components(cfg)
        backends = make_backends(parts.llms, parts.retriever, cfg.batch_size)
        q = Question(id="ask", question=question)
        feed = TurnFeed(_echo_turn_json if as_json else _print_turn)
        episodes, _ = asyncio.run(
            run_episodes(
                parts.team.solve,
                cfg.method,
                [q],
                backends,
                build_sampling(cfg),
                model_name=cfg.model,
                on_turn=feed if stream else None,
                progress=False,
            )
        )
    episode = episodes[0]
    if as_json:
        payload = {
            "answer": episode.answer,
            "method": cfg.method,
            "model": cfg.model,
            **episode_trace(episode),
            "withdrawn_example_answer": episode.meta.get(WITHDRAWN),
            "error": episode.error,
        }
        typer.echo(json.dumps(payload, ensure_ascii=False, indent=None if stream else 2, default=str))
        return
    if not stream:
        _print_episode_table(episode)
    for r in episode.retrievals[feed.searched :] if stream else []:  # searches after the last turn
        _print_search(r.query, [p.title for p in r.passages])
    console.print(f"[bold green]Answer:[/] {escape(episode.answer)}")
    if WITHDRAWN in episode.meta:
        err_console.print(
            f"[yellow]withdrawn:[/] {escape(episode.meta[WITHDRAWN])!r}, the prompt example's answer, "
            "which no retrieved passage holds"
        )
    if episode.error:
        err_console.print(f"[yellow]episode error:[/] {escape(episode.error)}")


def _print_turn(event: dict[str, Any]) -> None:
    """One finished turn (a `turn_event`): the searches that fed it, then its role and a short output."""
    for search in event["searches"]:
        _print_search(search["query"], search["titles"])
    text = " ".join(event["output"].split())
    short = text[:160] + ("…" if len(text) > 160 else "")
    console.print(f"[dim]{event['step']:>3}[/] [bold cyan]{escape(event['role']):<8}[/] {escape(short)}")


def _print_search(query: str, titles: list[str]) -> None:
    console.print(f"        [dim]searched[/] {escape(query)} [dim]→[/] {escape(', '.join(titles[:5]))}")


def _echo_turn_json(event: dict[str, Any]) -> None:
    typer.echo(json.dumps({"turn": event}, ensure_ascii=False))


def _print_episode_table(episode: Episode) -> None:
    """The episode's turns and searches as one table, in the order they ran."""
    from searchteam.runtime.turns import run_order
    from searchteam.types import Turn

    table = Table(title=f"{episode.method} trace", show_lines=False)
    for col in ("step", "role", "output", "ok", "tokens"):
        table.add_column(col)
    for item in run_order(episode):
        if isinstance(item, Turn):
            text = " ".join(item.completion.split())
            table.add_row(
                str(item.step),
                escape(item.role),
                escape(text[:120] + ("…" if len(text) > 120 else "")),
                "yes" if item.parsed_ok else "[red]no[/]",
                f"{item.prompt_tokens}+{item.completion_tokens}",
            )
        else:
            titles = ", ".join(p.title for p in item.passages[:5])
            table.add_row(str(item.step), "search", escape(f"{item.query} → {titles}"), "", "")
    console.print(table)


@app.command("eval")
@shared_flags(RUN_FLAGS, QUESTION_FLAGS)
def eval_cmd(
    flags: RunFlags,
    judge_model: config_flag("judge_model") = None,  # type: ignore[valid-type]
) -> None:
    """Evaluate a method on benchmark questions; results are written as they finish."""
    from searchteam.eval.runner import evaluate
    from searchteam.factory import load_run_config

    with user_errors():
        quiet_libraries()
        overrides = {**flags.overrides(), "judge_model": judge_model}
        cfg = load_run_config(flags.config, overrides, settings=flags.settings())
        summary = evaluate(cfg)
    _print_summary(summary)


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(title=f"{summary['method']} on {summary['model']} (n={summary['n']})")
    judged = "judge_acc" in summary
    for col in ("dataset", "n", "EM", "cover-EM", "F1", *(["judge"] if judged else [])):
        table.add_column(col, justify="right" if col != "dataset" else "left")
    for name, s in [*summary["per_dataset"].items(), *summary["per_group"].items(), ("all", summary)]:
        judge = [f"{s['judge_acc']:.3f}"] if judged else []
        table.add_row(name, str(s["n"]), f"{s['em']:.3f}", f"{s['cover_em']:.3f}", f"{s['f1']:.3f}", *judge)
    console.print(table)
    console.print(
        f"LLM calls/q {summary['llm_calls_mean']:.2f} · "
        f"prompt tokens/q {summary['prompt_tokens_mean']:.0f} · "
        f"completion tokens/q {summary['completion_tokens_mean']:.0f} · "
        f"retrievals/q {summary['retrievals_mean']:.2f} · format errors {summary['format_error_rate']} · "
        f"prompt example's answer {summary['example_answer_copies']}× "
        f"(withdrawn {summary.get('example_answers_withdrawn', 0)}×) · {summary['seconds_total']:.1f}s"
    )


@app.command()
@shared_flags(RUN_FLAGS, QUESTION_FLAGS)
def train(
    flags: RunFlags,
    steps: config_flag("steps", model=TrainConfig) = None,
    init_from: config_flag("init_from", model=TrainRunConfig) = None,
    num_processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Data-parallel training processes on this machine (DDP: one per GPU, or gloo on the CPU).",
        ),
    ] = 1,
) -> None:
    """Train a team with RL (per-method rewards; PPO/GRPO/GSPO; shared or per-role LoRA). Without --config,
    the method's shipped recipe for this device (`searchteam recipes`)."""
    import sys

    from searchteam.train.build import build_trainer, launch_processes
    from searchteam.train.config import check_shardable, load_train_run_config
    from searchteam.train.plot import curves_after_training

    with user_errors():
        quiet_libraries()
        overrides = {**flags.overrides(), "train.steps": steps, "init_from": init_from}
        cfg = load_train_run_config(flags.config, overrides, flags.settings())
        if num_processes > 1 and "LOCAL_RANK" not in os.environ:  # not yet one of the launched processes
            check_shardable(cfg, num_processes)
            raise typer.Exit(launch_processes(num_processes, sys.argv[1:]))
        run_dir = cfg.out or Path("runs") / f"train-{cfg.method}"
        trainer = build_trainer(cfg, run_dir, on_step=lambda record: console.print(_step_line(record)))
        main = trainer.accelerator.is_main_process
        if cfg.resume:
            step = trainer.resume()
            if main:
                console.print(f"resuming at step {step}")
        elif trainer.log_path.exists() and trainer.log_path.stat().st_size:
            raise ConfigError(
                f"{run_dir} already holds a training log: pass --resume or choose another --out"
            )
        trainer.train()
        if main:
            console.print(f"[green]done:[/] {run_dir} (curves: {curves_after_training(run_dir)})")


def _step_line(record: dict[str, Any]) -> str:
    if "round" in record:
        errors = " ".join(
            f"{k.split('/', 1)[1]}={v:.0%}" for k, v in sorted(record.items()) if k.startswith("format_error")
        )
        return (
            f"warm-start round {record['round']}: kept {record['kept']:.0f}/{record['episodes']:.0f} "
            f"(F1 {record['f1/sampled']:.3f}) format errors {errors or '-'} "
            f"sft_loss={record.get('sft_loss')} rollout={record['time/rollout']:.1f}s "
            f"update={record['time/update']:.1f}s"
        )
    roles = {k.split("/", 1)[1]: v for k, v in record.items() if k.startswith("reward/") and v is not None}
    rewards = " ".join(f"{r}={v:.3f}" for r, v in sorted(roles.items()))
    times = " ".join(
        f"{k.split('/')[1]}={record.get(k, 0) or 0:.1f}s"
        for k in ("time/rollout", "time/reward", "time/update")
    )
    return f"step {record['step']}: {rewards} loss={record.get('loss')} {times}"


@app.command()
def compare(
    run_a: Annotated[Path, typer.Argument(help="Baseline eval run directory (or its results.jsonl).")],
    run_b: Annotated[Path, typer.Argument(help="Eval run compared against it, on the same questions.")],
    metric: Annotated[str, typer.Option(help="Metrics of the result rows, comma-separated.")] = "em,f1",
    by: Annotated[
        str,
        typer.Option(
            help="Slices besides all: group (single/multi-hop), dataset, form (two-way/open), none."
        ),
    ] = "group",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Pair two eval runs question by question: B − A with a 95% bootstrap interval and sign-flip p."""
    from searchteam.eval.compare import compare_runs, report_json

    with user_errors():
        metrics = tuple(m.strip() for m in metric.split(",") if m.strip())
        diffs, unpaired = compare_runs(run_a, run_b, metrics, by)
    if as_json:
        console.print_json(json.dumps(report_json(diffs, unpaired)))
        return
    table = Table(title=f"B − A   (A = {run_a}, B = {run_b})")
    for column in ("slice", "metric", "n", "A", "B", "B − A", "95% CI", "p", "B>A / A>B"):
        table.add_column(column)
    for d in diffs:
        mark = "[bold green]" if d.ci_low > 0 else "[bold red]" if d.ci_high < 0 else ""
        table.add_row(
            d.slice,
            d.metric,
            str(d.n),
            f"{d.mean_a:.3f}",
            f"{d.mean_b:.3f}",
            f"{mark}{d.diff:+.3f}",
            f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}]",
            f"{d.p_value:.3g}",
            f"{d.b_better} / {d.a_better}",
        )
    (console if console.width >= 120 else Console(width=120)).print(table)  # 80 columns wrap the intervals
    if unpaired["only_a"] or unpaired["only_b"]:
        console.print(f"left out: {unpaired['only_a']} questions only in A, {unpaired['only_b']} only in B")
