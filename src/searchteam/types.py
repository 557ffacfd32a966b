"""The one data model: an Episode (one question) is a list of Turns (one LLM call each) plus retrievals."""

from __future__ import annotations

from typing import Any, Literal, Self, get_args

from pydantic import BaseModel, Field

Message = dict[str, str]


class Question(BaseModel):
    """A QA item in the FlashRAG shape."""

    id: str
    question: str
    golden_answers: list[str] = Field(default_factory=list)
    dataset: str = "custom"
    meta: dict[str, Any] = Field(default_factory=dict)


class Passage(BaseModel):
    id: str
    title: str = ""
    text: str
    score: float | None = None

    @property
    def contents(self) -> str:
        """Title and text the way Search-R1 / FlashRAG show a passage to the model."""
        return f'"{self.title}"\n{self.text}' if self.title else self.text


class Turn(BaseModel):
    """One LLM call by one role.

    What the trainer reads besides the call itself: `frozen` (never trained nor rewarded, e.g. a frozen
    generator's call), `continuation` (the assistant text the call continued, `continuation_chars` long;
    results files keep only the length), `env_spans` (`[start, end)` character ranges of environment text
    inside that continuation, masked out of the loss), `subgroup` (a separate GRPO group within the question,
    e.g. DAC's hard-positive inputs) and `sft_target` (a pseudo-target for the auxiliary SFT loss, DAC Eq. 7).
    `meta` holds what a method's team records for its own reward scheme and for reading a run."""

    role: str
    step: int = 0
    messages: list[Message] = Field(default_factory=list)
    completion: str = ""
    prompt_token_ids: list[int] = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    logprobs: list[float] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = ""
    parsed_ok: bool = True
    parse_error: str | None = None
    model: str = "policy"
    seconds: float = 0.0
    reward: float | None = None
    frozen: bool = False
    continuation: str | None = None
    continuation_chars: int = 0
    env_spans: list[list[int]] = Field(default_factory=list)
    subgroup: str = ""
    sft_target: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)

    def flag_format_error(self, why: str) -> None:
        self.parsed_ok = False
        self.parse_error = why


class Retrieval(BaseModel):
    """One retriever call made during an episode."""

    query: str
    k: int
    step: int = 0
    passages: list[Passage] = Field(default_factory=list)
    seconds: float = 0.0
    after_turns: int = Field(
        0, ge=0, description="the episode's turns finished when this search returned: it ran after them"
    )


# Why an episode ended without its answer: the engine refused a request, the question cannot be taken as
# given, or the team's own code raised.
FailureKind = Literal["rejected", "input", "bug"]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


class Episode(BaseModel):
    """Everything that happened while one method answered one question. `group_id` overrides the GRPO group
    (default: the question id); `reward` and `reward_terms` are what the reward scheme scored (training)."""

    question: Question
    method: str
    model: str = ""
    turns: list[Turn] = Field(default_factory=list)
    retrievals: list[Retrieval] = Field(default_factory=list)
    states: list[dict[str, Any]] = Field(default_factory=list)
    answer: str = ""
    error: str | None = None
    error_kind: FailureKind | None = None  # why `error` ended it (`runtime.failures`)
    seconds: float = 0.0
    group_id: str | None = None
    reward: float | None = None
    reward_terms: dict[str, float] = Field(default_factory=dict)
    meta: dict[str, Any] = Field(default_factory=dict)

    @property
    def passages(self) -> list[Passage]:
        """Every passage its searches returned, in search order (a passage found twice is listed twice)."""
        return [p for r in self.retrievals for p in r.passages]

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    def turns_of(self, role: str) -> list[Turn]:
        return [t for t in self.turns if t.role == role]

    def retrieved_passages(self) -> list[Passage]:
        """All distinct passages retrieved in this episode, in first-seen order."""
        seen: dict[str, Passage] = {}
        for r in self.retrievals:
            for p in r.passages:
                seen.setdefault(p.id, p)
        return list(seen.values())


class Record(BaseModel):
    """What a team records on a turn or an episode (its `meta`) for its reward to read, as typed fields that
    both sides name through the model, never as string keys. A method subclasses it with its fields and
    defaults; `write` stores the fields it was given, `of` reads them back (defaults for any not written)."""

    def write(self, item: Turn | Episode) -> None:
        item.meta.update(self.model_dump(exclude_unset=True))

    @classmethod
    def of(cls, item: Turn | Episode) -> Self:
        return cls.model_validate(item.meta)
