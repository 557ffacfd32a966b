"""LLM-judge accuracy (`judge_acc`) of eval results, as R1-Searcher and DAC report it.

The judge is DECOR's answer judge (`rewards/prompts/decor_judge.yaml`, prompt `answer`: is the prediction
factually consistent with one of the reference answers?), on any backend `build_llm` serves. It runs after
the episodes, once per result row, batched. Replies are cached on disk (`$SEARCHTEAM_CACHE/judge/`), keyed by
judge model, prompt hash, question, prediction and gold answers, so a rerun or a resumed run asks only about
new rows and loads no judge when nothing is new. The cache keeps each raw reply and parses it on read.

Fallback: a reply without a parseable verdict flags its row (`judge_unparsed: true`) and the row's
`judge_acc` is its cover-EM, as DECOR's reward falls back to its rule-based proxy; `summary.json` counts the
flagged rows (`judge_unparsed`).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from searchteam.cache import cache_dir
from searchteam.llm.base import LLM
from searchteam.metrics import cover_exact_match
from searchteam.rewards.judge import judge_request, load_judge_prompts, parse_verdict

JUDGE_PROMPTS, JUDGE_KIND = "decor_judge", "answer"
CACHE_FILE = "verdicts.sqlite"


def prompt_hash(prompts: str = JUDGE_PROMPTS, kind: str = JUDGE_KIND) -> str:
    """A short hash of the judge prompt's text: editing the prompt invalidates cached verdicts."""
    text = json.dumps(load_judge_prompts(prompts)[kind], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def verdict_key(model: str, prompt: str, question: str, prediction: str, golds: list[str]) -> str:
    """The cache key of one verdict."""
    payload = json.dumps([model, prompt, question, prediction, list(golds)], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


class VerdictCache:
    """Raw judge replies by `verdict_key`, in one SQLite file (safe for concurrent runs)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir("judge") / CACHE_FILE
        with closing(self._connect()) as db, db:
            db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=60)

    def get(self, keys: list[str]) -> dict[str, str]:
        """The cached replies among `keys`."""
        found: dict[str, str] = {}
        with closing(self._connect()) as db:
            for start in range(0, len(keys), 500):  # SQLite caps the number of bound parameters
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = db.execute(f"SELECT key, reply FROM replies WHERE key IN ({marks})", chunk)
                found.update(rows.fetchall())
        return found

    def put(self, replies: dict[str, str]) -> None:
        with closing(self._connect()) as db, db:
            db.executemany("INSERT OR REPLACE INTO replies VALUES (?, ?)", replies.items())


def judge_rows(
    rows: list[dict[str, Any]],
    model: str,
    judge: Callable[[], LLM],
    cache: VerdictCache | None = None,
    batch_size: int = 32,
) -> list[dict[str, Any]]:
    """`rows` with `judge_acc` and `judge_unparsed` added. `judge()` builds the judge model, called only
    when some verdict is not cached; `model` names it in the cache key."""
    cache = cache or VerdictCache()
    prompt = prompt_hash()
    keys = [verdict_key(model, prompt, r["question"], r["prediction"], r["golden_answers"]) for r in rows]
    replies = cache.get(list(dict.fromkeys(keys)))
    missing = {k: r for k, r in zip(keys, rows, strict=True) if k not in replies}
    if missing:
        replies |= _ask(judge(), list(missing.items()), batch_size, cache)
    return [_scored(r, replies[k]) for k, r in zip(keys, rows, strict=True)]


def _ask(
    judge: LLM, todo: list[tuple[str, dict[str, Any]]], batch_size: int, cache: VerdictCache
) -> dict[str, str]:
    """Ask the judge about each row, `batch_size` per generate call, caching every batch as it lands."""
    replies: dict[str, str] = {}
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        requests = [
            judge_request(
                JUDGE_PROMPTS,
                JUDGE_KIND,
                {
                    "question": row["question"],
                    "prediction": row["prediction"],
                    "references": "\n".join(row["golden_answers"]),
                },
            )
            for _, row in batch
        ]
        completions = judge.generate(requests)
        if len(completions) != len(requests):
            raise RuntimeError(
                f"judge '{judge.name}' returned {len(completions)} completions for {len(requests)} requests"
            )
        got = {
            key: req.continuation + c.text
            for (key, _), req, c in zip(batch, requests, completions, strict=True)
        }
        cache.put(got)
        replies |= got
    return replies


def _scored(row: dict[str, Any], reply: str) -> dict[str, Any]:
    verdict = parse_verdict(reply)
    fallback = verdict is None
    score = cover_exact_match(row["prediction"], row["golden_answers"]) if fallback else float(verdict)
    return row | {"judge_acc": score, "judge_unparsed": fallback}
