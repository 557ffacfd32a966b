"""The outcome reward several methods train on: one answer metric for the whole team."""

from __future__ import annotations

from pydantic import Field

from searchteam.metrics import answer_scores
from searchteam.rewards.base import (
    METRICS,
    Metric,
    Placement,
    RewardOptions,
    RewardSpec,
    clear,
    gold_answers,
    place,
    record,
    trained_turns,
)
from searchteam.types import Episode


class OutcomeOptions(RewardOptions):
    metric: Metric = Field("em", description="answer metric of the outcome reward")
    placement: Placement = Field(
        "every_turn",
        description="every_turn: the outcome on every trained turn; last_turn: on the last one, 0 on the "
        "others (for GAE with γ > 0 or merge_continuations)",
    )


class OutcomeReward:
    """One outcome reward for the whole team: `metric(answer, golds)` on every trained turn.

    Search-R1 (Jin et al., 2025) trains on the exact match of the final answer (default `em`); MMOA-RAG's
    static rewrite→select→generate pipeline shares the answer F1 among its agents (default `f1` for
    `static_pipeline`, see its package); IRCoT, naive RAG and direct answering default to `em` as well."""

    def __init__(self, options: OutcomeOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        metric = METRICS[self.options.metric]
        for episode in episodes:
            clear(episode)
            score = metric(episode.answer, gold_answers(episode))
            place(trained_turns(episode), score, self.options.placement)
            record(episode, score, answer_scores(episode.answer, gold_answers(episode)))


OUTCOME = RewardSpec(OutcomeOptions, lambda options, _judge: OutcomeReward(options))
