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

Every output carries the episode's reward (`reward_score`: verl's estimators give one advantage per
episode, and its v1 trainer copies the last output's reward onto the others); the turn's own reward, role,
EM and F1 travel in `extra_fields`.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from searchteam.errors import ConfigError
from searchteam.extras import require
from searchteam.integrations.environment import (
    TeamEnvironment,
    TokenServerLLM,
    engine_logprobs,
    episode_scores,
    load_environment,
    server_request,
)
from searchteam.integrations.questions import AGENT_NAME
from searchteam.llm.base import SamplingParams
from searchteam.rl.experience import Sample
from searchteam.types import Episode

agent_loop = require("verl.experimental.agent_loop.agent_loop", "verl", "the verl agent loop")


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

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        extra_info = dict(kwargs.get("extra_info") or {})
        question = self.env.question(extra_info, fallback_id=str(kwargs.get("index", "")))
        llm = TokenServerLLM(self._generate_through(sampling_params), self.tokenizer, name="verl")
        episode = await self.env.play(question, llm, group=str(kwargs.get("uid", question.id)))
        samples = self.env.samples(episode, self.tokenizer)
        outputs = [self._output(s, episode) for s in samples] or [self._placeholder(episode)]
        if self.multi_output:
            return outputs
        if len(outputs) > 1:
            raise ConfigError(single_output_refusal(self.env.method, len(outputs)))
        single = outputs[0]
        single.prompt_ids = self._cap_text_prompt_length(single.prompt_ids)
        return truncated(single, self.rollout_config.response_length)

    def _generate_through(self, params: dict[str, Any]):
        """Each request with verl's sampling (its temperature, top-p, logprobs) and the role's token limit
        (at most verl's response_length) and stop strings; one sticky session per episode, so its turns
        share a server's prefix cache."""
        session = uuid4().hex
        limit = self.rollout_config.response_length

        async def generate(
            prompt_ids: list[int], sampling: SamplingParams
        ) -> tuple[list[int], list[float] | None]:
            request = server_request(params, sampling, limit)
            out = await self.server_manager.generate(
                request_id=session, prompt_ids=prompt_ids, sampling_params=request
            )
            return list(out.token_ids), (list(out.log_probs) if out.log_probs else None)

        return generate

    def _output(self, sample: Sample, episode: Episode) -> Any:
        return agent_loop.AgentLoopOutput(
            prompt_ids=sample.prompt_ids,
            response_ids=sample.completion_ids,
            response_mask=sample.loss_mask,
            response_logprobs=engine_logprobs(sample),
            reward_score=float(episode.reward or 0.0),
            num_turns=1 + len(episode.turns) + len(episode.retrievals),
            metrics=_metrics(episode),
            extra_fields=_fields(episode, sample.role, sample.turn_index, sample.reward),
        )

    def _placeholder(self, episode: Episode) -> Any:
        """An episode that trained no turn: its fully masked sample (`TeamEnvironment.placeholder`) with
        reward 0, so the rollout still counts in its group and nothing is trained on it."""
        output = self._output(self.env.placeholder(episode, self.tokenizer), episode)
        output.reward_score = 0.0
        return output


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


def _fields(episode: Episode, role: str, turn_index: int, turn_reward: float) -> dict[str, Any]:
    """The same keys on every output (verl stacks them across a batch): the episode's scores as
    `reward_extra_info`, and the turn's identity and own reward."""
    return {
        "reward_extra_info": episode_scores(episode),
        "role": role,
        "turn_index": turn_index,
        "turn_reward": float(turn_reward),
        "question_id": episode.question.id,
        "episode_error": episode.error or "",
    }
