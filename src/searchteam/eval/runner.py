"""`searchteam eval`: run a method over questions, writing one result line per finished question; then
optionally an LLM judge's verdicts (`judge_model`) and a report of the summary to trackers (`report_to`)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import yaml

from searchteam.config import RunConfig
from searchteam.errors import ConfigError, JsonlError, TeamBug
from searchteam.eval.judge_metric import judge_rows
from searchteam.eval.summary import result_row, summarize
from searchteam.factory import (
    Components,
    build_components,
    build_sampling,
    build_team,
    effective_config,
    secondary_llm,
    select_questions,
)
from searchteam.files import read_jsonl_tolerant, write_lines_atomic
from searchteam.llm import LLM
from searchteam.runtime import make_backends, run_episodes
from searchteam.tracking import TrackingSetup, check_installed, report_once, trackers_for
from searchteam.types import Episode, Question


def default_out_dir(config: RunConfig) -> Path:
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(config.model).name or config.model)
    data = config.questions.stem if config.questions else "-".join(config.datasets or ["all"])
    return Path("runs") / f"{config.method}-{model}-{data}-{config.split}"


def read_results(path: Path) -> list[dict[str, Any]]:
    """Rows already written; a torn last line (the process died mid-write) is dropped and rewritten."""
    if not path.exists():
        return []
    try:
        return read_jsonl_tolerant(path, repair=True)
    except JsonlError as exc:
        raise ConfigError(
            f"{exc}: the results file is damaged; delete that line (--resume asks its question again) "
            "or choose another --out"
        ) from None


def result_line(row: dict[str, Any]) -> str:
    """One line of `results.jsonl`."""
    return json.dumps(row, ensure_ascii=False, default=str) + "\n"


# Run settings a resumed eval may change: which questions it covers, where and how fast it runs, and what
# it reports. Every other setting decides the answers, so the rows already written must share it.
RESUMABLE_CHANGES = frozenset(
    {
        "datasets", "questions", "lines", "limit", "skip_bad_lines", "out", "resume", "batch_size",
        "concurrency", "device", "base_url", "report_to", "tracker_project", "judge_model", "judge_backend",
        "judge_base_url", "engine", "server",
    }
)  # fmt: skip


def check_resume_matches(out: Path, current: dict[str, Any]) -> None:
    """Refuse to resume a run directory whose `config.yaml` differs from `current` in a setting that decides
    the answers (model, method, retriever, sampling, ...): its rows would mix two systems."""
    path = out / "config.yaml"
    if not path.exists():
        return
    previous = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    changed = sorted(
        key
        for key in set(previous) | set(current)
        if key not in RESUMABLE_CHANGES and previous.get(key) != current.get(key)
    )
    if changed:
        diffs = "; ".join(f"{k}: {previous.get(k)!r} there, {current.get(k)!r} now" for k in changed)
        raise ConfigError(
            f"cannot resume {out}: its results were made with other settings ({diffs}). "
            "Resume with the same settings, or choose another --out"
        )


def evaluate(
    config: RunConfig,
    components: Components | None = None,
    progress: bool = True,
    judge: LLM | None = None,
) -> dict[str, Any]:
    """Evaluate `config.method`; with `config.resume`, questions already in results.jsonl are skipped.
    With `judge_model`, every row gets an LLM judge's verdict (`judge`, else built from the config when a
    verdict is not cached; see `eval.judge_metric`); with `report_to`, the summary goes to those trackers.
    A team bug that repeats stops the run with `TeamBug`, once `summary.json` holds what was written and
    why it `stopped`; a resumed run asks the questions a bug failed again."""
    team = components.team if components else build_team(config)
    check_installed(trackers_for(config.report_to))  # before any model loads
    questions = select_questions(config)
    if not questions:
        raise ConfigError("no questions selected: check --dataset, --split, --questions and --limit")
    out = config.out or default_out_dir(config)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    if results_path.exists() and results_path.stat().st_size and not config.resume:
        raise ConfigError(
            f"{results_path} already exists: pass --resume to continue it, or choose another --out"
        )
    previous = read_results(results_path)
    settings = effective_config(config, team)
    if previous:
        check_resume_matches(out, settings)
        previous = _drop_team_bugs(previous, results_path)
    done = {row["id"] for row in previous}
    todo = [q for q in questions if q.id not in done]
    (out / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=False))

    seconds_before = _previous_seconds(out / "summary.json") if config.resume else 0.0
    started = time.perf_counter()
    stopped: TeamBug | None = None
    if todo:
        components = components or build_components(config, team)
        try:
            _run_and_append(config, components, todo, results_path, progress)
        except TeamBug as bug:  # summarize what was written, then stop
            stopped = bug
    all_rows = read_results(results_path)
    if config.judge_model and not stopped:
        all_rows = judge_rows(
            all_rows, config.judge_model, lambda: judge or build_judge(config), batch_size=config.batch_size
        )
        write_lines_atomic(results_path, map(result_line, all_rows))
    by_id = {row["id"]: row for row in all_rows}
    rows = [by_id[q.id] for q in questions if q.id in by_id]
    seconds = seconds_before + time.perf_counter() - started
    summary = summarize(rows, config.method, config.model, seconds, team.example_answers())
    summary["benchmark"] = config.benchmark
    if config.judge_model:
        summary["judge_model"] = config.judge_model
    if stopped:
        summary["stopped"] = stopped.headline
    write_lines_atomic(out / "summary.json", [json.dumps(summary, indent=2, ensure_ascii=False) + "\n"])
    if stopped:
        raise stopped
    tracked = TrackingSetup(config.report_to, config.tracker_project, effective_config(config, team))
    report_once(tracked, out, summary)
    return summary


def build_judge(config: RunConfig) -> LLM:
    """The judge of `judge_acc`: `judge_model` on `judge_backend` (auto: as the run's other models, see
    `factory.secondary_llm`), on `judge_base_url` or else the run's server."""
    assert config.judge_model is not None
    return secondary_llm(config, config.judge_model, config.judge_backend, config.judge_base_url)


def _run_and_append(
    config: RunConfig, components: Components, todo: list[Question], results_path: Path, progress: bool
) -> None:
    backends = make_backends(components.llms, components.retriever, max_batch=config.batch_size)
    with results_path.open("a", encoding="utf-8") as fh:

        def persist(episode: Episode) -> None:
            fh.write(result_line(result_row(episode)))
            fh.flush()

        asyncio.run(
            run_episodes(
                components.team.solve,
                config.method,
                todo,
                backends,
                build_sampling(config),
                model_name=config.model,
                concurrency=config.concurrency,
                on_episode=persist,
                progress=progress,
            )
        )


def _drop_team_bugs(rows: list[dict[str, Any]], results_path: Path) -> list[dict[str, Any]]:
    """The rows of a resumed run less those a team bug failed, which are no results: their questions are
    asked again (the bug fixed, they score; still there, the run stops again)."""
    kept = [row for row in rows if row.get("error_kind") != "bug"]
    if len(kept) < len(rows):
        write_lines_atomic(results_path, map(result_line, kept))
    return kept


def _previous_seconds(path: Path) -> float:
    try:
        return float(json.loads(path.read_text())["seconds_total"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0
