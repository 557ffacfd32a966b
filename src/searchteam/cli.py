"""The `searchteam` command line."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from searchteam.auth import API_KEY_ENV
from searchteam.config import RunConfig, parse_settings
from searchteam.errors import ConfigError, SearchTeamError
from searchteam.methods import METHODS

if TYPE_CHECKING:
    from searchteam.types import Episode

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()
err_console = Console(stderr=True)


def _show_version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"searchteam {version('searchteam')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass  # the options of `searchteam` itself, before any command


# The flags shared by the commands that run a team (`RUN_FLAGS`) and by those that run it on a question set
# (`QUESTION_FLAGS`): defined once here, given to a command by `@shared_flags(...)`, read as `RunFlags`.
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML file (or shipped recipe name) with any config fields.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Set any config field, dotted for a nested one (--set train.lr=1e-5 --set reward.stage=2); "
        "values are read as YAML. Applied after --config and before the other flags. Repeatable.",
    ),
]

ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        envvar=API_KEY_ENV,
        help="Require this key on every request but /health (Authorization: Bearer KEY).",
    ),
]
AllowOpenOpt = Annotated[
    bool,
    typer.Option("--allow-no-api-key", help="Serve beyond the loopback interface without a key."),
]


def config_flag(field: str, *decls: str, kind: Any = None) -> Any:
    """The flag of the run-config field `field`, whose help is the field's description (written once, in
    `RunConfig`); `kind` is the flag's type where the command line writes the value as text (a choice, a
    comma-separated list)."""
    info = RunConfig.model_fields[field]
    return Annotated[(kind or info.annotation) | None, typer.Option(*decls, help=info.description)]


# a field whose flag is spelled other than `--field-name`, or whose value the command line writes as text
FLAG_SPELLING: dict[str, dict[str, Any]] = {
    "method": {"decls": ("--method", "-m")},
    "backend": {"kind": str},
    "base_url": {"kind": str},
    "datasets": {"decls": ("--dataset",), "kind": str},
    "report_to": {"decls": ("--report-to",), "kind": str},
    "skip_bad_lines": {"decls": ("--skip-bad-lines",)},
    "resume": {"decls": ("--resume/--no-resume",)},
}


def config_flags(*fields: str) -> dict[str, Any]:
    """The flags of run-config fields, by field name (`RunFlags.overrides` passes them on as they are)."""
    spelled = {name: FLAG_SPELLING.get(name, {}) for name in fields}
    return {
        name: config_flag(name, *how.get("decls", ()), kind=how.get("kind")) for name, how in spelled.items()
    }


RUN_FLAGS: dict[str, Any] = {
    "config": ConfigOpt,
    "settings": SetOpt,
    **config_flags(
        "method",
        "model",
        "backend",
        "base_url",
        "device",
        "retriever",
        "corpus",
        "embedder",
        "reranker",
        "top_k",
        "max_turns",
        "temperature",
        "max_new_tokens",
        "batch_size",
    ),
}
QUESTION_FLAGS: dict[str, Any] = config_flags(
    "datasets", "split", "questions", "skip_bad_lines", "limit", "report_to", "out", "resume"
)


@dataclass(frozen=True)
class RunFlags:
    """The shared flags one command was given (None: not given), as run-config overrides."""

    given: dict[str, Any]

    @property
    def config(self) -> Path | None:
        return self.given.get("config")

    def settings(self) -> dict[str, Any]:
        """The `--set` items as {dotted key: value}."""
        return parse_settings(self.given.get("settings") or [])

    def overrides(self) -> dict[str, Any]:
        """Config fields from the other flags."""
        return {k: v for k, v in self.given.items() if k not in ("config", "settings")}

    def load(self) -> RunConfig:
        from searchteam.factory import load_run_config

        return load_run_config(self.config, self.overrides(), settings=self.settings())


def shared_flags(*groups: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of `groups` in place of its `flags: RunFlags` parameter; it is called with
    them collected into `flags`."""
    names = [name for group in groups for name in group]
    options = {name: option for group in groups for name, option in group.items()}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        params: list[inspect.Parameter] = []
        for param in inspect.signature(command, eval_str=True).parameters.values():
            if param.name == "flags":
                params += [
                    inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=options[n])
                    for n in names
                ]
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            return command(flags=RunFlags(given), **kwargs)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


@contextmanager
def user_errors() -> Iterator[None]:
    """Show problems a user can fix as one clear line instead of a traceback: bad input, an unreachable
    model or retriever, a full disk or a folder that cannot be written."""
    from searchteam.files import filesystem_fault

    try:
        yield
    except (SearchTeamError, OSError) as exc:
        if isinstance(exc, OSError):
            message = filesystem_fault(exc)
            if message is None:
                raise
        else:
            message = str(exc.args[0]) if exc.args else str(exc)
        err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
        raise typer.Exit(2) from None


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    # peft still reads the deprecated property when it wraps a transformers 5 model; nothing for a user to fix
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    transformers.utils.logging.disable_progress_bar()


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
        _quiet_libraries()
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
        _quiet_libraries()
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
    steps: Annotated[
        int | None,
        typer.Option(min=0, help="Total RL steps (with --resume: up to this total; 0: warm start only)."),
    ] = None,
    init_from: Annotated[
        str | None,
        typer.Option(help="Start from trained weights: a checkpoint folder or a shipped adapter's name."),
    ] = None,
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

    from searchteam.rl.plot import curves_after_training
    from searchteam.train.build import build_trainer, launch_processes
    from searchteam.train.config import check_shardable, load_train_run_config

    with user_errors():
        _quiet_libraries()
        overrides = {**flags.overrides(), "steps": steps, "init_from": init_from}
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


@app.command()
def export(
    runs: Annotated[list[Path], typer.Argument(help="Eval or training run folders (several: one dataset).")],
    out: Annotated[Path, typer.Option(help="A new folder for the dataset (Parquet files and README.md).")],
    views: Annotated[str, typer.Option(help="Views besides turns, comma-separated (none: no views).")] = (
        "sft,dpo,kto,stepwise"
    ),
    min_f1: Annotated[
        float,
        typer.Option(help="sft keeps, and kto labels good, the turns of episodes with F1 at least this."),
    ] = 0.8,
    passages: Annotated[
        bool, typer.Option(help="Passage texts in the rows (ids and titles are always there).")
    ] = True,
    tokens: Annotated[bool, typer.Option(help="Token ids in the rows (needs the model's tokenizer).")] = True,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer to use instead of the run's model's (a preset or path).")
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(help="Corpus for passage titles and texts (default: the one the run names)."),
    ] = None,
) -> None:
    """Write runs as a Hugging Face dataset: one row per turn, and SFT, DPO, KTO and step-wise views."""
    from searchteam.integrations.export import export_runs

    chosen = tuple(v.strip() for v in views.split(",") if v.strip() and v.strip() != "none")
    with user_errors():
        _quiet_libraries()
        report = export_runs(
            runs, out, views=chosen, min_f1=min_f1, passages=passages, tokens=tokens, tokenizer=tokenizer,
            corpus=corpus,
        )  # fmt: skip
    for note in report.notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    counts = ", ".join(f"{name} {n}" for name, n in report.counts.items())
    console.print(f"[green]wrote[/] {report.out}: {counts} rows")


EXPORT_QUESTION_FLAGS = {"config": ConfigOpt, "settings": SetOpt} | config_flags(
    "method", "datasets", "split", "questions", "skip_bad_lines", "limit"
)


@app.command("export-questions")
@shared_flags(EXPORT_QUESTION_FLAGS)
def export_questions(
    flags: RunFlags,
    to: Annotated[str, typer.Option("--format", help="verl | skyrl")],
    out: Annotated[Path, typer.Option(help="Folder for SPLIT.parquet.")],
) -> None:
    """Write a question set as the prompt dataset verl or SkyRL trains from, naming the method to run."""
    from searchteam.eval.runner import select_questions
    from searchteam.integrations.questions import write_questions

    with user_errors():
        config = flags.load()
        path = write_questions(select_questions(config), config.method, to, config.split, out)
    console.print(f"[green]wrote[/] {path}")


@app.command()
def plot(run_dir: Annotated[Path, typer.Argument(help="A `searchteam train` run directory.")]) -> None:
    """Write PNG training curves for a run."""
    from searchteam.rl.plot import plot_run

    with user_errors():
        console.print(f"wrote {plot_run(run_dir)}")


@app.command()
def index(
    retriever: Annotated[str, typer.Option(help="bm25 | dense")] = "bm25",
    corpus: Annotated[Path | None, typer.Option(help="Corpus JSONL(.gz) with id, title, text.")] = None,
    embedder: Annotated[str | None, typer.Option(help="sentence-transformers model for dense.")] = None,
) -> None:
    """Build (or load from cache) a retrieval index."""
    from searchteam.retrieval import build_retriever

    with user_errors():
        built = build_retriever(retriever, corpus=corpus, embedder=embedder)
    console.print(f"[green]ready:[/] {built.name}")


@app.command("serve-retriever")
def serve_retriever(
    retriever: Annotated[str, typer.Option(help="bm25 | dense")] = "bm25",
    corpus: Annotated[Path | None, typer.Option(help="Corpus JSONL(.gz) with id, title, text.")] = None,
    embedder: Annotated[str | None, typer.Option(help="sentence-transformers model for dense.")] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8001,
    max_pending: Annotated[
        int, typer.Option(min=1, help="Requests in flight at most; more get 503 with Retry-After.")
    ] = 512,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="Largest request body (4 MiB); larger: 413.")
    ] = 4_194_304,
    request_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may take; slower: 504.")
    ] = 25.0,
    api_key: ApiKeyOpt = None,
    allow_no_api_key: AllowOpenOpt = False,
) -> None:
    """Serve a Search-R1-compatible POST /retrieve endpoint."""
    from searchteam.auth import check_bind
    from searchteam.retrieval import build_retriever
    from searchteam.retrieval.server import serve

    with user_errors():
        check_bind(host, api_key, allow_no_api_key)
        built = build_retriever(retriever, corpus=corpus, embedder=embedder)
    limits = {
        "max_pending": max_pending,
        "max_body_bytes": max_body_bytes,
        "request_timeout_s": request_timeout,
    }
    serve(built, host=host, port=port, api_key=api_key, allow_open=allow_no_api_key, **limits)


@app.command()
def view(
    run_a: Annotated[Path, typer.Argument(help="An eval or training run directory.")],
    run_b: Annotated[Path | None, typer.Argument(help="A second run, shown side by side.")] = None,
    corpus: Annotated[
        Path | None, typer.Option(help="Corpus for passage texts (default: the one the run names).")
    ] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8765,
) -> None:
    """Browse a run's episodes turn by turn in the browser (read-only)."""
    import uvicorn

    from searchteam.viewer import create_app

    with user_errors():
        viewer = create_app([run_a, *([run_b] if run_b else [])], corpus)
    console.print(f"viewer on http://{host}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(viewer, host=host, port=port, log_level="warning")


@app.command()
@shared_flags(RUN_FLAGS)
def serve(
    flags: RunFlags,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    max_pending: Annotated[
        int, typer.Option(min=1, help="Requests in flight at most; more get 503 with Retry-After.")
    ] = 256,
    max_body_bytes: Annotated[
        int, typer.Option(min=1, help="Largest request body (1 MiB); larger: 413.")
    ] = 1_048_576,
    request_timeout: Annotated[
        float, typer.Option(min=0.001, help="Seconds a request may take; slower: cancelled, 504.")
    ] = 300.0,
    api_key: ApiKeyOpt = None,
    allow_no_api_key: AllowOpenOpt = False,
) -> None:
    """Serve a team over HTTP: POST /ask and OpenAI-compatible /v1/chat/completions (model = method).
    At most `concurrency` (config) episodes run at once."""
    from searchteam.auth import check_bind
    from searchteam.serve import ServeLimits, build_service
    from searchteam.serve import serve as serve_team

    with user_errors():
        check_bind(host, api_key, allow_no_api_key)
        _quiet_libraries()
        cfg = flags.load()
        limits = ServeLimits(
            concurrency=cfg.concurrency,
            max_pending=max_pending,
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout,
        )
        service = build_service(cfg, limits=limits)
    console.print(f"serving {cfg.method} on {cfg.model} at http://{host}:{port}/ (Ctrl-C stops it)")
    serve_team(service, host=host, port=port, api_key=api_key, allow_open=allow_no_api_key)


JSON_LISTING = typer.Option(False, "--json", help="one JSON object per entry, as a list")


def print_listing(columns: tuple[str, ...], rows: list[tuple[str, ...]], as_json: bool) -> None:
    """A listing that never cuts what a user types (the first column, a name): a table in a terminal whose
    name column does not wrap, tab-separated lines when piped, or JSON."""
    if as_json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2))
        return
    if not console.is_terminal:
        for row in rows:
            print("\t".join(row))
        return
    table = Table()
    table.add_column(columns[0], no_wrap=True, min_width=max(len(row[0]) for row in rows))
    for column in columns[1:]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)


@app.command()
def methods(as_json: bool = JSON_LISTING) -> None:
    """List every method with a one-line description."""
    print_listing(("method", "description"), [(n, c.description) for n, c in METHODS.items()], as_json)


@app.command()
def recipes(as_json: bool = JSON_LISTING) -> None:
    """List the shipped training recipes (names for `searchteam train --config`) and what each is for."""
    from searchteam.methods import shipped_recipes

    rows = [(name, purpose) for name, (_, purpose) in shipped_recipes().items()]
    print_listing(("recipe", "purpose"), rows, as_json)


@app.command("ship-adapter")
def ship_adapter(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint or warm-start round folder (RUN/checkpoints/step-N).")
    ],
    name: Annotated[str, typer.Argument(help="The name it is selected by (--model NAME).")],
    into: Annotated[
        Path | None, typer.Option(help="Folder to write it under (default: the package's adapters/).")
    ] = None,
) -> None:
    """Copy a training checkpoint's LoRA adapters (fp16) into the package as a named trained adapter;
    register the name in searchteam.llm.models.TRAINED to select it with --model."""
    from searchteam.ship import ship

    with user_errors():
        target = ship(checkpoint, name, into) if into else ship(checkpoint, name)
    console.print(f"[green]shipped:[/] {target}")


@app.command()
def models(as_json: bool = JSON_LISTING) -> None:
    """List the model presets and the trained adapters shipped with searchteam (names for --model)."""
    from searchteam.llm.models import PRESETS, TRAINED

    rows = [(name, "preset", preset.description) for name, preset in PRESETS.items()]
    rows += [(n, f"{t.method} adapter on {t.base}", t.description) for n, t in TRAINED.items()]
    print_listing(("model", "kind", "description"), rows, as_json)


if __name__ == "__main__":
    app()
