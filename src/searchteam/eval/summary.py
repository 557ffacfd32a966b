"""Per-question result rows and the summary over them.

Answer metrics per row and averaged: `em`, `cover_em` (gold as whole words in the prediction), `acc`
(FlashRAG's plain substring containment, Search-R1's `subem`) and `f1`. Retrieval: each row keeps
`gold_rank`, the best rank at which any search of the episode retrieved a passage containing a gold answer;
the summary turns it into `recall@k` (see `searchteam.metrics.gold_rank`). With an LLM judge
(`judge_model`, see `eval.judge_metric`) rows also carry `judge_acc`, averaged like the answer metrics.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import mean
from typing import Any

from searchteam.data.benchmark import hop_group
from searchteam.metrics import answer_scores, gold_rank, normalize_answer, recall_at_k
from searchteam.teams.base import WITHDRAWN
from searchteam.types import Episode

METRICS = ("em", "cover_em", "acc", "f1")
JUDGE_METRIC = "judge_acc"
RECALL_KS = (1, 3, 5, 10)


TURN_FIELDS = {
    "role",
    "step",
    "messages",
    "completion",
    "completion_token_ids",
    "logprobs",
    "finish_reason",
    "parsed_ok",
    "parse_error",
    "prompt_tokens",
    "completion_tokens",
    "model",
    "frozen",
    "continuation",
    "continuation_chars",
    "env_spans",
    "subgroup",
    "sft_target",
    "meta",
}


def episode_trace(episode: Episode, passages: bool = False) -> dict[str, Any]:
    """What a reader needs to replay a run: every turn (its prompt as messages: the prompt's token ids are
    left out, `searchteam export` rebuilds them), search and state snapshot. A search lists its passages'
    ids, or with `passages` the passages themselves (what `serve` answers)."""
    return {
        "turns": [t.model_dump(include=TURN_FIELDS) for t in episode.turns],
        "searches": [
            {
                "step": r.step,
                "after_turns": r.after_turns,
                "query": r.query,
                **(
                    {"passages": [p.model_dump() for p in r.passages]}
                    if passages
                    else {"ids": [p.id for p in r.passages]}
                ),
            }
            for r in episode.retrievals
        ],
        "states": episode.states,
    }


def result_row(episode: Episode) -> dict[str, Any]:
    """One results.jsonl line: scores, costs and a replayable trace."""
    q = episode.question
    return {
        "id": q.id,
        "dataset": q.dataset,
        "question": q.question,
        "golden_answers": q.golden_answers,
        "prediction": episode.answer,
        **answer_scores(episode.answer, q.golden_answers),
        "gold_rank": gold_rank(
            ([p.contents for p in r.passages] for r in episode.retrievals), q.golden_answers
        ),
        "llm_calls": len(episode.turns),
        "prompt_tokens": episode.prompt_tokens,
        "completion_tokens": episode.completion_tokens,
        "retrievals": len(episode.retrievals),
        "seconds": round(episode.seconds, 3),
        "error": episode.error,
        "error_kind": episode.error_kind,
        WITHDRAWN: episode.meta.get(WITHDRAWN),
        **episode_trace(episode),
    }


def summarize(
    rows: list[dict[str, Any]],
    method: str,
    model: str,
    seconds_total: float,
    example_answers: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Scores overall, per dataset and per hop group, with `recall@k` for the k of `recall_ks(rows)`, and
    how many predictions equal an answer shown in the method's prompts (`Team.example_answers`) and how
    many such copies `Team.solve` withdrew because no passage held them."""
    rows = [_with_answer_scores(row) for row in rows]
    ks = recall_ks(rows)
    per_dataset: dict[str, list[dict]] = defaultdict(list)
    per_group: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        per_dataset[row["dataset"]].append(row)
        per_group[hop_group(row["dataset"])].append(row)
    return {
        "method": method,
        "model": model,
        "n": len(rows),
        **_scores(rows, ks),
        "per_dataset": {name: {"n": len(r), **_scores(r, ks)} for name, r in sorted(per_dataset.items())},
        "per_group": {name: {"n": len(r), **_scores(r, ks)} for name, r in sorted(per_group.items())},
        "llm_calls_mean": _mean(rows, "llm_calls"),
        "prompt_tokens_mean": _mean(rows, "prompt_tokens"),
        "completion_tokens_mean": _mean(rows, "completion_tokens"),
        "retrievals_mean": _mean(rows, "retrievals"),
        "format_error_rate": _format_error_rate(rows),
        "example_answer_copies": sum(normalize_answer(r["prediction"]) in example_answers for r in rows),
        "example_answers_withdrawn": sum(1 for r in rows if r.get(WITHDRAWN)),
        "episode_errors": sum(1 for r in rows if r.get("error")),
        "episode_errors_by_kind": _errors_by_kind(rows),
        **_judge_flags(rows),
        "seconds_total": round(seconds_total, 2),
    }


def _errors_by_kind(rows: list[dict]) -> dict[str, int]:
    """Failed episodes per kind (`runtime.failures`); rows written before kinds were recorded: `unknown`."""
    return dict(Counter(r.get("error_kind") or "unknown" for r in rows if r.get("error")))


def recall_ks(rows: list[dict]) -> list[int]:
    """The k reported as recall@k: those of RECALL_KS below the run's deepest search, and that depth.

    A run whose searches return 3 passages reports recall@1 and recall@3; a run without searches none."""
    depth = max((len(s["ids"]) for r in rows for s in r.get("searches", [])), default=0)
    return sorted({k for k in RECALL_KS if k < depth} | ({depth} if depth else set()))


def _scores(rows: list[dict], ks: list[int]) -> dict[str, float]:
    """Mean answer metrics, and recall@k over all rows (an episode that never searched counts as a miss).

    Rows written before `gold_rank` was recorded are left out of recall."""
    ranked = [r for r in rows if "gold_rank" in r]
    recall = {
        f"recall@{k}": round(mean(recall_at_k(r["gold_rank"], k) for r in ranked), 4) if ranked else 0.0
        for k in ks
    }
    judged = {JUDGE_METRIC: _mean(rows, JUDGE_METRIC)} if _judged(rows) else {}
    return {m: _mean(rows, m) for m in METRICS} | judged | recall


def _judged(rows: list[dict]) -> bool:
    """Whether every row has a judge verdict (a run evaluated with `judge_model`)."""
    return bool(rows) and all(JUDGE_METRIC in r for r in rows)


def _judge_flags(rows: list[dict]) -> dict[str, int]:
    """How many judge replies had no parseable verdict (their rows fell back to cover-EM)."""
    return {"judge_unparsed": sum(bool(r.get("judge_unparsed")) for r in rows)} if _judged(rows) else {}


def _with_answer_scores(row: dict[str, Any]) -> dict[str, Any]:
    """A row with every metric of METRICS (rows of older runs, continued with --resume, may lack some)."""
    if all(m in row for m in METRICS):
        return row
    return row | answer_scores(row["prediction"], row["golden_answers"])


def _mean(rows: list[dict], key: str) -> float:
    return round(mean(r[key] for r in rows), 4) if rows else 0.0


def _format_error_rate(rows: list[dict]) -> dict[str, float]:
    """Per role: share of that role's calls whose output did not parse."""
    calls: dict[str, int] = defaultdict(int)
    errors: dict[str, int] = defaultdict(int)
    for row in rows:
        for turn in row["turns"]:
            calls[turn["role"]] += 1
            errors[turn["role"]] += not turn["parsed_ok"]
    return {role: round(errors[role] / calls[role], 4) for role in sorted(calls)}
