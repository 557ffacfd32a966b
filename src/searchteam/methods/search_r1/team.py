"""Search-R1 (Jin et al., 2025): one policy that reasons, searches and answers in one growing reply.

The rollout follows Search-R1's `run_llm_loop` (search_r1/llm_agent/generation.py), the monolithic baseline
of DAC §4.1 and QAgent §4: for at most `max_turns` actions the agent generates until `</search>` or
`</answer>`; a search retrieves the top-k passages, appended as `<information>…</information>`; an answer
ends the episode. The whole trajectory is a `Transcript`, so the `<information>` text is recorded as
environment tokens (`turn.env_spans`) that RL masks out of the loss.

Role: `agent`. Settings: `top_k` passages per search (paper default 3), `max_turns` actions (default 4;
Search-R1 counts invalid actions as turns too). Options:
- `prompt`: `default` (instruction as the system message plus one worked example, sized for small models)
  or `paper` (Search-R1's exact template as the one user message; see `paper` in prompts.yaml);
- `action_tokens`: the token budget of each action (default 128; Search-R1's `max_response_length` is
  500); `answer_tokens`: the budget of the forced final answer (default 32). A run's
  `max_new_tokens_per_role: {agent: N}` still overrides both;
- `first_search`: `agent` (the paper) or `question`: before the agent's first action the environment
  writes `<search> QUESTION </search>` and its `<information>`, so the agent starts from naive RAG's
  evidence and searches on only for what it lacks (not in the paper);
- `bridge_hint` (privileged, for a warm start's sampling; not in the paper): after a search, while one of
  the question's `supporting_titles` has not been returned but the question or a passage read so far
  mentions it, the environment writes the agent's next action itself: `<search>` for that name (once per
  title; `Transcript.write`). Expert iteration then imitates that query in the state the agent reached on
  its own, so it learns to search for the bridge entity it read. Never for a title that names a gold
  answer (it would teach answering with what was searched); questions without supporting titles get none.

Fallbacks (each flags a format error on the turn, never raises):
- an output with neither `<search>…</search>` nor `<answer>…</answer>` (or an empty query): Search-R1's
  "My previous action is invalid ..." observation is appended (environment text) and the turn is used up;
- the turn budget spent without an answer: Search-R1's final rollout would generate once more and discard
  any search; here the environment opens `<answer>` so that call must answer (flagged only if the model
  then leaves the tag unclosed, answer taken as `parse_answer`'s unclosed-tag fallback).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from searchteam.metrics import answer_scores
from searchteam.runtime.context import Context
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions, TeamSettings
from searchteam.teams.parsing import tag_pairs
from searchteam.teams.transcript import Transcript, information_block
from searchteam.types import Episode, Message, Question, Turn

ACTION_STOP = ("</search>", "</answer>")
ACTION_TOKENS = 128
ANSWER_TOKENS = 32


@dataclass(frozen=True)
class Action:
    """The agent's action in one turn: a search query, a final answer, or neither (invalid)."""

    kind: Literal["search", "answer", "invalid"]
    content: str = ""
    error: str | None = None


def parse_action(completion: str) -> Action:
    """Search-R1's `postprocess_predictions`: the first complete `<search>` or `<answer>` tag decides."""
    found = next(tag_pairs(completion, ("search", "answer")), None)
    if found is None:
        return Action("invalid", error="neither <search>…</search> nor <answer>…</answer>")
    kind, content = found.name, found.content.strip()
    if not content:
        return Action("invalid", error=f"empty <{kind}> tag")
    return Action("search" if kind == "search" else "answer", content)


class SearchR1(GathersItsSearches, Team):
    name = "search_r1"
    description = (
        "Monolithic Search-R1 agent: think, search, read <information>, answer, in one growing reply."
    )
    default_top_k = 3  # Search-R1 retrieves the top-3 passages per search
    roles = ("agent",)
    warm_start_only = ("bridge_hint",)

    class Options(TeamOptions):
        prompt: Literal["default", "paper"] = Field("default", description="our chat prompt or the paper's")
        action_tokens: int = Field(ACTION_TOKENS, ge=1, description="new tokens per action")
        answer_tokens: int = Field(ANSWER_TOKENS, ge=1, description="new tokens of the forced answer")
        first_search: Literal["agent", "question"] = Field(
            "agent", description="the first search: the agent's own, or the question's (naive RAG's evidence)"
        )
        bridge_hint: bool = Field(
            False,
            description="privileged, for warm-start sampling: after a search, the environment searches "
            "for a missing supporting title the agent has read, as the agent's action",
        )

    options: Options

    def __init__(self, settings: TeamSettings | None = None) -> None:
        super().__init__(settings)
        self.prompt = self.options.prompt
        self.action_tokens = self.options.action_tokens
        self.answer_tokens = self.options.answer_tokens
        self.first_search = self.options.first_search
        self.bridge_hint = self.options.bridge_hint

    def messages(self, question: str) -> list[Message]:
        """The agent's prompt: our default chat, or Search-R1's template as its data scripts fill it."""
        if self.prompt == "default":
            return self.chat(question=question)
        question = question.strip()
        question += "" if question.endswith("?") else "?"
        return [{"role": "user", "content": self.prompts["paper"]["user"].format(question=question)}]

    async def run(self, q: Question, ctx: Context) -> str:
        messages = self.messages(q.question)
        transcript = Transcript(ctx.episode)
        hinted: set[str] = set()
        if self.first_search == "question":
            await self.search(q.question, ctx, transcript, opened=True)
        for step in range(self.settings.max_turns):
            ctx.step = step
            turn = await self.act(q, ctx, transcript, messages, hinted)
            action = parse_action(turn.completion)
            state: dict[str, object] = {"action": action.kind}
            if action.kind == "answer":
                ctx.snapshot(state)
                return action.content
            if action.kind == "search":
                state |= await self.search(action.content, ctx, transcript)
            else:
                turn.flag_format_error(action.error or "invalid action")
                transcript.add_env(self.prompts["invalid_action"])
            ctx.snapshot(state)
        # budget spent: the final rollout must answer
        ctx.step = self.settings.max_turns
        answer = await transcript.force_answer(ctx, "agent", messages, max_new_tokens=self.answer_tokens)
        ctx.snapshot({"action": "forced_answer"})
        return answer

    async def act(
        self, q: Question, ctx: Context, transcript: Transcript, messages: list[Message], hinted: set[str]
    ) -> Turn:
        """One action: the agent's, or with `bridge_hint` the search for a missing bridge title (`hinted`:
        the titles already searched this way)."""
        title = (
            missing_bridge(q, ctx.episode, hinted) if self.bridge_hint and ctx.episode.retrievals else None
        )
        if title is None:
            return await transcript.generate(
                ctx, "agent", messages, stop=ACTION_STOP, max_new_tokens=self.action_tokens
            )
        hinted.add(title)
        return transcript.write(
            ctx, "agent", messages, self.prompts["bridge_hint"].format(name=title_name(title))
        )

    async def search(
        self, query: str, ctx: Context, transcript: Transcript, opened: bool = False
    ) -> dict[str, object]:
        """Retrieve for `query` and append the `<information>` block; `opened`: the environment also writes
        the `<search>` tag, as if the agent had asked (the `first_search: question` option)."""
        passages = await ctx.search(query, self.settings.top_k)
        opener = f"<search> {query} </search>" if opened else ""
        transcript.add_env(opener + information_block(passages))
        return {"query": query, "passages": [p.id for p in passages]}


def title_name(title: str) -> str:
    """A title without its disambiguation, `Paris (film)` → `Paris`: how a passage would mention it."""
    return re.sub(r"\s*\([^)]*\)$", "", title).strip()


def missing_bridge(q: Question, episode: Episode, skip: set[str]) -> str | None:
    """The first supporting title of `q`, not in `skip`, that no search of `episode` returned but that the
    question or a passage returned so far mentions (case-insensitive, disambiguation dropped); None when
    there is none. A title that names a gold answer is never one: a search for it would teach the agent to
    answer with what it searched."""
    passages = episode.passages
    found = {p.title for p in passages} | skip
    read = " ".join([q.question, *(p.text for p in passages)]).lower()
    return next(
        (
            t
            for t in q.meta.get("supporting_titles") or []
            if t not in found and title_name(t).lower() in read and not names_answer(t, q)
        ),
        None,
    )


def names_answer(title: str, q: Question) -> bool:
    """Whether `title` (its name) would score F1 ≥ 0.5 as an answer to `q`."""
    return answer_scores(title_name(title), q.golden_answers)["f1"] >= 0.5
