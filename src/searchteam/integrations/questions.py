"""`searchteam export-questions`: question sets as the prompt datasets verl and SkyRL train from.

- verl's RL Parquet (the shape of its Search-R1 example): `data_source`, `prompt` (the question as one user
  message), `ability`, `reward_model` (`style: rule`, `ground_truth: {target: answers}`), `extra_info` and
  `agent_name` (`searchteam`: the agent loop that runs the team).
- SkyRL's dataset: `data_source`, `prompt`, `env_class`, `reward_spec` (`method: rule`, `ground_truth`),
  `extra_info`.

The team builds its own prompts, so `prompt` only carries the question (verl filters over-long prompts by
it); `extra_info` names the method and carries the question id, dataset and gold answers the team's reward
scheme reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from searchteam.errors import ConfigError
from searchteam.types import Question

AGENT_NAME = "searchteam"  # the name of searchteam's verl agent loop and SkyRL environment
FORMATS = ("verl", "skyrl")


def _extra_info(q: Question, method: str, split: str, index: int) -> dict[str, Any]:
    return {
        "split": split,
        "index": index,
        "method": method,
        "question_id": q.id,
        "dataset": q.dataset,
        "question": q.question,
        "golden_answers": list(q.golden_answers),
    }


def verl_row(q: Question, method: str, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": q.dataset,
        "prompt": [{"role": "user", "content": q.question}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": list(q.golden_answers)}},
        "extra_info": _extra_info(q, method, split, index),
        "agent_name": AGENT_NAME,
    }


def skyrl_row(q: Question, method: str, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": q.dataset,
        "prompt": [{"role": "user", "content": q.question}],
        "env_class": AGENT_NAME,
        "reward_spec": {"method": "rule", "ground_truth": {"target": list(q.golden_answers)}},
        "extra_info": _extra_info(q, method, split, index),
    }


def write_questions(questions: list[Question], method: str, fmt: str, split: str, out: Path) -> Path:
    """`out/SPLIT.parquet` in the trainer's format (`verl` or `skyrl`)."""
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}: choose {' or '.join(FORMATS)}")
    make = verl_row if fmt == "verl" else skyrl_row
    rows = [make(q, method, split, i) for i, q in enumerate(questions)]
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{split}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
