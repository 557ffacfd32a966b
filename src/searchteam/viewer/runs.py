"""A run directory as the viewer reads it: one pass over its rows at startup, an index of per-question
summaries with byte offsets, and full rows re-read from disk only when a question is opened.

Two kinds of run: `searchteam eval` (`results.jsonl`, one row per question, with the full trace) and
`searchteam train` (`rollouts.jsonl`, one record per sampled episode: turns with rewards, no prompts,
searches or states). Both become the same episode shape (see `episode`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from searchteam.errors import ViewerError
from searchteam.metrics import answer_scores

EVAL_FILE = "results.jsonl"
TRAIN_FILE = "rollouts.jsonl"
METRICS = ("em", "cover_em", "acc", "f1")
JUDGE = "judge_acc"  # the LLM judge's verdict, in runs evaluated with `judge_model`
CORRECTNESS_METRICS = ("em", "cover_em", "acc", JUDGE)


@dataclass(frozen=True)
class RowSummary:
    """What the question list shows for one episode, and where its full row starts in the file."""

    key: str
    qid: str
    dataset: str
    question: str
    golden_answers: list[str]
    prediction: str
    scores: dict[str, float]
    roles: tuple[str, ...]
    error_roles: tuple[str, ...]
    turns: int
    error: str | None
    step: int | None
    offset: int

    def public(self) -> dict[str, Any]:
        """The summary as JSON for the page (no file offset)."""
        return {
            "key": self.key,
            "id": self.qid,
            "dataset": self.dataset,
            "question": self.question,
            "golden_answers": self.golden_answers,
            "prediction": self.prediction,
            "scores": self.scores,
            "roles": list(self.roles),
            "error_roles": list(self.error_roles),
            "turns": self.turns,
            "error": self.error,
            "step": self.step,
        }


@dataclass
class Filters:
    """The question-list filters; empty fields filter nothing."""

    dataset: str = ""
    outcome: str = ""  # "correct" | "incorrect" | ""
    metric: str = "cover_em"
    format_errors: bool = False
    role: str = ""
    text: str = ""

    def keep(self, row: RowSummary) -> bool:
        """Whether `row` passes; with a role, `format_errors` means a format error of that role."""
        if self.dataset and row.dataset != self.dataset:
            return False
        if self.role and self.role not in row.roles:
            return False
        if self.format_errors and not (self.role in row.error_roles if self.role else row.error_roles):
            return False
        if self.outcome and (row.scores.get(self.metric, 0.0) >= 1.0) != (self.outcome == "correct"):
            return False
        needle = self.text.lower()
        return not needle or needle in row.question.lower() or needle in row.qid.lower()


@dataclass
class Run:
    """One indexed run: its rows' summaries by key (file order kept), its config and where rows live."""

    path: Path
    kind: str  # "eval" | "train"
    config: dict[str, Any]
    summary: dict[str, Any]
    rows: dict[str, RowSummary] = field(default_factory=dict)
    by_qid: dict[str, str] = field(default_factory=dict)
    passage_ids: set[str] = field(default_factory=set)
    skipped_lines: int = 0

    @property
    def name(self) -> str:
        return self.path.parent.name if self.path.parent.name else str(self.path)

    def info(self) -> dict[str, Any]:
        """What the page's header shows about the run."""
        rows = list(self.rows.values())
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "method": self.config.get("method", ""),
            "model": self.config.get("model", ""),
            "n": len(rows),
            "scores": {m: _mean([r.scores.get(m, 0.0) for r in rows]) for m in self._metrics()},
            "datasets": sorted({r.dataset for r in rows}),
            "roles": sorted({role for r in rows for role in r.roles}),
            "metrics": self._metrics(),
            "skipped_lines": self.skipped_lines,
        }

    def _metrics(self) -> list[str]:
        judged = [JUDGE] if any(JUDGE in r.scores for r in self.rows.values()) else []
        return [*METRICS, *judged, *(["reward"] if self.kind == "train" else [])]

    def find(self, key: str) -> RowSummary | None:
        """The row with this key, or (pairing an eval run with a training run) the first with this id."""
        row = self.rows.get(key)
        if row is None and key in self.by_qid:
            row = self.rows[self.by_qid[key]]
        return row

    def filtered(self, filters: Filters) -> list[RowSummary]:
        return [row for row in self.rows.values() if filters.keep(row)]

    def read_row(self, row: RowSummary) -> dict[str, Any]:
        """The full JSON line of `row`, read from its offset."""
        with self.path.open("rb") as fh:
            fh.seek(row.offset)
            return json.loads(fh.readline())

    def episode(self, row: RowSummary) -> dict[str, Any]:
        """One episode in the shape the page renders: question, scores, turns, searches, states, facts."""
        raw = self.read_row(row)
        if self.kind == "train":
            return _train_episode(raw, row)
        return _eval_episode(raw, row)


def open_run(path: Path) -> Run:
    """Index the eval or training run at `path` (a run directory or its results/rollouts JSONL)."""
    rows_path = _rows_file(path)
    kind = "train" if rows_path.name == TRAIN_FILE else "eval"
    run = Run(rows_path, kind, _read_yaml(rows_path.parent / "config.yaml"), _read_summary(rows_path.parent))
    occurrences: Counter[str] = Counter()
    offset = 0
    with rows_path.open("rb") as fh:
        for line in fh:
            start, offset = offset, offset + len(line)
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
                summary = _summarize(raw, kind, start, occurrences)
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                run.skipped_lines += 1
                continue
            run.rows[summary.key] = summary
            run.by_qid.setdefault(summary.qid, summary.key)
            run.passage_ids.update(i for s in raw.get("searches", []) for i in s.get("ids", []))
    if not run.rows:
        raise ViewerError(f"{rows_path}: no readable rows ({run.skipped_lines} malformed lines)")
    return run


def _rows_file(path: Path) -> Path:
    if path.is_file():
        if path.name not in (EVAL_FILE, TRAIN_FILE):
            raise ViewerError(f"{path}: expected a run directory, {EVAL_FILE} or {TRAIN_FILE}")
        return path
    for name in (EVAL_FILE, TRAIN_FILE):
        if (path / name).is_file():
            return path / name
    raise ViewerError(
        f"{path}: not a run directory (no {EVAL_FILE} from `searchteam eval` or {TRAIN_FILE} from "
        "`searchteam train`)"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _summarize(raw: dict[str, Any], kind: str, offset: int, occurrences: Counter[str]) -> RowSummary:
    """The list entry of one JSONL record; a training record's key adds its step and replica."""
    if kind == "train":
        q, prediction, step = raw["question"], raw.get("answer", ""), int(raw["step"])
        qid = str(q["id"])
        occurrences[f"{qid}@{step}"] += 1
        key = f"{qid}@step{step}.{occurrences[f'{qid}@{step}']}"
    else:
        q, prediction, step = raw, raw.get("prediction", ""), None
        qid = key = str(raw["id"])
    turns = raw.get("turns", [])
    return RowSummary(
        key=key,
        qid=qid,
        dataset=str(q.get("dataset", "custom")),
        question=str(q["question"]),
        golden_answers=list(q.get("golden_answers", [])),
        prediction=str(prediction or ""),
        scores=_scores(raw, q.get("golden_answers", []), str(prediction or "")),
        roles=tuple(dict.fromkeys(t["role"] for t in turns)),
        error_roles=tuple(dict.fromkeys(t["role"] for t in turns if not t.get("parsed_ok", True))),
        turns=len(turns),
        error=raw.get("error"),
        step=step,
        offset=offset,
    )


def _scores(raw: dict[str, Any], golds: list[str], prediction: str) -> dict[str, float]:
    """The row's metrics (computed where an older row lacks some), the judge's verdict where the run had
    one, and a rollout's episode reward."""
    scores = {m: float(raw[m]) for m in METRICS if m in raw}
    if len(scores) < len(METRICS):
        scores = answer_scores(prediction, golds)
    if isinstance(raw.get(JUDGE), int | float):
        scores[JUDGE] = float(raw[JUDGE])
    reward = raw.get("reward", (raw.get("meta") or {}).get("reward"))  # in meta: a file of an older run
    if isinstance(reward, int | float):
        scores["reward"] = float(reward)
    return scores


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def _eval_episode(raw: dict[str, Any], row: RowSummary) -> dict[str, Any]:
    facts = {
        k: raw[k]
        for k in ("gold_rank", "llm_calls", "prompt_tokens", "completion_tokens", "retrievals", "seconds")
        if k in raw
    }
    return _episode(row, raw.get("turns", []), raw.get("searches", []), raw.get("states", []), facts)


def _train_episode(raw: dict[str, Any], row: RowSummary) -> dict[str, Any]:
    meta = {**(raw.get("meta") or {}), **{k: raw[k] for k in ("group_id", "reward_terms") if raw.get(k)}}
    facts = {"step": row.step, **{k: v for k, v in meta.items() if k != "reward"}}
    return _episode(row, raw.get("turns", []), [], [], facts)


def _episode(
    row: RowSummary, turns: list[dict], searches: list[dict], states: list[dict], facts: dict[str, Any]
) -> dict[str, Any]:
    return {**row.public(), "facts": facts, "timeline": timeline(turns, searches, states)}


def timeline(turns: list[dict], searches: list[dict], states: list[dict]) -> list[dict[str, Any]]:
    """Turns, searches and state snapshots in reading order, like a paper's case-study table.

    Within a step: a search follows the last of the step's turns that had finished when it returned (its
    `after_turns`), so one that no turn of the step preceded comes first (retrieve-then-read); a run saved
    without `after_turns` places a search after the turn that wrote its query, else first. The step's state
    snapshots close it."""
    steps = sorted({_step(x) for x in [*turns, *searches, *states]})
    items: list[dict[str, Any]] = []
    for step in steps:
        step_turns = [(position, t) for position, t in enumerate(turns) if _step(t) == step]
        follows = {id(s): _follows(s, step_turns) for s in searches if _step(s) == step}
        items += [_search_item(s) for s in searches if _step(s) == step and follows[id(s)] is None]
        for i, (_, turn) in enumerate(step_turns):
            items.append({"kind": "turn", **turn})
            items += [_search_item(s) for s in searches if _step(s) == step and follows[id(s)] == i]
        items += [
            {"kind": "state", "step": step, "state": {k: v for k, v in s.items() if k != "step"}}
            for s in states
            if _step(s) == step
        ]
    return items


def _follows(search: dict[str, Any], step_turns: list[tuple[int, dict]]) -> int | None:
    """Index among its step's turns (`(position in the episode, turn)`) of the turn a search came after."""
    done = search.get("after_turns")
    if not isinstance(done, int):
        return _writer(search, [turn for _, turn in step_turns])
    before = [i for i, (position, _) in enumerate(step_turns) if position < done]
    return before[-1] if before else None


def _step(item: dict[str, Any]) -> int:
    step = item.get("step", 0)
    return step if isinstance(step, int) else 0


def _writer(search: dict[str, Any], turns: list[dict]) -> int | None:
    """Index of the first turn whose output contains the search's query (whitespace folded)."""
    query = " ".join(str(search.get("query", "")).split())
    if not query:
        return None
    for i, turn in enumerate(turns):
        if query in " ".join(str(turn.get("completion", "")).split()):
            return i
    return None


def _search_item(search: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "search",
        "step": _step(search),
        "query": search.get("query", ""),
        "ids": search.get("ids", []),
    }
