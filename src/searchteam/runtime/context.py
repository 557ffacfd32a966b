"""What a team sees while answering one question: `ctx.llm` and `ctx.search`, both recorded."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from searchteam.llm.base import Completion, GenerationRequest, SamplingParams
from searchteam.runtime.batcher import Batcher, Dispatcher
from searchteam.types import Episode, Message, Passage, Retrieval, Turn

SearchRequest = tuple[str, int]
TurnHook = Callable[[Episode, Turn], None]  # told of each turn as it is recorded (e.g. to stream it)
LLMFrontend = Batcher[GenerationRequest, Completion] | Dispatcher[GenerationRequest, Completion]


@dataclass
class Backends:
    """Front-ends shared by every episode of a run (`make_backends`). `llms["policy"]` is the team's model;
    a role that runs on its own model (`role_models`) has its front-end under the role's name, and
    `model_names` names the model of each such front-end (what its turns record)."""

    llms: dict[str, LLMFrontend]
    search: Batcher[SearchRequest, list[Passage]] | None = None
    model_names: dict[str, str] = field(default_factory=dict)


@dataclass
class Sampling:
    """Decoding knobs from the run config: one temperature, max new tokens per role with a default."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    max_new_tokens_per_role: dict[str, int] = field(default_factory=dict)

    def for_role(
        self, role: str, stop: tuple[str, ...] = (), max_new_tokens: int | None = None
    ) -> SamplingParams:
        limit = self.max_new_tokens_per_role.get(role) or max_new_tokens or self.max_new_tokens
        return SamplingParams(max_new_tokens=limit, temperature=self.temperature, top_p=self.top_p, stop=stop)


class Context:
    """Per-episode handle. Every LLM call becomes a Turn, every search a Retrieval, on `self.episode`."""

    def __init__(
        self,
        episode: Episode,
        backends: Backends,
        sampling: Sampling,
        training: bool = False,
        on_turn: TurnHook | None = None,
    ) -> None:
        self.episode = episode
        self.backends = backends
        self.sampling = sampling
        self.training = training
        self.on_turn = on_turn
        self.step = 0
        self.session = f"{id(episode):x}"  # this episode's requests, for a backend that keeps them together
        self.new_passages_only = False  # set from the team's settings: searches return only unseen passages

    async def llm(
        self,
        role: str,
        messages: list[Message],
        *,
        stop: tuple[str, ...] = (),
        max_new_tokens: int | None = None,
        continuation: str = "",
    ) -> Turn:
        """Run one LLM call as `role`; returns the recorded Turn (callers flag parse errors on it). The role's
        own model serves it when the run gives it one (`role_models`), and the Turn records that model's
        name; otherwise the policy serves it and the Turn records "policy"."""
        key = role if role in self.backends.llms else "policy"
        model = self.backends.model_names.get(key, "policy")
        sampling = self.sampling.for_role(role, stop, max_new_tokens)
        request = GenerationRequest(messages, sampling, continuation, role=role, session=self.session)
        started = time.perf_counter()
        completion = await self.backends.llms[key].submit(request)
        turn = Turn(
            role=role,
            step=self.step,
            messages=messages,
            completion=completion.text,
            prompt_token_ids=completion.prompt_token_ids,
            completion_token_ids=completion.token_ids,
            logprobs=completion.logprobs,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            finish_reason=completion.finish_reason,
            model=model,
            seconds=time.perf_counter() - started,
            continuation=continuation or None,
            continuation_chars=len(continuation),
        )
        return self.record(turn)

    def record(self, turn: Turn) -> Turn:
        """Add `turn` to the episode (and tell `on_turn`): every LLM call's, or one the environment wrote."""
        self.episode.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(self.episode, turn)
        return turn

    async def search(self, query: str, k: int) -> list[Passage]:
        if self.backends.search is None:
            raise RuntimeError(f"method '{self.episode.method}' searched, but the run has no retriever")
        started = time.perf_counter()
        seen = self.retrieved_ids() if self.new_passages_only else set()
        found = await self.backends.search.submit((query, k + len(seen)))
        passages = [p for p in found if p.id not in seen][:k]
        self.episode.retrievals.append(
            Retrieval(
                query=query,
                k=k,
                step=self.step,
                passages=passages,
                seconds=time.perf_counter() - started,
                after_turns=len(self.episode.turns),  # `step` is the team's loop index, not an order
            )
        )
        return passages

    def retrieved_ids(self) -> set[str]:
        """The ids of every passage this episode's searches returned so far."""
        return {p.id for p in self.episode.passages}

    def snapshot(self, state: dict[str, Any]) -> None:
        """Record the team's structured state after a step, so a run can be replayed like a case study."""
        self.episode.states.append({"step": self.step, **state})
