"""One growing assistant reply shared by the monolithic agents (Search-R1 serialization).

Search-R1, QAgent and DAC's searcher keep generating inside one assistant message: the model writes
`<think>…</think><search>…</search>`, the environment appends `<information>…</information>`, and the
model continues. The text therefore mixes two sources, and RL must only optimise the model's own tokens
(Search-R1 §3.1 "retrieved token masking"; DAC §4.1 "information blocks are treated as environment outputs
and masked out"). A `Transcript` keeps that distinction explicit and writes it down:

- `episode.meta[key]` (default `TRANSCRIPT`): the segments in order, `{"source": "model" | "env",
  "text": ...}`, model segments with `"turn"`, the index in `episode.turns` of the call that wrote them.
- `turn.env_spans` on every call it makes: `[start, end)` character ranges of the environment text
  inside that call's `continuation` (the transcript text before the call; its length is
  `turn.continuation_chars`, and it is always a prefix of the final transcript text). A trainer
  maps these ranges onto prompt tokens to mask them; the call's own completion is all model text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from searchteam.runtime.context import Context
from searchteam.teams.parsing import parse_answer
from searchteam.types import Episode, Message, Passage, Turn

Source = Literal["model", "env"]
ANSWER_OPENER = "<answer>"
TRANSCRIPT = "transcript"  # the episode meta key of the segments


@dataclass(frozen=True)
class Segment:
    source: Source
    text: str


class Transcript:
    """An append-only assistant text made of model and environment segments, recorded on the episode."""

    def __init__(self, episode: Episode, key: str = TRANSCRIPT) -> None:
        self.segments: list[Segment] = []
        self._record: list[dict[str, object]] = []
        episode.meta[key] = self._record

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    def env_spans(self) -> list[list[int]]:
        """`[start, end)` character ranges of the environment segments in `self.text`."""
        spans, pos = [], 0
        for s in self.segments:
            if s.source == "env":
                spans.append([pos, pos + len(s.text)])
            pos += len(s.text)
        return spans

    def add_env(self, text: str) -> None:
        """Text the environment inserts (retrieved information, a retry prompt, a forced answer tag)."""
        if text:
            self.segments.append(Segment("env", text))
            self._record.append({"source": "env", "text": text})

    async def generate(
        self,
        ctx: Context,
        role: str,
        messages: list[Message],
        *,
        stop: tuple[str, ...],
        max_new_tokens: int | None = None,
    ) -> Turn:
        """Continue the reply as `role`; the completion becomes a model segment and the Turn records where
        the environment text sits in the continuation it was given."""
        spans = self.env_spans()
        turn = await ctx.llm(role, messages, stop=stop, max_new_tokens=max_new_tokens, continuation=self.text)
        turn.env_spans = spans
        self._add_model(ctx, turn.completion)
        return turn

    def write(self, ctx: Context, role: str, messages: list[Message], text: str) -> Turn:
        """A turn the environment writes in `role`'s name (a privileged demonstration while sampling for a
        warm start): recorded like a policy call's turn, without token ids or logprobs, so likelihood
        training tokenizes it from its text; `turn.meta["written"]` marks it."""
        turn = Turn(
            role=role,
            step=ctx.step,
            messages=messages,
            completion=text,
            continuation=self.text or None,
            continuation_chars=len(self.text),
            env_spans=self.env_spans(),
            meta={"written": True},
        )
        ctx.record(turn)
        self._add_model(ctx, text)
        return turn

    def _add_model(self, ctx: Context, text: str) -> None:
        """`text` as a model segment of the episode's last turn."""
        if text:
            self.segments.append(Segment("model", text))
            self._record.append({"source": "model", "text": text, "turn": len(ctx.episode.turns) - 1})

    async def force_answer(
        self, ctx: Context, role: str, messages: list[Message], *, max_new_tokens: int
    ) -> str:
        """Open `<answer>` as the environment and let the model fill it in (used when a turn budget is
        spent). A model that opens the tag again is parsed on its own text; an answer left unclosed is
        flagged and cut by `parse_answer`'s fallback."""
        self.add_env(ANSWER_OPENER if not self.text or self.text.endswith("\n") else "\n" + ANSWER_OPENER)
        turn = await self.generate(ctx, role, messages, stop=("</answer>",), max_new_tokens=max_new_tokens)
        reopened = ANSWER_OPENER in turn.completion.lower()
        parsed = parse_answer(turn.completion if reopened else ANSWER_OPENER + turn.completion)
        if not parsed.ok:
            turn.flag_format_error(parsed.error or "bad answer format")
        return parsed.value


def information_block(passages: list[Passage]) -> str:
    """Retrieved passages the way Search-R1 inserts them, `Doc 1(Title: t) text` lines inside
    `\\n\\n<information>…</information>\\n\\n` (search_r1/llm_agent/generation.py: `_passages2string`,
    `execute_predictions`)."""
    docs = "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1))
    return f"\n\n<information>{docs}</information>\n\n"


def dedupe(passages: list[Passage]) -> list[Passage]:
    """Distinct passages by id in first-seen order (the evidence / passage set K handed to a generator)."""
    seen: dict[str, Passage] = {}
    for p in passages:
        seen.setdefault(p.id, p)
    return list(seen.values())
