"""The one data model: an Episode (one question) is a list of Turns (one LLM call each) plus retrievals."""

from __future__ import annotations

from typing import Any

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
    """One LLM call by one role."""

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


class Episode(BaseModel):
    """Everything that happened while one method answered one question."""

    question: Question
    method: str
    model: str = ""
    turns: list[Turn] = Field(default_factory=list)
    retrievals: list[Retrieval] = Field(default_factory=list)
    states: list[dict[str, Any]] = Field(default_factory=list)
    answer: str = ""
    error: str | None = None
    seconds: float = 0.0
    meta: dict[str, Any] = Field(default_factory=dict)

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
