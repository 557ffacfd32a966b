"""The one protocol every generation backend implements: a batch of requests in, completions out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from searchteam.types import Message

SHARED = ""  # the adapter key (`load_adapters`) of a policy with one adapter for every role


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings; requests with equal params can share one batched generate call.

    These are all there is: every backend samples from the plain temperature softmax (nucleus-truncated when
    `top_p` < 1), the distribution the trainer scores, and sets every other sampling knob of its engine to
    off (top-k, min-p, repetition/presence/frequency penalties) instead of inheriting the model's
    generation_config defaults."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    """A chat to complete. `continuation` is text already in the assistant's reply (monolithic agents
    such as Search-R1 keep generating inside one growing assistant message)."""

    messages: list[Message]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    continuation: str = ""
    role: str = ""  # who asks; backends with one adapter per role route on it
    session: str = ""  # the episode that asks; a backend with several servers keeps it on one


@dataclass
class Completion:
    text: str
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"


class LLM(Protocol):
    """A generation backend. `generate` is blocking; the runtime calls it from a worker thread."""

    name: str

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]: ...


@runtime_checkable
class AsyncLLM(Protocol):
    """A backend whose engine batches on its side (an HTTP server): the runtime sends each request the
    moment an episode makes it (`agenerate`), at most `concurrency` at once, instead of batching them."""

    name: str
    concurrency: int

    async def agenerate(self, request: GenerationRequest) -> Completion: ...

    async def aclose(self) -> None:
        """Close what `agenerate` opened on the running event loop (its HTTP client)."""
        ...


def render_chat(tokenizer, request: GenerationRequest) -> str:
    """The exact prompt text every local backend feeds its model: the transformers chat template with the
    generation prompt, plus any assistant continuation."""
    text = tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=True)
    return text + request.continuation


def render_prompt_ids(tokenizer, request: GenerationRequest) -> list[int]:
    """The prompt's token ids as every client-side renderer feeds them: `render_chat`'s text tokenized
    without adding special tokens (the template already holds them; adding a BOS again would double it)."""
    return list(tokenizer(render_chat(tokenizer, request), add_special_tokens=False)["input_ids"])


def text_decoder(tokenizer) -> Callable[[list[int]], str]:
    """Completion ids to text, as every local backend decodes them (special tokens left out)."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def truncate_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """Cut `text` right after the earliest stop string (the stop string is kept, so tags stay closed)."""
    cut = min(((i + len(s)) for s in stop if (i := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def cut_completion(
    ids: list[int], eos_ids: set[int], stop: tuple[str, ...], decode: Callable[[list[int]], str]
) -> tuple[list[int], str, bool]:
    """The sampled part of one row of a batched generate: its ids, text and whether it stopped (else it ran
    to the token limit). A row that finished early is filled with pad ids, and pad is often an EOS id, so
    the row ends at the first token whose prefix decodes to a stop string (the padding that follows is
    not sampled, EOS-valued or not), else at the first EOS inclusive (then a real, sampled EOS). The text
    is the kept ids' text cut right after the stop string, as `truncate_at_stop` does."""
    first_eos = next((i for i, tid in enumerate(ids) if tid in eos_ids), None)
    head = ids if first_eos is None else ids[: first_eos + 1]
    text, hit_stop = truncate_at_stop(decode(head), stop)
    if hit_stop:
        head = head[: _stop_end(head, stop, decode)]
        text, _ = truncate_at_stop(decode(head), stop)
    return head, text, hit_stop or first_eos is not None


def _stop_end(ids: list[int], stop: tuple[str, ...], decode: Callable[[list[int]], str]) -> int:
    """The fewest leading ids whose text holds a stop string (binary search; `ids` as a whole holds one)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if truncate_at_stop(decode(ids[:mid]), stop)[1]:
            hi = mid
        else:
            lo = mid + 1
    return lo
