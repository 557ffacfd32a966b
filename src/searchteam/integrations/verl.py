"""searchteam's verl agent loop: any searchteam team, generating token-in, token-out through verl's server
manager, rewarded by its method's reward scheme.

Register it with an agent loop config (`actor_rollout_ref.rollout.agent.agent_loop_config_path`) that names
the searchteam run config the team comes from; rows of `searchteam export-questions --format verl` select it
by `agent_name: searchteam`:

    - name: searchteam
      _target_: searchteam.integrations.verl.SearchTeamAgentLoop
      run_config: examples/teams/mask-qwen2.5-7b.yaml   # a YAML path or a shipped recipe's name
      settings: {top_k: 3}                             # optional `--set` style overrides

What it returns depends on the trainer:
- verl's v1 trainer (`trainer.use_v1=True`) takes a list of outputs per rollout: one `AgentLoopOutput` per
  trained turn (searchteam's step-wise samples), each with its own prompt and completion ids.
- the legacy trainer takes one output per rollout, which fits only a single-chain agent such as Search-R1
  with `train.merge_continuations` (retrieved text masked out of the loss); other teams are refused.

Every output carries the episode's reward (`reward_score`) and, in `extra_fields`, what the papers' credit
needs (`environment.credit_fields`: role, turn, the turn's own reward, sub-group) and the weight versions
verl's server reported for the episode's requests. verl's own `grpo` gives every output the advantage of
its episode's final reward; `searchteam.integrations.verl_trainer` (`trainer.v1.trainer_mode=searchteam`)
gives each the advantage searchteam's own estimators compute. A failed request of verl's server raises out
of the loop, as verl's own loops raise: verl drops that prompt's group. Validation rollouts (recognized by
verl's `val_kwargs` sampling) play evaluation episodes, as `searchteam eval` does.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import uuid4

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
from searchteam.integrations.questions import AGENT_NAME
from searchteam.llm.base import SamplingParams
from searchteam.rl.experience import Sample
from searchteam.types import Episode

agent_loop = require("verl.experimental.agent_loop.agent_loop", "verl", "the verl agent loop")
logger = logging.getLogger(__name__)
SEARCHTEAM_TRAINER = "searchteam"  # trainer.v1.trainer_mode of `integrations.verl_trainer`
WEIGHT_VERSIONS = ("min_global_steps", "max_global_steps")  # what verl's v1 trainer reads of every output


@agent_loop.register(AGENT_NAME)
class SearchTeamAgentLoop(agent_loop.AgentLoopBase):
    """A verl agent loop that plays one searchteam episode per rollout (see the module's docstring)."""

    def __init__(self, *args: Any, run_config: str = "", settings: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not run_config:
            raise ConfigError(
                "the searchteam agent loop needs run_config: name a searchteam config in its agent loop "
                "config (actor_rollout_ref.rollout.agent.agent_loop_config_path); see docs/integrations.md"
            )
        from omegaconf import OmegaConf  # verl's own dependency: here, after verl was found

        overrides = OmegaConf.to_container(OmegaConf.create(settings or {}))  # hydra hands a DictConfig
        self.env: TeamEnvironment = load_environment(run_config, overrides)
        self.multi_output = bool(self.config.trainer.get("use_v1", False))
        if not self.multi_output and len(self.env.team.roles) > 1:  # calls of two roles cannot merge
            raise ConfigError(single_output_refusal(self.env.method, len(self.env.team.roles)))
        if self.multi_output:
            refuse_turn_rows_without_credit(self.config, self.env)
        self.validation_sampling = validation_sampling(self.rollout_config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        extra_info = dict(kwargs.get("extra_info") or {})
        question = self.env.question(extra_info, fallback_id=str(kwargs.get("index", "")))
        replies: list[dict[str, Any]] = []  # each request's extra_fields, as verl's server reported them
        llm = TokenServerLLM(self._generate_through(sampling_params, replies), self.tokenizer, name="verl")
        training = self.validation_sampling is None or _sampling(sampling_params) != self.validation_sampling
        group = str(kwargs.get("uid", question.id))
        episode = await self.env.play(question, llm, group=group, training=training)
        versions = weight_versions(replies, kwargs.get("global_steps"))
        logprobs = bool(sampling_params.get("logprobs"))
        outputs = [
            self._output(s, episode, versions, logprobs) for s in self.env.rows(episode, self.tokenizer)
        ]
        if self.multi_output:
            return outputs
        if len(outputs) > 1:
            raise ConfigError(single_output_refusal(self.env.method, len(outputs)))
        single = outputs[0]
        single.prompt_ids = self._cap_text_prompt_length(single.prompt_ids)
        return truncated(single, self.rollout_config.response_length)

    def _generate_through(self, params: dict[str, Any], replies: list[dict[str, Any]]):
        """Each request with verl's sampling (its temperature, top-p, logprobs) and the role's token limit
        (at most verl's response_length) and stop strings; one sticky session per episode, so its turns
        share a server's prefix cache. Each reply's `extra_fields` go to `replies`."""
        session = uuid4().hex
        limit = self.rollout_config.response_length

        async def generate(
            prompt_ids: list[int], sampling: SamplingParams
        ) -> tuple[list[int], list[float] | None]:
            request = server_request(params, sampling, limit)
            out = await self.server_manager.generate(
                request_id=session, prompt_ids=prompt_ids, sampling_params=request
            )
            replies.append(dict(getattr(out, "extra_fields", None) or {}))
            return list(out.token_ids), (list(out.log_probs) if out.log_probs else None)

        return generate

    def _output(self, sample: Sample, episode: Episode, versions: dict[str, Any], logprobs: bool) -> Any:
        """One trained turn (or the placeholder of an episode that trained none: fully masked, reward 0)."""
        mask, recorded = recorded_logprobs(sample, logprobs)
        return agent_loop.AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.completion_ids,
            response_mask=mask,
            response_logprobs=recorded,
            reward_score=row_reward(episode, sample),
            num_turns=1 + len(episode.turns) + len(episode.retrievals),
            metrics=_metrics(episode),
            extra_fields={
                **versions,
                "reward_extra_info": episode_scores(episode),
                **credit_fields(episode, sample),
            },
        )


def weight_versions(replies: list[dict[str, Any]], global_steps: Any) -> dict[str, Any]:
    """The server's extra fields of an episode's requests as verl's own tool loop merges them: the first
    request's, with the newest weight version any request ran on as `max_global_steps` and the oldest as
    `min_global_steps`. An episode that made no request takes the rollout's step (verl's v1 trainer makes
    an integer array of both for every output)."""
    step = int(global_steps) if global_steps is not None else 0
    merged = dict(replies[0]) if replies else {}
    for key, pick in zip(WEIGHT_VERSIONS, (min, max), strict=True):
        seen = [r[key] for r in replies if r.get(key) is not None]
        merged[key] = int(pick(seen)) if seen else step
    return merged


def _sampling(params: Any) -> tuple[float, float, int]:
    """(temperature, top-p, top-k), with vLLM's defaults for those not given."""
    get = params.get
    return (float(get("temperature", 1.0)), float(get("top_p", 1.0)), int(get("top_k", -1)))


def validation_sampling(rollout_config: Any) -> tuple[float, float, int] | None:
    """The sampling of verl's validation rollouts (`rollout.val_kwargs`), by which the loop tells them from
    training ones (verl hands a loop no other sign); None when it equals training's, and validation then
    plays training episodes (said once in the log)."""
    validation = _sampling(rollout_config.get("val_kwargs") or {})
    if validation != _sampling(rollout_config):
        return validation
    logger.warning(
        "rollout.val_kwargs samples as training does, so searchteam cannot tell validation rollouts from "
        "training ones: validation plays training episodes, and its scores are not `searchteam eval`'s"
    )
    return None


def refuse_turn_rows_without_credit(config: Any, env: TeamEnvironment) -> None:
    """verl's own estimators, given one row per turn: `grpo` scores each episode by its last row (outcome
    credit); every other groups the rows by prompt, so an episode of k turns would count k times. The papers'
    credit, or any estimator but GRPO, needs searchteam's trainer."""
    if config.trainer.get("v1", {}).get("trainer_mode") == SEARCHTEAM_TRAINER:
        return
    estimator = config.algorithm.get("adv_estimator")
    train = env.config.train
    if estimator != "grpo":
        raise ConfigError(
            f"algorithm.adv_estimator={estimator} groups verl's rows by prompt, and searchteam returns one "
            "row per trained turn, so an episode would weigh as much as its turns: set "
            f"trainer.v1.trainer_mode={SEARCHTEAM_TRAINER} (searchteam's estimators), or "
            "algorithm.adv_estimator=grpo"
        )
    if train.estimator != "grpo" or train.role_estimators:
        raise ConfigError(
            f"{env.method}'s config asks for {train.estimator} credit"
            f"{' with per-role estimators' if train.role_estimators else ''}, which verl's grpo cannot give: "
            f"set trainer.v1.trainer_mode={SEARCHTEAM_TRAINER} (searchteam's estimators)"
        )


def single_output_refusal(method: str, calls: int) -> str:
    return (
        f"{method} made {calls} separately trained LLM calls in one episode, but verl's legacy trainer takes "
        "one output per rollout: set trainer.use_v1=True (one output per turn), or, for a single-chain agent "
        "such as Search-R1, train.merge_continuations: true in the searchteam config"
    )


def truncated(output: Any, response_length: int) -> Any:
    """A merged trajectory cut to verl's response_length, as verl's own tool agent loop cuts one."""
    if len(output.response_ids) <= response_length:
        return output
    output.response_ids = output.response_ids[:response_length]
    output.response_mask = output.response_mask[:response_length]
    if output.response_logprobs is not None:
        output.response_logprobs = output.response_logprobs[:response_length]
    return output


def _metrics(episode: Episode) -> Any:
    return agent_loop.AgentLoopMetrics(
        generate_sequences=sum(t.seconds for t in episode.turns),
        tool_calls=sum(r.seconds for r in episode.retrievals),
    )
