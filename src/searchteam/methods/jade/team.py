"""JADE: a planner orchestrates a dynamic workflow of executors, round by round (Chen et al., JADE).

Global state (§3.1, Eq. 1-2): the original question plus an execution trace of nodes (sub-query, answer,
status). Algorithm 1: each round takes the first unsolved node; the `planner` sees only that node's query
and writes `<workflow>…</workflow>` over {QR, QDS, QDP, R, DS, AG} (Appendix E.1). Then either
- decomposition (`qds` serial / `qdp` parallel, `<q1>…</q1>` … at most 4) inserts the sub-questions
  after the node as new unsolved nodes, and the node is marked decomposed (Alg. 1 lines 15-17); or
- solving runs the executors in order (lines 18-22): `qr` rewrites the search query (`<query>`), R
  retrieves top-k for it, `ds` keeps documents by id (`<id>`), `ag` answers the node (`<answer>`).
After the last round `as` synthesizes the final answer from the trace (line 32); when the root question
was solved directly there is nothing to synthesize and its answer is returned, as in Appendix F case 2.

Serial sub-questions depend on earlier answers (Table 1). As in Appendix F case 1 ("What is the heritage
of this actor?" → "Heritage of Fred Astaire"), before such a node is planned a `qr` turn rewrites it with
the answered questions that precede it in its group (Eq. 3's Select: "a Query Rewriter may access resolved
answers in s_t to resolve coreferences"). Parallel sub-questions are planned as written.

Knobs: `settings.max_turns` caps the rounds (Alg. 1 line 27; the paper normalizes its cost terms by a limit
of 3), `settings.top_k` passages per retrieval. Episode meta gets `jade_rounds` and `jade_retrievals`
(N_rnd and N_ret of the cost reward, Eq. 6). Each round snapshots the workflow and the whole trace.

Option `workflow` (an ablation, not in the paper's method): a fixed solving workflow such as "R, AG" that
replaces the planner in every round, to measure what the learned workflows add over a static pipeline of
the same executors. Option `decomposition: given` (an ablation, not in the paper): a question that
carries its own sub-questions (question-file fields `subquestions`, a list, and `subquestion_mode`,
"parallel" by default or "serial") starts from that decomposition instead of the planner's first round,
e.g. to measure the rest of the team under a perfect decomposer (`experiments/template_decompositions.py`
writes such files); a question without `subquestions` is planned as usual. Episode meta `jade_given`
says which.

Fallbacks (each flags a format error on that turn, never raises):
- planner: a missing tag, an unknown executor, or a workflow breaking the prompt's rules (QDS/QDP alone;
  R before DS; AG last and only last) runs R → AG.
- qds/qdp: no `<qN>` sub-question solves the node with R → AG in the same round; more than 4 keeps 4.
- qr: no `<query>` keeps the current query. ds: see `selectors.parse_selection` (valid ids, else all).
- ag/as: `Team.answer_from`'s fallback.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Literal

from pydantic import Field, field_validator

from searchteam.errors import DataError
from searchteam.runtime.context import Context
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions, TeamSettings
from searchteam.teams.parsing import capped, last_tag, tag_pairs
from searchteam.teams.selectors import (
    ANSWER_STOP,
    ID_STOP,
    apply_selection,
    numbered_documents,
    selection_fields,
    selection_tokens,
)
from searchteam.types import Passage, Question, Record

EXECUTORS = ("QR", "QDS", "QDP", "R", "DS", "AG")
ALIASES = {"RA": "R"}  # Table 1 calls the retriever RA, the planner prompt calls it R
DECOMPOSERS = ("QDS", "QDP")
FALLBACK_WORKFLOW = ("R", "AG")
MAX_SUBQUESTIONS = 4  # Appendix E.3/E.4: "max 4"


class JadeRecord(Record):
    """What an episode records for the reward scheme (reward.py): T, the planning rounds, and N_ret, the
    retrievals (Eq. 6)."""

    jade_rounds: int | None = None
    jade_retrievals: int | None = None


@dataclass(frozen=True)
class Workflow:
    steps: tuple[str, ...]
    ok: bool
    error: str | None = None

    @property
    def decomposes(self) -> bool:
        return self.steps[0] in DECOMPOSERS


def parse_workflow(text: str) -> Workflow:
    """The planner's `<workflow>` checked against the rules of its prompt (Appendix E.1)."""
    found = last_tag(capped(text), "workflow")
    if found is None:
        return Workflow(FALLBACK_WORKFLOW, ok=False, error="missing <workflow> tag")
    steps = tuple(ALIASES.get(s, s) for s in re.split(r"[\s,;>→\-]+", found.upper()) if s)
    error = workflow_error(steps)
    return Workflow(FALLBACK_WORKFLOW, ok=False, error=error) if error else Workflow(steps, ok=True)


def workflow_error(steps: tuple[str, ...]) -> str | None:
    if not steps:
        return "empty workflow"
    unknown = [s for s in steps if s not in EXECUTORS]
    if unknown:
        return f"unknown executors {unknown}"
    if any(s in DECOMPOSERS for s in steps):
        return None if len(steps) == 1 else "QDS/QDP must be the only executor"
    if steps[-1] != "AG" or steps.count("AG") > 1:
        return "AG must be the last executor and appear once"
    if "DS" in steps and ("R" not in steps or steps.index("R") > steps.index("DS")):
        return "R must appear before DS"
    return None


def fixed_workflow(text: str | None) -> tuple[str, ...] | None:
    """The `workflow` option as executor steps; a decomposer or a workflow breaking the planner's rules is
    refused (a fixed decomposition would decompose its own sub-questions until the round limit)."""
    if text is None:
        return None
    workflow = parse_workflow(f"<workflow>{text}</workflow>")
    if not workflow.ok or workflow.decomposes:
        reason = workflow.error or "a fixed workflow cannot decompose"
        raise ValueError(
            f"jade option 'workflow' must be a solving workflow such as 'R, AG': {text!r} ({reason})"
        )
    return workflow.steps


def parse_subquestions(text: str) -> list[str]:
    """`<q1>…</q1>`, `<q2>…</q2>` … contents in order, without empty or repeated ones."""
    found = (pair.content.strip() for pair in tag_pairs(text, ("q",), numbered=True))
    return list(dict.fromkeys(s for s in found if s))


@dataclass
class Node:
    """n_m = <q_m, a_m> (Eq. 2), with its place in the decomposition tree."""

    id: int
    question: str
    parent: int | None = None
    mode: str = "root"  # root | serial | parallel
    status: str = "pending"  # pending | solved | decomposed
    answer: str | None = None
    asked: str = ""  # the decomposer's wording, when a serial rewrite resolved it


@dataclass
class Trace:
    """The dynamic execution trace T_t: an ordered list of nodes that grows by decomposition."""

    nodes: list[Node] = field(default_factory=list)

    @classmethod
    def start(cls, question: str) -> Trace:
        return cls([Node(0, question)])

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def first_unsolved(self) -> Node | None:
        return next((n for n in self.nodes if n.status == "pending"), None)

    def expand(self, node: Node, questions: list[str], mode: str) -> None:
        """Insert the sub-questions right after `node`, so a serial chain is solved before what follows it."""
        at = self.nodes.index(node) + 1
        new_id = max(n.id for n in self.nodes) + 1
        self.nodes[at:at] = [Node(new_id + i, q, node.id, mode) for i, q in enumerate(questions)]
        node.status = "decomposed"

    def earlier_answers(self, node: Node) -> list[Node]:
        """Solved nodes before `node` that descend from the same parent (its serial predecessors)."""
        before = self.nodes[: self.nodes.index(node)]
        return [n for n in before if n.status == "solved" and self.descends_from(n, node.parent)]

    def descends_from(self, node: Node, ancestor: int | None) -> bool:
        by_id = {n.id: n for n in self.nodes}
        parent = node.parent
        while parent is not None:
            if parent == ancestor:
                return True
            parent = by_id[parent].parent
        return False

    def as_dicts(self) -> list[dict]:
        return [asdict(n) for n in self.nodes]


def qa_lines(nodes: list[Node]) -> str:
    return "\n".join(
        f"Sub-question {i}: {n.question}\nAnswer {i}: {n.answer or '(no answer)'}"
        for i, n in enumerate(nodes, 1)
    )


def given_subquestions(q: Question) -> tuple[list[str], str] | None:
    """The question file's own decomposition (`subquestions`, `subquestion_mode`), if it has one."""
    questions = q.meta.get("subquestions")
    if questions is None:
        return None
    mode = q.meta.get("subquestion_mode", "parallel")
    if not (isinstance(questions, list) and questions and all(isinstance(s, str) and s for s in questions)):
        raise DataError(f"question {q.id}: 'subquestions' must be a non-empty list of non-empty strings")
    if mode not in ("parallel", "serial"):
        raise DataError(f"question {q.id}: 'subquestion_mode' must be 'parallel' or 'serial', not {mode!r}")
    return questions[:MAX_SUBQUESTIONS], mode


class Jade(GathersItsSearches, Team):
    name = "jade"
    description = (
        "JADE: a planner builds a workflow per sub-query (rewrite, decompose, retrieve, select, answer)."
    )
    roles = ("planner", "qr", "qds", "qdp", "ds", "ag", "as")

    class Options(TeamOptions):
        workflow: str | None = Field(
            None,
            description="a fixed solving workflow such as `R, AG` run in every round instead of the "
            "planner's (an ablation); unset: the planner's",
        )
        decomposition: Literal["planner", "given"] = Field(
            "planner",
            description="given: a question with its own `subquestions` (question-file field) starts from "
            "them instead of the planner's first round (an ablation)",
        )

        @field_validator("workflow")
        @classmethod
        def _solving_workflow(cls, value: str | None) -> str | None:
            fixed_workflow(value)  # raises with the reason the workflow cannot solve a node
            return value

    options: Options

    def __init__(self, settings: TeamSettings | None = None) -> None:
        super().__init__(settings)
        self.fixed_workflow = fixed_workflow(self.options.workflow)
        self.decomposition = self.options.decomposition

    async def run(self, q: Question, ctx: Context) -> str:
        trace = Trace.start(q.question)  # Alg. 1 lines 2-3
        given = given_subquestions(q) if self.decomposition == "given" else None
        if given:
            trace.expand(trace.root, *given)
        rounds = retrievals = 0
        while (node := trace.first_unsolved()) and rounds < self.settings.max_turns:  # lines 4, 27
            ctx.step = rounds
            rounds += 1
            workflow, searched = await self.round(node, trace, ctx)
            retrievals += searched
            ctx.snapshot(
                {"round": rounds, "target": node.id, "workflow": list(workflow), "trace": trace.as_dicts()}
            )
        JadeRecord(jade_rounds=rounds, jade_retrievals=retrievals).write(ctx.episode)
        if self.decomposition == "given":
            ctx.episode.meta["jade_given"] = given is not None
        ctx.step = rounds
        if trace.root.status == "solved":
            return trace.root.answer or ""
        return await self.summarize(trace, ctx)  # line 32

    async def round(self, node: Node, trace: Trace, ctx: Context) -> tuple[tuple[str, ...], int]:
        """One round on the target node; returns the workflow run and the number of retrievals."""
        if node.mode == "serial" and (known := trace.earlier_answers(node)):
            await self.resolve(node, known, ctx)
        if self.fixed_workflow:
            return self.fixed_workflow, await self.run_executors(node, self.fixed_workflow, ctx)
        # Phase 1 (lines 7-9): the planner sees only the target query.
        plan = await ctx.llm(
            "planner", self.chat("planner", question=node.question), stop=("</workflow>",), max_new_tokens=16
        )
        workflow = parse_workflow(plan.completion)
        if not workflow.ok:
            plan.flag_format_error(workflow.error or "invalid workflow")
        # Phase 2 (lines 12-23): decomposition expands the trace, solving answers the node.
        if workflow.decomposes:
            if await self.decompose(node, workflow.steps[0], trace, ctx):
                return workflow.steps, 0
            return FALLBACK_WORKFLOW, await self.run_executors(node, FALLBACK_WORKFLOW, ctx)
        return workflow.steps, await self.run_executors(node, workflow.steps, ctx)

    async def resolve(self, node: Node, known: list[Node], ctx: Context) -> None:
        """Rewrite a serial sub-question with the answers it depends on (Appendix F case 1)."""
        turn = await ctx.llm(
            "qr",
            self.chat("qr_serial", question=node.question, earlier=qa_lines(known)),
            stop=("</query>",),
            max_new_tokens=48,
        )
        rewritten = last_tag(turn.completion, "query")
        if not rewritten:
            turn.flag_format_error("missing <query> tag")
            return
        node.asked, node.question = node.question, rewritten

    async def decompose(self, node: Node, executor: str, trace: Trace, ctx: Context) -> bool:
        """QDS/QDP: append sub-nodes (lines 15-17). False when no sub-question could be read."""
        role = executor.lower()
        turn = await ctx.llm(
            role, self.chat(role, question=node.question), stop=("</q4>",), max_new_tokens=96
        )
        questions = parse_subquestions(turn.completion)
        if not questions:
            turn.flag_format_error("no <q1>...</q1> sub-question; solving with R -> AG")
            return False
        if len(questions) > MAX_SUBQUESTIONS:
            turn.flag_format_error(f"{len(questions)} sub-questions, at most {MAX_SUBQUESTIONS} allowed")
        trace.expand(node, questions[:MAX_SUBQUESTIONS], "serial" if executor == "QDS" else "parallel")
        return True

    async def run_executors(self, node: Node, steps: tuple[str, ...], ctx: Context) -> int:
        """Run the solving executors in order on an intra-round context (lines 18-22)."""
        query, searched = node.question, 0
        docs: list[Passage] = []
        for step in steps:
            if step == "QR":
                query = await self.rewrite(query, ctx)
            elif step == "R":
                docs = await ctx.search(query, self.settings.top_k)
                searched += 1
            elif step == "DS":
                docs = await self.select(node.question, docs, ctx)
            elif step == "AG":
                node.answer = await self.generate(node.question, docs, ctx)
                node.status = "solved"
        return searched

    async def rewrite(self, query: str, ctx: Context) -> str:
        turn = await ctx.llm("qr", self.chat("qr", question=query), stop=("</query>",), max_new_tokens=48)
        rewritten = last_tag(turn.completion, "query")
        if not rewritten:
            turn.flag_format_error("missing <query> tag")
        return rewritten or query

    async def select(self, question: str, docs: list[Passage], ctx: Context) -> list[Passage]:
        turn = await ctx.llm(
            "ds",
            self.chat("ds", question=question, **selection_fields(docs)),
            stop=ID_STOP,
            max_new_tokens=selection_tokens(len(docs)),
        )
        return apply_selection(turn, docs)

    async def generate(self, question: str, docs: list[Passage], ctx: Context) -> str:
        prompt = self.chat("ag", question=question, documents=numbered_documents(docs))
        return self.answer_from(await ctx.llm("ag", prompt, stop=ANSWER_STOP, max_new_tokens=48))

    async def summarize(self, trace: Trace, ctx: Context) -> str:
        """AS: the final answer to Q_origin from the sub-questions and their answers (Appendix E.7)."""
        answered = [n for n in trace.nodes[1:] if n.status != "decomposed"]
        prompt = self.chat("as", question=trace.root.question, observation=qa_lines(answered))
        return self.answer_from(await ctx.llm("as", prompt, stop=ANSWER_STOP, max_new_tokens=48))
