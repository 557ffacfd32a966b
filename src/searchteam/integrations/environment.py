"""A searchteam team as the environment of another RL framework (verl, SkyRL): the framework's inference
server generates token-in, token-out; the team runs its episode over searchteam's retriever; the method's
reward scheme scores it; and the episode becomes one training sample per trained turn, the step-wise samples
searchteam's own trainer uses (`rl.experience.samples_from_episodes`). Each sample's row carries what
`integrations.credit` needs to give it the papers' credit inside the framework's trainer.

Everything here is framework-free; `integrations.verl` and `integrations.skyrl` adapt it to each framework's
classes. What cannot carry over is refused when the environment is built: a second model (QAgent's frozen
generator, DECOR's judge), one LoRA per role, a warm start (`refuse_what_frameworks_cannot_train`). A failed
request of the framework's server aborts the rollout (`FrameworkFault`); it is never trained as an episode.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchteam.errors import ConfigError, FrameworkFault
from searchteam.factory import build_run_retriever, build_sampling, build_team, load_run_config
from searchteam.llm.base import (
    Completion,
    GenerationRequest,
    SamplingParams,
    cut_completion,
    render_prompt_ids,
    text_decoder,
)
from searchteam.methods import build_reward_scheme
from searchteam.metrics import answer_scores
from searchteam.retrieval.base import Retriever
from searchteam.rewards.base import RewardScheme
from searchteam.rl.experience import Sample, samples_from_episodes
from searchteam.runtime import Sampling
from searchteam.runtime.failures import TeamBugs
from searchteam.runtime.runner import make_backends, run_episode
from searchteam.teams import Team
from searchteam.train.config import TrainRunConfig
from searchteam.types import Episode, Question

logger = logging.getLogger(__name__)

# (prompt ids, the request's sampling) -> (completion ids, their logprobs or None), by a framework's server
TokenGenerate = Callable[[list[int], SamplingParams], Awaitable[tuple[list[int], list[float] | None]]]


class TokenServerLLM:
    """An `AsyncLLM` over a framework's token-in, token-out server: it renders the prompt ids as every
    searchteam backend does (`render_prompt_ids`), and cuts the returned ids at the request's stop strings
    or EOS (`cut_completion`), so a turn records exactly the ids the framework will train on."""

    def __init__(
        self, generate: TokenGenerate, tokenizer, name: str = "token-server", concurrency: int = 1024
    ):
        self._generate = generate
        self.tokenizer = tokenizer
        self.name = name
        self.concurrency = concurrency
        self._eos = {tokenizer.eos_token_id} - {None}
        self._decode = text_decoder(tokenizer)

    async def agenerate(self, request: GenerationRequest) -> Completion:
        prompt = render_prompt_ids(self.tokenizer, request)
        try:
            ids, logprobs = await self._generate(prompt, request.sampling)
        except Exception as exc:  # the framework's own: a dead actor, a dropped connection, a rejected prompt
            raise FrameworkFault(
                f"{self.name}'s server failed a request of {len(prompt)} prompt tokens: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        kept, text, stopped = cut_completion(list(ids), self._eos, request.sampling.stop, self._decode)
        return Completion(
            text=text,
            prompt_token_ids=prompt,
            token_ids=kept,
            logprobs=list(logprobs[: len(kept)]) if logprobs else None,
            prompt_tokens=len(prompt),
            completion_tokens=len(kept),
            finish_reason="stop" if stopped else "length",
        )

    async def aclose(self) -> None:
        return None


@dataclass
class TeamEnvironment:
    """One searchteam run config, ready to play episodes for another framework: its team, retriever, reward
    scheme and per-role token limits. Built once per process (`load_environment`)."""

    config: TrainRunConfig
    team: Team
    retriever: Retriever | None
    reward: RewardScheme
    sampling: Sampling
    bugs: TeamBugs = field(init=False)

    def __post_init__(self) -> None:
        self.bugs = TeamBugs(self.method)  # over the process's life: a bug that repeats stops the framework

    @classmethod
    def from_config(cls, config: TrainRunConfig) -> TeamEnvironment:
        refuse_second_models(config)
        refuse_what_frameworks_cannot_train(config)
        team = build_team(config)
        return cls(
            config=config,
            team=team,
            retriever=build_run_retriever(config) if team.uses_retrieval else None,
            reward=build_reward_scheme(config.method, config.reward),
            sampling=build_sampling(config),
        )

    @property
    def method(self) -> str:
        return self.config.method

    def question(self, extra_info: Mapping[str, Any], fallback_id: str = "") -> Question:
        """The question of one row of `searchteam export-questions`; a row made for another method is refused
        (its team would differ from the one the row names)."""
        method = extra_info.get("method")
        if method and method != self.method:
            raise ConfigError(
                f"this row was exported for method '{method}', but the environment runs '{self.method}': "
                f"export the questions with --method {self.method}, or give the integration a {method} config"
            )
        if "question" not in extra_info:
            raise ConfigError(
                "a row without extra_info.question: make the dataset with searchteam export-questions"
            )
        return Question(
            id=str(extra_info.get("question_id") or fallback_id),
            question=str(extra_info["question"]),
            golden_answers=[str(a) for a in extra_info.get("golden_answers", [])],
            dataset=str(extra_info.get("dataset", "custom")),
        )

    async def play(
        self, question: Question, llm: TokenServerLLM, group: str = "", training: bool = True
    ) -> Episode:
        """One scored episode: the team answers through `llm`, then the method's reward scheme rewards it.
        `training=False` plays it as `searchteam eval` does (a framework's validation): no training-only
        calls, probes or truncation. A failed server request raises `FrameworkFault`; a team bug seen
        twice in this process raises `TeamBug` (`runtime.failures`), so the framework's run stops."""
        backends = make_backends({"policy": llm}, self.retriever)
        try:
            episode = await run_episode(
                self.team.solve,
                self.method,
                question,
                backends,
                self.sampling,
                llm.name,
                training=training,
                bugs=self.bugs,
            )
        finally:
            for frontend in [*backends.llms.values(), backends.search]:
                if frontend is not None:
                    await frontend.aclose()
        episode.group_id = group
        if episode.error:
            logger.warning("%s episode of %s failed: %s", self.method, question.id, episode.error)
        self.bugs.check()
        self.reward([episode])
        return episode

    def samples(self, episode: Episode, tokenizer) -> list[Sample]:
        """The episode's training samples, one per trained turn (a continued chain of turns is one sample
        when the config sets `train.merge_continuations`, as Search-R1 trains), in the order played."""
        return samples_from_episodes(
            [episode],
            tokenizer,
            roles=self.config.train.roles or None,
            merge_continuations=self.config.train.merge_continuations,
        )

    def rows(self, episode: Episode, tokenizer) -> list[Sample]:
        """What a framework trains of the episode: its samples, or its placeholder when it trained none."""
        return self.samples(episode, tokenizer) or [self.placeholder(episode, tokenizer)]

    def placeholder(self, episode: Episode, tokenizer) -> Sample:
        """The sample of an episode that trained no turn (it failed before its first call): the question as
        the prompt and one EOS, fully masked, so the rollout keeps its place and nothing is trained on it."""
        request = GenerationRequest([{"role": "user", "content": episode.question.question}])
        return Sample(
            prompt_ids=render_prompt_ids(tokenizer, request),
            completion_ids=[tokenizer.eos_token_id],
            loss_mask=[0],
            role="",
            episode_id=0,
            group_id=episode.question.id,
            turn_index=-1,
        )


def refuse_second_models(config: TrainRunConfig) -> None:
    """A run that needs a second model cannot run inside a framework that serves one."""
    if config.role_models or config.judge_model:
        extra = dict(config.role_models) | ({"judge": config.judge_model} if config.judge_model else {})
        raise ConfigError(
            f"{config.method}: {extra} asks for a second model, but verl and SkyRL serve only the policy; "
            "leave role_models and judge_model out (the policy then plays every role, DECOR's reward "
            "falls back to its rule-based judge) or train with searchteam train"
        )


def refuse_what_frameworks_cannot_train(config: TrainRunConfig) -> None:
    """One line for the first setting that verl and SkyRL, which train one model (one LoRA adapter at most)
    and one separate value model, cannot carry out, naming `searchteam train`, which can. Dropped silently,
    each would train something other than what the config says."""
    train = config.train
    critic_head = train.uses_critic and "critic" in train.model_fields_set and train.critic == "head"
    unsupported = [
        (train.lora_per_role, "train.lora_per_role", "one LoRA adapter per role (they train one)"),
        (train.sft_coef > 0, "train.sft_coef", "an SFT loss on recorded pseudo-targets (DAC Eq. 8)"),
        (critic_head, "train.critic: head", "a value head on the policy (their critic is a separate model)"),
        (config.warm_start is not None, "warm_start", "a warm start before RL"),
        (config.init_from is not None, "init_from", "from a searchteam checkpoint"),
    ]
    for refused, setting, what in unsupported:
        if refused:
            raise ConfigError(
                f"{setting}: verl and SkyRL cannot train {what}; train this config with `searchteam train`, "
                "or leave the setting out"
            )


def server_request(
    params: Mapping[str, Any], sampling: SamplingParams, max_tokens: int | None = None
) -> dict[str, Any]:
    """A request's sampling for a framework's server: the framework's own (temperature, top-p, logprobs: it
    decides how to sample) with the role's token limit (at most `max_tokens`) and stop strings."""
    request = {**params, "max_tokens": min(sampling.max_new_tokens, max_tokens or sampling.max_new_tokens)}
    if sampling.stop:
        request["stop"] = list(sampling.stop)
    return request


def recorded_logprobs(sample: Sample, requested: bool) -> tuple[list[int], list[float] | None]:
    """The loss mask and the engine's logprob of each completion token, for a framework's rollout
    correction: 0 on tokens out of the loss (retrieved text in a merged trajectory, a placeholder). A trained
    token whose logprob the engine did not give (a boundary of a merged trajectory that tokenized
    differently) leaves the loss too, so that no correction reads a made-up value. None when the framework
    asked for no logprobs (`requested`); zeros for a sample the engine gave none for (a placeholder)."""
    if not requested:
        return list(sample.loss_mask), None
    known = sample.rollout_logprobs or [math.nan] * len(sample.completion_ids)
    mask = [int(m and not math.isnan(x)) for m, x in zip(sample.loss_mask, known, strict=True)]
    return mask, [0.0 if math.isnan(x) else x for x in known]


def has_turn(sample: Sample) -> bool:
    """Whether a turn stands behind the sample (not an episode's placeholder)."""
    return sample.turn_index >= 0


def row_reward(episode: Episode, sample: Sample) -> float:
    """A row's reward for the framework: the episode's, 0 for a placeholder."""
    return float(episode.reward or 0.0) if has_turn(sample) else 0.0


def credit_fields(episode: Episode, sample: Sample) -> dict[str, Any]:
    """What a row carries for `integrations.credit` (and the framework's logs): the turn's identity, its own
    reward, its sub-group, and whether a turn stands behind it; the same keys on every row."""
    return {
        "role": sample.role,
        "turn_index": sample.turn_index,
        "turn_reward": float(sample.reward),
        "subgroup": sample.subgroup,
        "trained": has_turn(sample),
        "question_id": episode.question.id,
        "episode_error": episode.error or "",
    }


def episode_scores(episode: Episode) -> dict[str, float]:
    """What a framework logs per episode: EM, F1, the scheme's episode reward and the format errors."""
    scores = answer_scores(episode.answer, episode.question.golden_answers)
    return {
        "em": scores["em"],
        "f1": scores["f1"],
        "episode_reward": float(episode.reward or 0.0),
        "format_errors": float(sum(not t.parsed_ok for t in episode.turns)),
    }


def load_train_config(config: str | Path, settings: Mapping[str, Any] | None = None) -> TrainRunConfig:
    """A searchteam run config (a recipe name or a YAML path) with `settings` applied (`--set` style, e.g.
    `{"top_k": 3}`)."""
    return load_run_config(Path(config), {}, TrainRunConfig, dict(settings or {}))


def load_environment(config: str | Path, settings: Mapping[str, Any] | None = None) -> TeamEnvironment:
    """The environment of a searchteam run config (see `load_train_config`), built once per process:
    frameworks make a loop per episode."""
    return _environment(str(config), json.dumps(dict(settings or {}), sort_keys=True))


@functools.lru_cache(maxsize=8)
def _environment(config: str, settings: str) -> TeamEnvironment:
    return TeamEnvironment.from_config(load_train_config(config, json.loads(settings)))
