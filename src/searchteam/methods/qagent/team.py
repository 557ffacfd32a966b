"""QAgent (Jiang et al.): a search agent that plans, issues several queries per round, reflects, and answers.

The rollout is Algorithm 1 ("Rollout with Multi-Turn Interaction") over one growing reply (§3.2, Eq. 6:
q, I_1^pre, S_1, C_1, I_1^post, …, Â): in each of at most B = `max_turns` rounds the agent writes
`<plan>…</plan>` and a `<search>` with up to three `<query>` items, all of them are retrieved and their
results appended as one `<information>` block (Eq. 5, C_t = ⊕_j R(q_tj)), then `<reflection>…</reflection>`
and a new plan or `<answer>`. The reply is a `Transcript`: information blocks and retry prompts are
environment text (`turn.env_spans`). Every retrieved passage joins the passage set K (line 12).

Roles: `agent`; `generator` in submodule mode, which a run can give a different (frozen) model
(`role_models: {generator: ...}`); without one the policy serves it.
The generator is frozen in the paper (§3.4), so its turns are frozen (`turn.frozen`): never trained,
even when the policy serves them, unless the option `frozen_generator: false` says otherwise.

Options (`settings.options`):
- `mode`: `end_to_end` (default; the agent's own `<answer>`, §3.3) or `submodule` (§3.4-3.5: the
  deduplicated passage set K goes to the generator, Â = G(q, K), Eq. 8-9; the generator sees only the
  question and K, never the agent's plans or reflections; the agent's own answer, if any, is kept in
  `episode.meta["agent_answer"]` for the Hit term of Eq. 10);
- `max_retries` (default 2): how many malformed outputs get prompt_rethink (line 16) before giving up;
- `frozen_generator` (default true, as in §3.4): false leaves the generator's turns trainable, so a run
  can fine-tune the reader on the passage sets the agent gathers (submodule mode only, and only when the
  policy serves the generator: a generator on its own model (`role_models`) is never trained; not in the
  paper).
`top_k` is passages per query (the paper retrieves 1 per query; that is the default unless set);
`max_turns` is B (default 4), and, as in line 18, a retry uses up a round.

Parsing and fallbacks (flagged on the turn with `flag_format_error`, never raised):
- no `<search>` with queries and no `<answer>`: malformed; the retry prompt is appended (counted in
  `episode.meta["retries"]` and the snapshot); after `max_retries` the loop ends as if B were spent;
- a `<search>` without `<query>` items: its whole text is used as one query;
- more than three queries: only the first three are retrieved;
- a `<search>` cut off by the token cap (the 0.5B model lists queries until it runs out): its complete
  `<query>` items are the search;
- a search round without `<plan>`, or a round after `<information>` without `<reflection>`: flagged only
  (the format reward of §3.3 requires them), the action still runs;
- end-to-end mode and no answer when the rounds run out: the environment opens `<answer>` for one last call.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal, Self

from pydantic import Field, model_validator

from searchteam.runtime.context import Context
from searchteam.teams.base import Team, TeamOptions, TeamSettings, format_documents
from searchteam.teams.parsing import capped, last_tag, tag_contents
from searchteam.teams.transcript import Transcript, dedupe, information_block
from searchteam.types import Message, Passage, Question, Record

AGENT_STOP = ("</search>", "</answer>")
ANSWER_STOP = ("</answer>",)
MAX_QUERIES = 3
AGENT_TOKENS = 160
ANSWER_TOKENS = 32
GENERATOR_TOKENS = 48


class QAgentRecord(Record):
    """What an episode records for the reward scheme (reward.py, Eq. 7): the agent's own answer in submodule
    mode, where the frozen generator gives the episode's answer."""

    agent_answer: str | None = None


@dataclass(frozen=True)
class RoundOutput:
    """What one agent generation y_b amounts to: a search with its queries, an answer, or malformed."""

    kind: Literal["search", "answer", "malformed"]
    queries: list[str] = field(default_factory=list)
    answer: str = ""
    issues: list[str] = field(default_factory=list)


def parse_round(completion: str, after_information: bool) -> RoundOutput:
    """Algorithm 1 lines 8-16: search tags first (ParseQ), then answer tags, else a retry."""
    completion = capped(completion)
    text = completion.lower()
    issues = []
    if after_information and "<reflection>" not in text:
        issues.append("no <reflection> after <information>")
    queries = [q for q in tag_contents(completion, "query") if q]
    cut_off = "<search>" in text and "</search>" not in text and bool(queries)
    if cut_off:
        issues.append("unclosed <search>; its complete <query> items are used")
    if "</search>" in text or cut_off:
        if "<plan>" not in text:
            issues.append("no <plan> before <search>")
        if not queries and (block := last_tag(completion, "search")):
            queries = [block]
            issues.append("no <query> items; the <search> text is used as one query")
        if len(queries) > MAX_QUERIES:
            issues.append(f"{len(queries)} queries; only the first {MAX_QUERIES} are retrieved")
        if queries:
            return RoundOutput("search", queries=queries[:MAX_QUERIES], issues=issues)
        return RoundOutput("malformed", issues=[*issues, "<search> without a query"])
    if answer := last_tag(completion, "answer"):
        return RoundOutput("answer", answer=answer, issues=issues)
    return RoundOutput("malformed", issues=[*issues, "neither <search> with <query> items nor <answer>"])


class QAgent(Team):
    name = "qagent"
    description = (
        "QAgent: plan, up to 3 queries per round, reflect; answer end-to-end or hand the passage set "
        "to a generator (options: mode=end_to_end|submodule)."
    )

    default_top_k = 1  # §4: "we retrieve 1 passage each query"
    roles = ("agent", "generator")
    gatherer_roles = ("agent",)
    reader_roles = ("generator",)

    class Options(TeamOptions):
        mode: Literal["end_to_end", "submodule"] = Field(
            "end_to_end",
            description="end_to_end: the agent answers (§3.3); submodule: a generator answers from the "
            "passages the agent gathered (§3.4-3.5; role_models: {generator: MODEL}, else the policy)",
        )
        max_retries: int = Field(2, ge=0, description="malformed outputs answered with the retry prompt")
        frozen_generator: bool = Field(True, description="false: the generator's turns are trainable")

        @model_validator(mode="after")
        def _unfrozen_needs_submodule(self) -> Self:
            if not self.frozen_generator and self.mode != "submodule":
                raise ValueError("qagent option 'frozen_generator: false' needs mode: submodule")
            return self

    options: Options

    def __init__(self, settings: TeamSettings | None = None) -> None:
        super().__init__(settings)
        self.mode = self.options.mode
        self.max_retries = self.options.max_retries
        self.frozen_generator = self.options.frozen_generator

    async def run(self, q: Question, ctx: Context) -> str:
        if self.mode == "submodule":
            return await self.read(q, ctx, await self.gather(q, ctx))  # line 20: Â = G(q, K)
        _, agent_answer, transcript, messages = await self._search_rounds(q, ctx)
        if agent_answer is None:
            agent_answer = await transcript.force_answer(ctx, "agent", messages, max_new_tokens=ANSWER_TOKENS)
        return agent_answer

    async def gather(self, q: Question, ctx: Context) -> list[Passage]:
        """The search module of §3.4-3.5 (in front of its own generator or another method's reader): the
        passage set K; the agent's own answer, if any, is kept for the Hit term of Eq. 10."""
        found, agent_answer, _, _ = await self._search_rounds(q, ctx)
        if agent_answer is not None:
            QAgentRecord(agent_answer=agent_answer).write(ctx.episode)
        return found

    async def read(self, q: Question, ctx: Context, passages: list[Passage]) -> str:
        """The generator G(q, K) of Eq. 9, on its agent's passages or another method's."""
        return await self._generate(q, passages, ctx)

    async def _search_rounds(
        self, q: Question, ctx: Context
    ) -> tuple[list[Passage], str | None, Transcript, list[Message]]:
        """Algorithm 1's rounds (lines 2-18): the passage set K, the agent's own answer if it gave one, and
        the transcript and messages a forced answer continues."""
        messages = self.chat("agent", question=q.question)
        transcript = Transcript(ctx.episode)
        found: list[Passage] = []  # the info set K (line 1)
        retries = 0
        agent_answer: str | None = None
        after_information = gave_up = False
        for b in range(self.settings.max_turns):  # line 2: while b < B
            ctx.step = b
            turn = await transcript.generate(
                ctx, "agent", messages, stop=AGENT_STOP, max_new_tokens=AGENT_TOKENS
            )
            out = parse_round(turn.completion, after_information)
            if out.issues:
                turn.flag_format_error("; ".join(out.issues))
            if out.kind == "search":  # lines 8-12
                found = dedupe(found + await self._retrieve(out.queries, ctx, transcript))
            elif out.kind == "answer":  # lines 13-14
                agent_answer = out.answer
            elif retries < self.max_retries:  # line 16: ask for retry
                retries += 1
                transcript.add_env(self.prompts["retry"])
            else:
                gave_up = True
            after_information = out.kind == "search"
            ctx.snapshot(
                {
                    "action": out.kind,
                    "queries": out.queries,
                    "passages": [p.id for p in found],
                    "retries": retries,
                }
            )
            if agent_answer is not None or gave_up:
                break
        ctx.episode.meta["retries"] = retries
        ctx.step += 1
        return found, agent_answer, transcript, messages

    async def _retrieve(self, queries: list[str], ctx: Context, transcript: Transcript) -> list[Passage]:
        """Line 10-11: retrieve every query of the round, append the results as one information block."""
        results = await asyncio.gather(*(ctx.search(query, self.settings.top_k) for query in queries))
        passages = [p for hits in results for p in hits]
        transcript.add_env(information_block(passages))
        return passages

    async def _generate(self, q: Question, passages: list[Passage], ctx: Context) -> str:
        """The generator answers from the question and the deduplicated passage set only (Eq. 9)."""
        documents = format_documents(passages) or "(no documents were retrieved)"
        turn = await ctx.llm(
            "generator",
            self.chat("generator", question=q.question, documents=documents),
            stop=ANSWER_STOP,
            max_new_tokens=GENERATOR_TOKENS,
        )
        turn.frozen = self.frozen_generator
        return self.answer_from(turn)
