"""M-ASK: five agents share a structured knowledge state (Chen et al., M-ASK §3, Algorithm 1 in Appendix F).

The knowledge state K_t = {question, thinking_trajectory [(sub-query, sub-answer)], predicted_answer}
(Eq. 1, Table 5) is the only thing the agents pass to each other:

1. `plan` (Planning Agent) writes K_0 from parametric memory: `<q1>…</q1><a1>…</a1>…<predicted_answer>`.
2. For t = 1..T_max (`settings.max_turns`):
   - `search` (Search Agent) reads the question, the trajectory and its own search history (past queries
     and their evidence, Appendix C.2) and writes `<search>q</search>` or `<end>`; `<end>` stops the loop;
   - the retriever returns the top-k documents (`settings.top_k`) for q;
   - `summary` (Summary Agent) turns (q, documents) into `<evidence>…</evidence>`;
   - `update` (Update Agent) reads the question, the trajectory, q and the evidence (C.4's user template, the
     same in training and at inference) and writes `<Update>ti</Update>` (replace step i with (q, evidence):
     in-place refinement) or `<Add>t(n+1)</Add>` (append (q, evidence));
   - in training mode (`ctx.training`) `answer` runs on the new state as the intermediate evaluator of
     §3.3: its a_t is stored as the state's predicted answer, on the turn (`meta["predicted_answer"]`,
     `meta["turn"]`) and in the snapshot, so ΔF1 = F1(a_t) − F1(a_{t−1}) (Eq. 3) can be computed later.
3. `answer` (Answer Agent) writes `<predicted_answer>` from the final state, once (§3.2.3). In training
   mode this final call is skipped when the last turn already answered the same state.

Steps: `plan` runs at step 0, turn t at step t; the final answer keeps the step of the last turn. Turn meta:
`plan` has `predicted_answer` (a_0); `search` has `action` ("search" | "end") and `query`; `summary` has
`evidence`; `update` has `op` and `op_index`; `answer` has `predicted_answer`, `turn` (t for a training-time
evaluation, None for the final answer) and `final`.
The state is snapshotted after the plan and after every turn (trajectory, predicted answer, search
history, operation), and once more after the final answer.

No method-specific options: T_max = `settings.max_turns`, k = `settings.top_k`.

Fallbacks (each flags a format error on the turn, never raises):
- plan: no `<qi>` tag → one step (question, "unknown"), the case-study shape of K_0 (Table 6, Init);
  a `<qi>` without its `<ai>` → that sub-answer is "unknown"; no `<predicted_answer>` → the text after an
  unclosed tag, else the last known sub-answer, else "unknown".
- search: neither `<search>q</search>` nor `<end>` (or an empty query) → search the original question if
  nothing was searched yet, otherwise end the loop.
- summary: no `<evidence>` → the text after an unclosed tag, else the whole reply; tags removed either way;
  if nothing is left, "No useful information".
- update: no `<Update>`/`<Add>` tag, or an `<Update>` whose step does not exist → Add (the evidence is kept).
- answer: the reply is prefilled with `<predicted_answer>`; no closing tag → `Team.answer_from`'s fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import Field

from searchteam.runtime.context import Context
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions, format_documents
from searchteam.teams.parsing import capped, flat, last_tag, opened_tail, small_int, tag_pairs, untagged
from searchteam.teams.transcript import dedupe
from searchteam.types import Message, Question, Record, Turn

UNKNOWN = "unknown"
NO_EVIDENCE = "No useful information"
PLAN_STOP = ("</predicted_answer>",)
SEARCH_STOP = ("</search>", "<end>")
SUMMARY_STOP = ("</evidence>",)
UPDATE_STOP = ("</Update>", "</Add>", "</update>", "</add>")
ANSWER_STOP = ("</predicted_answer>",)
# The answer agent's reply is prefilled with its tag, as in the single-call baselines: without it the 135M
# default model answers with a sentence half the time, which the F1-based rewards of §3.3 score near zero.
ANSWER_OPEN = "<predicted_answer>"
MAX_NEW_TOKENS = {"plan": 128, "search": 32, "summary": 64, "update": 12, "answer": 24}
END_ACTION = "end"


class MaskRecord(Record):
    """What a turn records for the reward scheme (reward.py): a_t of a plan or answer turn, the turn t an
    answer call evaluated (None for the final answer), and a search turn's action ("search" or END_ACTION)."""

    predicted_answer: str | None = None
    turn: int | None = None
    action: str | None = None


# `<end>`, `</end>`, `<end/>`, spaces allowed; each optional slash takes its own spaces, so the pattern never
# tries two ways to split one run of spaces (`\s*/?\s*` does, quadratic in the run).
END = re.compile(r"<\s*(?:/\s*)?end\s*(?:/\s*)?>", re.IGNORECASE)


@dataclass(frozen=True)
class Step:
    """τ_i = ⟨sub-query, sub-answer (evidence)⟩."""

    query: str
    answer: str


@dataclass(frozen=True)
class Operation:
    """The Update Agent's action: replace step `index` (1-based) in place, or append a step."""

    kind: Literal["update", "add"]
    index: int | None = None


@dataclass(frozen=True)
class KnowledgeState:
    """K_t of Eq. 1, plus the search history the Search Agent sees (Appendix C.2)."""

    question: str
    trajectory: tuple[Step, ...]
    predicted_answer: str
    history: tuple[Step, ...] = field(default_factory=tuple)

    def apply(self, op: Operation, query: str, evidence: str) -> KnowledgeState:
        """K_{t+1}: step i replaced by (query, evidence) for Update, (query, evidence) appended for Add."""
        new = Step(query, evidence)
        if op.kind == "update" and op.index is not None and 1 <= op.index <= len(self.trajectory):
            steps = list(self.trajectory)
            steps[op.index - 1] = new
            return replace(self, trajectory=tuple(steps))
        return replace(self, trajectory=(*self.trajectory, new))

    def searched(self, query: str, evidence: str) -> KnowledgeState:
        return replace(self, history=(*self.history, Step(query, evidence)))

    def answered(self, answer: str) -> KnowledgeState:
        return replace(self, predicted_answer=answer)

    def trajectory_text(self) -> str:
        return "\n".join(f"t{i}. Q: {s.query} A: {s.answer}" for i, s in enumerate(self.trajectory, 1))

    def history_text(self) -> str:
        if not self.history:
            return "(empty)"
        return "\n".join(f"{i}. Query: {s.query} Summary: {s.answer}" for i, s in enumerate(self.history, 1))

    def as_dict(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "thinking_trajectory": [{"query": s.query, "answer": s.answer} for s in self.trajectory],
            "predicted_answer": self.predicted_answer,
            "search_history": [{"query": s.query, "evidence": s.answer} for s in self.history],
        }


@dataclass(frozen=True)
class SearchAction:
    query: str | None
    ok: bool
    error: str | None = None

    @property
    def end(self) -> bool:
        return self.query is None


@dataclass(frozen=True)
class Plan:
    state: KnowledgeState
    errors: list[str]


def parse_plan(text: str, question: str) -> Plan:
    """K_0 from `<q1>…</q1><a1>…</a1>…<predicted_answer>…</predicted_answer>` (fallbacks: see module).

    Reads the capped text (`parsing.capped`) in one pass per tag family: `<qN>` pairs, then `<aN>` pairs
    (the last `<aN>` answers `<qN>`; sub-question and sub-answer tags do not nest in one another)."""
    text = capped(text)
    errors: list[str] = []
    answers = {pair.number: flat(pair.content) for pair in tag_pairs(text, ("a",), numbered=True)}
    steps = []
    for pair in tag_pairs(text, ("q",), numbered=True):
        answer = answers.get(pair.number)
        if answer is None:
            errors.append(f"missing <a{pair.number}>")
        steps.append(Step(flat(pair.content), answer or UNKNOWN))
    if not steps:
        errors.append("no <q1>/<a1> sub-questions")
        steps = [Step(question, UNKNOWN)]
    predicted = last_tag(text, "predicted_answer")
    if predicted is None:
        errors.append("missing <predicted_answer>")
        unclosed = opened_tail(text, "predicted_answer")
        known = [s.answer for s in steps if s.answer.lower() != UNKNOWN]
        predicted = (unclosed and flat(unclosed)) or (known[-1] if known else UNKNOWN)
    return Plan(KnowledgeState(question, tuple(steps), flat(predicted)), errors)


def parse_search(text: str, searched_before: bool, question: str) -> SearchAction:
    """`<search>q</search>` or `<end>`, whichever comes first (fallbacks: module docstring)."""
    text = capped(text)
    query = last_tag(text, "search")
    if query and flat(query):
        return SearchAction(flat(query), ok=True)
    if query is None and END.search(text):
        return SearchAction(None, ok=True)
    why = "empty <search> query" if query is not None else "neither <search> nor <end>"
    return SearchAction(None if searched_before else question, ok=False, error=why)


def parse_operation(text: str, n_steps: int) -> tuple[Operation, str | None]:
    """`<Update>ti</Update>` or `<Add>t(n+1)</Add>`; the error is None when the output was valid."""
    found = next(tag_pairs(text, ("update", "add")), None)
    if found is None:
        return Operation("add"), "neither <Update> nor <Add>"
    if found.name == "add":
        return Operation("add"), None
    number = re.search(r"\d+", found.content)
    if number is None:
        return Operation("add"), f"<Update> without a step number: {found.content!r}"
    index = small_int(number.group())
    if index is None or not 1 <= index <= n_steps:
        step = number.group() if index is None else index
        return Operation("add"), f"<Update> of step t{step}, but the trajectory has t1..t{n_steps}"
    return Operation("update", index), None


def parse_evidence(text: str) -> tuple[str, str | None]:
    """The `<evidence>` content; the error is None when the tag was there."""
    text = capped(text)
    found = last_tag(text, "evidence")
    if found is not None:
        return flat(found) or NO_EVIDENCE, None
    unclosed = opened_tail(text, "evidence")
    if unclosed is not None:
        return flat(untagged(unclosed)) or NO_EVIDENCE, "unclosed <evidence> tag"
    return flat(untagged(text)) or NO_EVIDENCE, "missing <evidence> tag"


class MASK(GathersItsSearches, Team):
    name = "mask"
    description = (
        "M-ASK: planning, search, summary, update and answer agents over a structured knowledge state "
        "(question, sub-query/sub-answer trajectory, predicted answer)."
    )
    default_top_k = 5  # Table 6: each search "retrieved 5 document fragments"
    roles = tuple(MAX_NEW_TOKENS)

    class Options(TeamOptions):
        answer_reads: Literal["trajectory", "passages"] = Field(
            "trajectory",
            description="what the Answer Agent reads: the thinking trajectory (the paper), or the trajectory "
            "and every passage the episode retrieved",
        )

    options: Options

    async def run(self, q: Question, ctx: Context) -> str:
        # Phase I (Algorithm 1, line 7): K_0 from parametric memory.
        ctx.step = 0
        state = await self.plan(q, ctx)
        needs_answer = True
        # Phase II (lines 12-34): the Search Agent drives the loop until <end> or T_max.
        for t in range(1, self.settings.max_turns + 1):
            ctx.step = t
            action = await self.search(state, ctx)
            if action.end:
                break
            docs = await ctx.search(action.query, k=self.settings.top_k)
            evidence = await self.summarize(action.query, format_documents(docs), ctx)
            op = await self.update(state, action.query, evidence, ctx)
            state = state.apply(op, action.query, evidence).searched(action.query, evidence)
            if ctx.training:
                # §3.3: during training the Answer Agent evaluates every turn (a_t for ΔF1, line 25).
                state = state.answered(await self.answer(state, ctx, turn=t))
            needs_answer = not ctx.training
            ctx.snapshot({**state.as_dict(), "turn": t, "op": op.kind, "op_index": op.index})
        if needs_answer:
            # §3.2.3: at inference the Answer Agent runs once, on the final state.
            state = state.answered(await self.answer(state, ctx, turn=None))
            ctx.snapshot({**state.as_dict(), "final": True})
        return state.predicted_answer

    async def plan(self, q: Question, ctx: Context) -> KnowledgeState:
        turn = await self._call(ctx, "plan", self.chat("plan", query=q.question), PLAN_STOP)
        plan = parse_plan(turn.completion, q.question)
        if plan.errors:
            turn.flag_format_error("; ".join(plan.errors))
        MaskRecord(predicted_answer=plan.state.predicted_answer).write(turn)
        ctx.snapshot({**plan.state.as_dict(), "turn": 0})
        return plan.state

    async def search(self, state: KnowledgeState, ctx: Context) -> SearchAction:
        messages = self.chat(
            "search",
            question=state.question,
            trajectory=state.trajectory_text(),
            history=state.history_text(),
        )
        turn = await self._call(ctx, "search", messages, SEARCH_STOP)
        action = parse_search(turn.completion, bool(state.history), state.question)
        if not action.ok:
            turn.flag_format_error(action.error or "bad search action")
        MaskRecord(action=END_ACTION if action.end else "search").write(turn)
        turn.meta["query"] = action.query
        return action

    async def summarize(self, query: str, documents: str, ctx: Context) -> str:
        messages = self.chat("summary", query=query, documents=documents or "(no documents)")
        turn = await self._call(ctx, "summary", messages, SUMMARY_STOP)
        evidence, error = parse_evidence(turn.completion)
        if error:
            turn.flag_format_error(error)
        turn.meta["evidence"] = evidence
        return evidence

    async def update(self, state: KnowledgeState, query: str, evidence: str, ctx: Context) -> Operation:
        messages = self.chat(
            "update",
            question=state.question,
            trajectory=state.trajectory_text(),
            query=query,
            evidence=evidence,
            n=str(len(state.trajectory)),
            next=str(len(state.trajectory) + 1),
        )
        turn = await self._call(ctx, "update", messages, UPDATE_STOP)
        op, error = parse_operation(turn.completion, len(state.trajectory))
        if error:
            turn.flag_format_error(error)
        turn.meta.update(op=op.kind, op_index=op.index)
        return op

    async def answer(self, state: KnowledgeState, ctx: Context, turn: int | None) -> str:
        fields = {"question": state.question, "trajectory": state.trajectory_text()}
        if self.options.answer_reads == "passages":
            documents = format_documents(dedupe(ctx.episode.passages))
            messages = self.chat("answer_passages", documents=documents, **fields)
        else:
            messages = self.chat("answer", **fields)
        call = await self._call(ctx, "answer", messages, ANSWER_STOP, continuation=ANSWER_OPEN)
        answer = self.answer_from(call, tag="predicted_answer", prefill=ANSWER_OPEN)
        MaskRecord(turn=turn, predicted_answer=answer).write(call)
        call.meta["final"] = turn is None
        return answer

    @staticmethod
    async def _call(
        ctx: Context, role: str, messages: list[Message], stop: tuple[str, ...], continuation: str = ""
    ) -> Turn:
        return await ctx.llm(
            role, messages, stop=stop, max_new_tokens=MAX_NEW_TOKENS[role], continuation=continuation
        )
