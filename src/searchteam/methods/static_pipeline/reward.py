"""MMOA-RAG's shared reward: the answer F1, given to every agent of the static pipeline."""

from __future__ import annotations

from pydantic import Field

from searchteam.rewards.base import Metric, RewardSpec
from searchteam.rewards.outcome import OutcomeOptions, OutcomeReward


class StaticPipelineOptions(OutcomeOptions):
    metric: Metric = Field("f1", description="MMOA-RAG's shared reward is the answer F1")


REWARD = RewardSpec(StaticPipelineOptions, lambda options, _judge: OutcomeReward(options))
