"""What every reward scheme shares: the scheme's contract, its options base class, the answer metrics it
may name and the helpers that place and record rewards.

A scheme is a callable `scheme(episodes) -> None`. It sets `turn.reward` on every turn it wants trained
(turns it leaves at None, such as frozen compressor or generator calls, are not its to reward), and on each
episode `episode.reward` (one scalar outcome for logging) and `episode.reward_terms` (its components, all
floats). A method's scheme lives in its package (`searchteam/methods/<name>/reward.py`) and is registered
with the method; `searchteam.methods.build_reward_scheme(method, options, judge)` builds it with validated
options (unknown keys and bad values are errors naming the method and the allowed options).

Placement of outcome rewards (`placement` option where offered): `every_turn` writes the outcome on every
trained turn (for per-turn GRPO-style advantages); `last_turn` writes it on the last trained turn and 0 on
the others (for GAE with γ = 1, or for `merge_continuations`, which sums the rewards of a continued chain
of turns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from searchteam.llm.base import LLM
from searchteam.metrics import cover_exact_match, exact_match, f1_score
from searchteam.types import Episode, Passage, Turn

RewardScheme = Callable[[list[Episode]], None]
Metric = Literal["em", "cover_em", "f1"]
Placement = Literal["every_turn", "last_turn"]
METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "em": exact_match,
    "cover_em": cover_exact_match,
    "f1": f1_score,
}


class RewardOptions(BaseModel):
    """Base of every scheme's options: unknown keys are errors, values are fixed once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class RewardSpec:
    """A method's reward scheme as it registers it: its options model and `build(options, judge)`;
    `uses_judge` when the scheme asks an LLM judge (a judge given to another scheme is ignored)."""

    options: type[RewardOptions]
    build: Callable[[Any, LLM | None], RewardScheme]
    uses_judge: bool = False


def gold_answers(episode: Episode) -> list[str]:
    return episode.question.golden_answers


def trained_turns(episode: Episode) -> list[Turn]:
    """Turns a scheme may reward: every turn except frozen ones (`turn.frozen`)."""
    return [t for t in episode.turns if not t.frozen]


def place(turns: list[Turn], value: float, placement: Placement) -> None:
    for i, turn in enumerate(turns):
        turn.reward = value if placement == "every_turn" or i == len(turns) - 1 else 0.0


def clear(episode: Episode) -> None:
    for turn in episode.turns:
        turn.reward = None


def record(episode: Episode, reward: float, terms: dict[str, float]) -> None:
    episode.reward = float(reward)
    episode.reward_terms = {k: float(v) for k, v in terms.items()}


def passage_texts(passages: Sequence[Passage]) -> list[str]:
    return [p.contents for p in passages]
