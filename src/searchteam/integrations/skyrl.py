"""searchteam's SkyRL generator: any searchteam team, generating token-in, token-out through SkyRL's inference
engine client, in SkyRL's step-wise form (one row per trained turn, `is_last_step` on the last).

SkyRL trains step-wise with `generator.step_wise_trajectories=true`. `skyrl_trainer.SearchTeamExp` builds
this generator (with the name the inference engine knows the policy by, as SkyRL's own generator is built)
and `skyrl_trainer.SearchTeamTrainer`, which gives each row the papers' credit.

Rows come from `searchteam export-questions --format skyrl` (their `extra_info` reaches the generator as the
environment's extras). Each row carries the episode's reward; its `env_metrics` carry the episode's EM and
F1 and what the credit needs (`environment.credit_fields`). Evaluation batches (`training_phase: eval`)
play evaluation episodes, as `searchteam eval` does. A failed request of the inference engine raises out of
`generate` (`FrameworkFault`): no episode of it is trained.

Written against skyrl 0.3.0, the last release for Python 3.11: on 3.11 its generator module imports only
with `typing.TypedDict` pointed at `typing_extensions.TypedDict` (pydantic needs the latter below 3.12), which
this module does for the length of that import.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import typing
from collections.abc import Iterator
from typing import Any

import typing_extensions

from searchteam.errors import ConfigError
from searchteam.extras import require
from searchteam.integrations.environment import (
    TeamEnvironment,
    TokenServerLLM,
    credit_fields,
    episode_scores,
    load_environment,
    recorded_logprobs,
    row_reward,
    server_request,
)
from searchteam.llm.base import SamplingParams
from searchteam.rl.experience import Sample
from searchteam.types import Episode


@contextlib.contextmanager
def _typeddict_for_pydantic() -> Iterator[None]:
    if sys.version_info >= (3, 12):
        yield
        return
    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
    try:
        yield
    finally:
        typing.TypedDict = original  # type: ignore[misc]


with _typeddict_for_pydantic():
    generators = require("skyrl.train.generators.base", "skyrl", "the SkyRL generator")


class SearchTeamGenerator(generators.GeneratorInterface):
    """A SkyRL generator that plays one searchteam episode per prompt (see the module's docstring)."""

    def __init__(
        self,
        run_config: str,
        inference_engine_client: Any,
        tokenizer: Any,
        policy_model_name: str,
        settings: dict[str, Any] | None = None,
    ) -> None:
        if not policy_model_name:  # with LoRA, SkyRL's client refuses a request without it
            raise ConfigError(
                "SearchTeamGenerator needs the name the inference engine knows the policy by: pass "
                "resolve_policy_model_name(cfg), as skyrl_trainer.SearchTeamExp does"
            )
        self.env: TeamEnvironment = load_environment(run_config, settings)
        self.client = inference_engine_client
        self.tokenizer = tokenizer
        self.policy_model_name = policy_model_name

    async def generate(self, input_batch: dict[str, Any]) -> dict[str, Any]:
        extras = input_batch.get("env_extras") or [{}] * len(input_batch["prompts"])
        ids = input_batch.get("trajectory_ids") or [None] * len(input_batch["prompts"])
        params = dict(input_batch.get("sampling_params") or {})
        metadata = input_batch.get("batch_metadata")
        training = getattr(metadata, "training_phase", "train") != "eval"
        played = await asyncio.gather(
            *(self._play(e, t, params, training) for e, t in zip(extras, ids, strict=True))
        )
        rows = [
            (episode, sample, t)
            for (episode, samples), t in zip(played, ids, strict=True)
            for sample in samples
        ]
        last = [i == len(samples) - 1 for _, samples in played for i in range(len(samples))]
        requested = params.get("logprobs") is not None
        recorded = [recorded_logprobs(s, requested) for _, s, _ in rows]
        return {
            "prompt_token_ids": [s.prompt_ids for _, s, _ in rows],
            "response_ids": [s.completion_ids for _, s, _ in rows],
            "rewards": [row_reward(e, s) for e, s, _ in rows],
            "loss_masks": [mask for mask, _ in recorded],
            "stop_reasons": [_stop_reason(e, s) for e, s, _ in rows],
            "rollout_metrics": _rollout_metrics([e for e, _ in played]),
            "rollout_logprobs": [logprobs for _, logprobs in recorded] if requested else None,
            "trajectory_ids": [t for _, _, t in rows],
            "trajectory_generation_times": None,
            "rollout_expert_indices": None,
            "is_last_step": last,
            "env_metrics": [{**episode_scores(e), **credit_fields(e, s)} for e, s, _ in rows],
            "pixel_values": None,
            "image_grid_thw": None,
        }

    async def _play(
        self, extras: dict[str, Any], trajectory: Any, params: dict[str, Any], training: bool
    ) -> tuple[Episode, list[Sample]]:
        info = dict(extras.get("extra_info") or extras)
        question = self.env.question(info, fallback_id=str(getattr(trajectory, "instance_id", "")))
        session = trajectory.to_string() if trajectory is not None else question.id

        async def generate(
            prompt_ids: list[int], sampling: SamplingParams
        ) -> tuple[list[int], list[float] | None]:
            request = server_request(params, sampling)
            engine_input = {
                "prompt_token_ids": [prompt_ids],
                "session_ids": [session],
                "sampling_params": request,
            }
            out = await self.client.generate(engine_input, model=self.policy_model_name)
            logprobs = out.get("response_logprobs")
            return list(out["response_ids"][0]), (list(logprobs[0]) if logprobs else None)

        llm = TokenServerLLM(generate, self.tokenizer, name="skyrl")
        episode = await self.env.play(question, llm, group=question.id, training=training)
        return episode, self.env.rows(episode, self.tokenizer)


def _stop_reason(episode: Episode, sample: Sample) -> str:
    turn = episode.turns[sample.turn_index] if 0 <= sample.turn_index < len(episode.turns) else None
    return turn.finish_reason if turn is not None else "stop"


def _rollout_metrics(episodes: list[Episode]) -> dict[str, float]:
    scores = [episode_scores(e) for e in episodes]
    return {f"searchteam/{k}": sum(s[k] for s in scores) / len(scores) for k in scores[0]} if scores else {}
