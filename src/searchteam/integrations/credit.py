"""The papers' credit assignment for rows that another RL framework holds: one row per trained turn (verl's
v1 outputs, SkyRL's step-wise rows), each advantage computed by searchteam's own estimators
(`rl.advantages`: turn-level GAE, GRPO over trajectories, per-role GRPO, sub-groups) exactly as `searchteam
train` computes it on the same episodes.

A row says which question it answers (`group`: the framework's prompt uid), which rollout it belongs to
(`episode`), its role, turn, sub-group, its own reward and the critic's value of its prompt. Rows that
trained no turn (`trained=False`: a rollout whose episode ended before its first call) take no part in any
group's statistics and get advantage 0. Framework-free: `integrations.verl` and `integrations.skyrl` build
the rows from their batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from searchteam.rl.advantages import assign_advantages
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Sample


@dataclass(frozen=True)
class CreditRow:
    """One framework row: a trained turn of one rollout."""

    group: str  # the question's rollouts are compared within it (GRPO's group)
    episode: str  # one rollout: its turns share a trajectory (GRPO) and a GAE chain
    role: str
    turn: int  # the turn's index in its episode: GAE runs over the turns in this order
    reward: float  # the turn's own reward, as the method's reward scheme set it (`Turn.reward`)
    subgroup: str = ""  # a separate group within the question (DAC's hard-positive generator inputs)
    value: float = 0.0  # the critic's value of the turn's prompt, for GAE roles
    trained: bool = True  # False: a placeholder row with no turn behind it

    @classmethod
    def of(cls, group: str, episode: str, fields: Mapping[str, Any], value: float = 0.0) -> CreditRow:
        """The row of a framework output whose extra fields are `environment.credit_fields`."""
        return cls(
            group=group,
            episode=episode,
            role=str(fields["role"]),
            turn=int(fields["turn_index"]),
            reward=float(fields["turn_reward"]),
            subgroup=str(fields["subgroup"]),
            value=value,
            trained=bool(fields["trained"]),
        )


@dataclass(frozen=True)
class Credit:
    advantage: float
    returns: float


def row_credit(rows: Sequence[CreditRow], config: TrainConfig) -> list[Credit]:
    """Each row's advantage and return (the critic's target) under `config`'s estimators (`estimator`,
    `role_estimators`, their options and whitening), in the order of `rows`."""
    episodes: dict[str, int] = {}
    samples = [_sample(r, episodes.setdefault(r.episode, len(episodes))) for r in rows if r.trained]
    assign_advantages(samples, config)
    credit = iter(samples)
    out = []
    for row in rows:
        sample = next(credit) if row.trained else None
        out.append(Credit(sample.advantage, sample.returns) if sample else Credit(0.0, 0.0))
    return out


def _sample(row: CreditRow, episode_id: int) -> Sample:
    return Sample(
        prompt_ids=[],
        completion_ids=[],
        loss_mask=[],
        role=row.role,
        episode_id=episode_id,
        group_id=row.group,
        turn_index=row.turn,
        reward=row.reward,
        subgroup=row.subgroup,
        old_value=row.value,
    )


def prompt_values(values: torch.Tensor | None, response_mask: torch.Tensor) -> list[float]:
    """The critic's value of each row's prompt: its per-token `values` read at the row's first response
    token (wherever the framework aligns responses); zeros without a critic."""
    if values is None:
        return [0.0] * response_mask.shape[0]
    first = response_mask.argmax(dim=1)
    return [float(values[i, first[i]]) for i in range(response_mask.shape[0])]


def token_credit(
    rows: Sequence[CreditRow], config: TrainConfig, response_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`row_credit` as the frameworks' token-level advantages and returns: each row's on its response
    tokens, shaped like the padded `response_mask`."""
    credit = row_credit(rows, config)
    mask = response_mask.to(torch.float32)
    advantages = torch.tensor([c.advantage for c in credit], dtype=torch.float32).unsqueeze(-1) * mask
    returns = torch.tensor([c.returns for c in credit], dtype=torch.float32).unsqueeze(-1) * mask
    return advantages, returns
