"""DECOR: planner, filter and answerer around a curated memory pool (DECOR §4.2, Algorithm 1, Appendix A).

Algorithm 1 (the DECOR inference process), for t = 1..T_max (`settings.max_turns`, paper: 4):

1. `planner` observes o_t^plan = {q, M_{t-1}, q_<t}: the question, the memory pool and the query history,
   never the raw documents (§4.2's information barrier), and writes `<think>…</think><search>…</search>`;
   `<search>None</search>` is STOP;
2. the retriever returns the top-k documents D_t (`settings.top_k`, paper: 5) for the query;
3. `filter` observes o_t^filt = {q_search, D_t} and writes `<think>…</think><filter>…</filter>`, the
   evidence paragraph e_t;
4. if |M_{t-1}| + |e_t| > L_max, the frozen summarizer (role `compressor`, which a run can give a separate
   frozen model with `role_models`; the policy otherwise) condenses M_{t-1} (the earliest entries) into
   atomic facts (line 14); its turns are frozen (`turn.frozen`);
5. M_t = M_{t-1} ∪ {(q_search, e_t)}; the memory is snapshotted.

Then `answerer` observes o_T^ans = {q, M_T} only and writes `<think>…</think><answer>…</answer>`.

Options:
- `memory_max_tokens` (L_max, default 4096 as in the paper's Table 4). Memory size is estimated, not
  tokenized: ceil(4/3 × whitespace-separated words) of each entry's query and evidence (about 1.33 BPE
  tokens per English word), so it needs no tokenizer and behaves the same for every backend.
- `truncate_on_format_error` (default: on when `ctx.training`, off otherwise): §4.3 "if an agent violates
  the protocol (e.g., failing to close XML tags), the trajectory receives an immediate penalty R = −1, and
  the episode is truncated". The first planner, filter or answerer turn with a format error (any of the
  flags below) ends the episode at once with an empty answer; `episode.meta["truncated_at"]` records its
  role and step, and the reward's format gate gives every trained turn −1.

Steps: the loop's t is `ctx.step`; the answerer keeps the step of the last loop iteration (the terminal
step T). Planner turns carry `meta["query"]` (None for STOP), filter turns `meta["evidence"]`.

Fallbacks (each flags a format error on the turn, never raises; with truncation on, a planner, filter or
answerer error ends the episode instead of falling back):
- planner: a missing `<think>` block is flagged but the search is used; no closed `<search>` tag (or an empty
  one) → search the original question when memory is empty (rule 6 of the prompt), else STOP.
- filter: a missing `<think>` block is flagged; no `<filter>` tag → the text after an unclosed tag, else the
  reply without its think block; tags removed either way; if nothing is left, "No relevant information."
- compressor: no `<facts>` tag → the reply without tags, else the compressed entries' evidence verbatim.
  A compressor that does not shrink the memory leaves it over L_max (the snapshot shows the size).
- answerer: a missing `<think>` block is flagged; a missing `<answer>` uses `Team.answer_from`'s fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import Field

from searchteam.runtime.context import Context
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions, format_documents
from searchteam.teams.parsing import capped, flat, has_pair, last_tag, opened_tail, untagged, without_pairs
from searchteam.types import Message, Question, Record, Turn

DEFAULT_MEMORY_MAX_TOKENS = 4096
TOKENS_PER_WORD = 4 / 3
NO_EVIDENCE = "No relevant information."
STOP_QUERY = "none"
PLANNER_STOP = ("</search>",)
FILTER_STOP = ("</filter>",)
COMPRESSOR_STOP = ("</facts>",)
ANSWER_STOP = ("</answer>",)
# Room for the required `<think>…</think>` plus the role's tag: a planner or answerer think block of a few
# sentences and a query or short answer fit in 256; the filter's paragraph keeps every relevant fact of five
# ~100-word documents (Appendix A.2), so it gets 384. A cut-off reply would fail the format gate.
MAX_NEW_TOKENS = {"planner": 256, "filter": 384, "compressor": 128, "answerer": 256}
GATED_ROLES = ("planner", "filter", "answerer")  # format-gated and judged by the reward (reward.py)


class DecorRecord(Record):
    """What a turn records for the reward scheme (reward.py): a planner's query (None for STOP) and a
    filter's evidence."""

    query: str | None = None
    evidence: str | None = None


def approx_tokens(text: str) -> int:
    """Token estimate used for L_max: 4/3 per whitespace-separated word, rounded up."""
    return math.ceil(len(text.split()) * TOKENS_PER_WORD)


@dataclass(frozen=True)
class Entry:
    """One memory item: (q_search, e_t), or atomic facts condensed from earlier entries (query None)."""

    query: str | None
    evidence: str

    @property
    def tokens(self) -> int:
        return approx_tokens(self.query or "") + approx_tokens(self.evidence)


@dataclass(frozen=True)
class Memory:
    """The shared memory pool M_t and the query history q_<t (Algorithm 1, line 1)."""

    entries: tuple[Entry, ...] = field(default_factory=tuple)
    queries: tuple[str, ...] = field(default_factory=tuple)

    @property
    def tokens(self) -> int:
        return sum(e.tokens for e in self.entries)

    def add(self, entry: Entry) -> Memory:
        """M_t ← M_{t-1} ∪ {(q_search, e_t)} (line 16)."""
        return replace(self, entries=(*self.entries, entry))

    def asked(self, query: str) -> Memory:
        """q_t ← [q_{t-1}; q_search] (line 9)."""
        return replace(self, queries=(*self.queries, query))

    def condensed(self, facts: str) -> Memory:
        """Every current entry replaced by one entry of atomic facts (line 14)."""
        return replace(self, entries=(Entry(None, facts),))

    def text(self) -> str:
        """The "history search information" block the planner and the answerer read."""
        if not self.entries:
            return "(empty)"
        blocks = []
        for i, entry in enumerate(self.entries, 1):
            if entry.query is None:
                blocks.append(f"Facts from earlier searches:\n{entry.evidence}")
            else:
                blocks.append(f"Search {i}: {entry.query}\nResult: {entry.evidence}")
        return "\n".join(blocks)

    def query_text(self) -> str:
        return "; ".join(self.queries) if self.queries else "(none)"

    def as_dict(self) -> dict[str, Any]:
        return {
            "memory": [{"query": e.query, "evidence": e.evidence} for e in self.entries],
            "query_history": list(self.queries),
            "memory_tokens": self.tokens,
        }


@dataclass(frozen=True)
class PlannerAction:
    query: str | None
    error: str | None = None

    @property
    def stop(self) -> bool:
        return self.query is None


def parse_planner(text: str, memory_empty: bool, question: str) -> PlannerAction:
    """The `<search>` query, or STOP for `None` (fallbacks: module docstring)."""
    text = capped(text)
    found = last_tag(text, "search")
    query = flat(found or "")
    if query.lower().rstrip(".") == STOP_QUERY:
        return PlannerAction(None, _think_error(text))
    if not query:
        why = "missing <search> tag" if found is None else "empty <search> query"
        return PlannerAction(question if memory_empty else None, why)
    return PlannerAction(query, _think_error(text))


def parse_facts(text: str, verbatim: str) -> tuple[str, str | None]:
    """The compressor's `<facts>` lines; the error is None when the tag was there and not empty."""
    text = capped(text)
    found = last_tag(text, "facts")
    error = None if found else "missing <facts> tag" if found is None else "empty <facts> tag"
    if found is None:
        found = untagged(text)
    facts = "\n".join(line.strip() for line in found.splitlines() if line.strip())
    return facts or verbatim, error


def parse_tagged(text: str, tag: str, empty: str) -> tuple[str, str | None]:
    """`<tag>` content as one paragraph; the error is None when the reply was well formed."""
    text = capped(text)
    found = last_tag(text, tag)
    if found is not None:
        return flat(found) or empty, _think_error(text)
    unclosed = opened_tail(text, tag)
    if unclosed is not None:
        return flat(untagged(unclosed)) or empty, f"unclosed <{tag}> tag"
    return flat(untagged(without_pairs(text, "think"))) or empty, f"missing <{tag}> tag"


def _think_error(text: str) -> str | None:
    return None if has_pair(text, "think") else "missing <think> block"


class DECOR(GathersItsSearches, Team):
    name = "decor"
    description = (
        "DECOR: a planner that never sees raw documents, a filter that curates a memory pool, and an "
        "answerer that reads only the question and the memory; a frozen compressor keeps memory under L_max."
    )

    default_top_k = 5  # §5.1: "maximum search depth T_max = 4, the top-k retrieval per step k = 5"
    default_max_turns = 4
    roles = tuple(MAX_NEW_TOKENS)

    class Options(TeamOptions):
        memory_max_tokens: int = Field(
            DEFAULT_MEMORY_MAX_TOKENS, ge=1, description="memory size that compresses"
        )
        truncate_on_format_error: bool | None = Field(
            None, description="end at a format error; unset: in training"
        )

    options: Options

    @property
    def memory_max_tokens(self) -> int:
        return self.options.memory_max_tokens

    async def run(self, q: Question, ctx: Context) -> str:
        memory = Memory()  # line 1: M_0 ← ∅, q_0 ← ∅
        for t in range(1, self.settings.max_turns + 1):  # line 2
            ctx.step = t
            action = await self.plan(q, memory, ctx)  # lines 3-4: o_t^plan = {q, M_{t-1}, q_<t}
            if self.truncated(ctx):  # §4.3: a format violation ends the episode
                return ""
            if action.stop:  # lines 5-7
                break
            memory = memory.asked(action.query)  # lines 8-9
            docs = await ctx.search(action.query, k=self.settings.top_k)  # line 10
            evidence = await self.filter(action.query, format_documents(docs), ctx)  # lines 11-12
            if self.truncated(ctx):
                return ""
            entry = Entry(action.query, evidence)
            compressed = memory.tokens + entry.tokens > self.memory_max_tokens and bool(memory.entries)
            if compressed:  # lines 13-15
                memory = memory.condensed(await self.compress(memory, ctx))
            memory = memory.add(entry)  # line 16
            ctx.snapshot({**memory.as_dict(), "compressed": compressed})
        answer = await self.answer(q, memory, ctx)  # lines 20-22: o_T^ans = {q, M_T}
        return "" if self.truncated(ctx) else answer

    def truncated(self, ctx: Context) -> bool:
        """Whether the episode ends here: truncation is on and the last call, a planner, filter or answerer
        turn, broke the format (§4.3); records `episode.meta["truncated_at"]` when it does."""
        turn = ctx.episode.turns[-1]
        truncate = self.options.truncate_on_format_error
        if not (ctx.training if truncate is None else truncate):
            return False
        if turn.parsed_ok or turn.role not in GATED_ROLES:
            return False
        ctx.episode.meta["truncated_at"] = {"role": turn.role, "step": turn.step, "error": turn.parse_error}
        return True

    async def plan(self, q: Question, memory: Memory, ctx: Context) -> PlannerAction:
        messages = self.chat("planner", query=q.question, queries=memory.query_text(), memory=memory.text())
        turn = await self._call(ctx, "planner", messages, PLANNER_STOP)
        action = parse_planner(turn.completion, not memory.entries, q.question)
        if action.error:
            turn.flag_format_error(action.error)
        DecorRecord(query=action.query).write(turn)
        return action

    async def filter(self, query: str, documents: str, ctx: Context) -> str:
        messages = self.chat("filter", query=query, documents=documents or "(no documents)")
        turn = await self._call(ctx, "filter", messages, FILTER_STOP)
        evidence, error = parse_tagged(turn.completion, "filter", NO_EVIDENCE)
        if error:
            turn.flag_format_error(error)
        DecorRecord(evidence=evidence).write(turn)
        return evidence

    async def compress(self, memory: Memory, ctx: Context) -> str:
        """LLM.Summarize(M_{t-1}) by the frozen text-processing model."""
        turn = await self._call(
            ctx, "compressor", self.chat("compressor", memory=memory.text()), COMPRESSOR_STOP
        )
        turn.frozen = True
        facts, error = parse_facts(turn.completion, " ".join(e.evidence for e in memory.entries))
        if error:
            turn.flag_format_error(error)
        return facts

    async def answer(self, q: Question, memory: Memory, ctx: Context) -> str:
        turn = await self._call(
            ctx, "answerer", self.chat("answerer", query=q.question, memory=memory.text()), ANSWER_STOP
        )
        answer = self.answer_from(turn)
        if turn.parsed_ok and (error := _think_error(turn.completion)):
            turn.flag_format_error(error)
        return answer

    @staticmethod
    async def _call(ctx: Context, role: str, messages: list[Message], stop: tuple[str, ...]) -> Turn:
        return await ctx.llm(role, messages, stop=stop, max_new_tokens=MAX_NEW_TOKENS[role])
