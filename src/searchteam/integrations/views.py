"""Views of exported turn rows for the trainers people use, each a list of rows with its Parquet schema.

- `sft`: TRL's conversational prompt–completion format, the well-formed trained turns of episodes whose
  answer scored F1 ≥ `min_f1` (searchteam's expert iteration keeps the same turns).
- `dpo`: TRL's preference format. A pair needs two completions of the same prompt, so pairs are formed only
  among trained turns whose prompts are identical within a group (the same question: rollouts of one
  training step, or the same question in several exported runs), such as each role's first turn: the
  best-scoring against the worst-scoring, when their scores differ. A turn scores its own reward where the
  run's reward scheme gave one, else its episode's F1.
- `kto`: TRL's unpaired format: each trained turn, labelled desirable when its episode scored F1 ≥ `min_f1`.
- `stepwise`: token ids per trained turn (prompt, completion, loss mask, the engine's logprobs), with the
  turn's and the episode's reward: one sample per LLM call, as step-wise trainers take them.

A turn whose call continued a prefill (naive RAG's `<answer>`) is one assistant reply, the prefill
included. A turn that continued after retrieved text (Search-R1's turns after a search) cannot be written as
a chat prompt and one reply without training the retrieved text, so the chat views leave it out;
`stepwise` keeps it, the retrieved text in its prompt.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pyarrow as pa

from searchteam.integrations.turns import MESSAGES

_ORIGIN = [("run", pa.string()), ("question_id", pa.string()), ("role", pa.string())]

SFT_SCHEMA = pa.schema([("prompt", MESSAGES), ("completion", MESSAGES), *_ORIGIN, ("f1", pa.float64())])
DPO_SCHEMA = pa.schema(
    [
        ("prompt", MESSAGES),
        ("chosen", MESSAGES),
        ("rejected", MESSAGES),
        *_ORIGIN,
        ("score_chosen", pa.float64()),
        ("score_rejected", pa.float64()),
    ]
)
KTO_SCHEMA = pa.schema([("prompt", MESSAGES), ("completion", MESSAGES), ("label", pa.bool_()), *_ORIGIN])
STEPWISE_SCHEMA = pa.schema(
    [
        *_ORIGIN,
        ("group", pa.string()),
        ("episode", pa.int64()),
        ("turn", pa.int64()),
        ("is_last_turn", pa.bool_()),
        ("prompt_ids", pa.list_(pa.int64())),
        ("completion_ids", pa.list_(pa.int64())),
        ("loss_mask", pa.list_(pa.int64())),
        ("logprobs", pa.list_(pa.float64())),
        ("turn_reward", pa.float64()),
        ("episode_reward", pa.float64()),
        ("f1", pa.float64()),
    ]
)
SCHEMAS = {"sft": SFT_SCHEMA, "dpo": DPO_SCHEMA, "kto": KTO_SCHEMA, "stepwise": STEPWISE_SCHEMA}


def _origin(row: dict[str, Any]) -> dict[str, Any]:
    return {"run": row["run"], "question_id": row["question_id"], "role": row["role"]}


def _chat_turn(row: dict[str, Any]) -> bool:
    """A trained turn that reads as a chat prompt and one assistant reply (no retrieved text inside)."""
    return row["trained"] and bool(row["prompt"]) and bool(row["completion"]) and not row["env_spans"]


def _reply(row: dict[str, Any]) -> list[dict[str, str]]:
    """The assistant reply of a chat turn: the prefill it continued, then its completion."""
    return [{"role": "assistant", "content": (row["continuation"] or "") + row["completion"]}]


def sft_rows(rows: list[dict[str, Any]], min_f1: float) -> list[dict[str, Any]]:
    return [
        {"prompt": r["prompt"], "completion": _reply(r), **_origin(r), "f1": r["f1"]}
        for r in rows
        if _chat_turn(r) and r["parsed_ok"] and r["f1"] >= min_f1
    ]


def kto_rows(rows: list[dict[str, Any]], min_f1: float) -> list[dict[str, Any]]:
    return [
        {
            "prompt": r["prompt"],
            "completion": _reply(r),
            "label": r["f1"] >= min_f1,
            **_origin(r),
        }
        for r in rows
        if _chat_turn(r)
    ]


def turn_score(row: dict[str, Any]) -> float:
    """A turn's own reward where the reward scheme gave one, else its episode's F1."""
    return row["f1"] if row["turn_reward"] is None else float(row["turn_reward"])


def dpo_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pair per prompt shared within a group: its best-scoring completion against its worst."""
    same_prompt: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if _chat_turn(r):
            same_prompt[(r["group"], r["role"], json.dumps([r["prompt"], r["continuation"]]))].append(r)
    pairs = []
    for candidates in same_prompt.values():
        ranked = sorted(candidates, key=turn_score)
        worst, best = ranked[0], ranked[-1]
        if turn_score(best) > turn_score(worst) and _reply(best) != _reply(worst):
            pairs.append(
                {
                    "prompt": best["prompt"],
                    "chosen": _reply(best),
                    "rejected": _reply(worst),
                    **_origin(best),
                    "score_chosen": turn_score(best),
                    "score_rejected": turn_score(worst),
                }
            )
    return pairs


def stepwise_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    trained = [r for r in rows if r["trained"] and r["completion_ids"]]
    last = {(r["run"], r["episode"]): r["turn"] for r in trained}
    return [
        {
            **_origin(r),
            "group": r["group"],
            "episode": r["episode"],
            "turn": r["turn"],
            "is_last_turn": last[(r["run"], r["episode"])] == r["turn"],
            **{k: r[k] for k in ("prompt_ids", "completion_ids", "loss_mask", "logprobs")},
            **{k: r[k] for k in ("turn_reward", "episode_reward", "f1")},
        }
        for r in trained
    ]


def build_views(
    rows: list[dict[str, Any]], names: list[str], min_f1: float
) -> dict[str, list[dict[str, Any]]]:
    makers = {
        "sft": lambda: sft_rows(rows, min_f1),
        "dpo": lambda: dpo_rows(rows),
        "kto": lambda: kto_rows(rows, min_f1),
        "stepwise": lambda: stepwise_rows(rows),
    }
    return {name: makers[name]() for name in names}
