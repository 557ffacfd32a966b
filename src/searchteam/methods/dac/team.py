"""DAC, Divide and Cooperate: a searcher that gathers evidence and a generator that answers from it.

§3.1 decomposes agentic search into two agents: the searcher S observes the question Q and the evidence so
far, issues a query or stops (steps 2-4); the generator G answers from Q and the aggregated evidence
E = ∪_t E_t (step 5). §4.1 serializes the searcher as Search-R1 does, one growing reply of
`<think>…</think><search>…</search><information>…</information>` segments ended by `<stop>`, with at most
four searches of the top-3 passages each; the information blocks are environment outputs masked out of
the loss, so the reply is a `Transcript` (`turn.env_spans`). Following §4, the generator receives
only the retrieved documents as evidence (deduplicated, first-seen order), not the searcher's reasoning.

Abstention (§3.2): the generator may answer `unknown` when the evidence is insufficient. It is on in
training and off at test time (§4.2), and the two generator prompts differ exactly by that instruction
(Appendix E, Prompts 2 and 3). `episode.meta["abstention"]` records whether it was on and
`episode.meta["abstained"]` whether the generator abstained, for the cross-verification rewards (Eq. 1-2).

Training only (`ctx.training`; each can be switched by an option), two extra kinds of generator call:
- Turn-level difference rewards (§3.4): after search t the generator runs on the partial evidence E≤t as if
  it were final (same prompt, abstention as above), and its abstention is recorded on the searcher turn of
  search t as `meta["partial_abstained"]`, from which the reward scheme computes
  s(t) = r_S(Q, E≤t, G(Q, E≤t)) and r_t = s(t) − s(t−1). These probe calls are not trained: role `generator`
  with `turn.frozen`, `meta["probe"] = True` and `meta["evidence_step"] = t`. A probe of E≤t runs
  only once the searcher issues another search (just before it is retrieved); for the last search, E≤T = E
  and the final generator call is G(Q, E≤T), so its abstention is recorded there instead of a duplicate call.
- Hard-positive augmentation (§3.3, Appendix B.1): when E is sufficient (the external verifier of
  Appendix B.1: a passage of E contains a gold answer, so it reads the training question's gold answers),
  the top-15 passages for the original question are retrieved, those already in E removed, and three of the
  rest selected in reverse rank order (lowest-ranked first) as distractors E_N; the generator then answers
  from E′ = E followed by E_N. That turn is trained but does not change the episode's answer: role
  `generator` with `meta["hard_positive"] = True`, `turn.subgroup = "hard_positive"` (its own GRPO group),
  `meta["answer"]` (the parsed answer) and `meta["abstained"]`. Without any distractor left, no call is made.
  Its retrieval is recorded at the generator's step, after every searcher step, so it never counts toward
  the searcher's sufficiency.

Roles: `searcher`, `generator`. One shared model at inference, unless the run gives a role its own
(`role_models`); a trainer can serve each role with its own LoRA adapter, as DAC trains one adapter per role
(§4.1, Appendix B.1).

Settings: `top_k` passages per search and `max_turns` searcher calls (paper defaults 3 and 4). Options
(bools): `abstain`, `difference_rewards`, `hard_positives` (each default: on when `ctx.training`).

Steps: searcher call t runs at step t; the generator, and any hard-positive retrieval, at the step after.

Fallbacks (flagged with `flag_format_error`, never raised):
- a searcher output with neither `<search>…</search>` nor `<stop>`: Search-R1's invalid-action observation
  (worded for `<stop>`) is appended and the call counts against `max_turns`, as Search-R1 counts it;
- a generator output without a closed answer tag: `parse_answer`'s fallback;
- `unknown` while abstention is off: not accepted; flagged and the answer is empty.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from searchteam.metrics import sufficiency
from searchteam.runtime.context import Context
from searchteam.teams.base import Team, TeamOptions, format_documents
from searchteam.teams.parsing import capped, parse_answer, tag_pairs
from searchteam.teams.transcript import Transcript, dedupe, information_block
from searchteam.types import Passage, Question, Record, Turn

SEARCHER_STOP = ("</search>", "<stop>")
GENERATOR_STOP = ("</answer>",)
SEARCHER_TOKENS = 128
GENERATOR_TOKENS = 128
ABSTENTION = "unknown"
HARD_POSITIVE_POOL = 15  # Appendix B.1: "we retrieve the top-15 passages using the original question"
HARD_POSITIVE_DISTRACTORS = 3

HARD_POSITIVE = "hard_positive"  # the subgroup of a hard-positive generator turn


class DacEpisodeRecord(Record):
    """What an episode records for the reward scheme (reward.py): whether the generator abstained."""

    abstained: bool = False


class DacTurnRecord(Record):
    """What a turn records for the reward scheme. Searcher turns: whether G(Q, E≤t) abstained
    (`partial_abstained`), or R(E≤t) itself (`partial_reward`, not written here). Generator turns: a
    hard-positive input (`hard_positive`), its parsed `answer` and whether it `abstained`."""

    partial_abstained: bool | None = None
    partial_reward: float | None = None
    hard_positive: bool = False
    answer: str | None = None
    abstained: bool | None = None


STOP_TAG = re.compile(r"<stop>", re.IGNORECASE)


@dataclass(frozen=True)
class SearcherAction:
    kind: Literal["search", "stop", "invalid"]
    query: str = ""
    error: str | None = None


def parse_searcher(completion: str) -> SearcherAction:
    """The first `<search>…</search>` or `<stop>` decides (the stop strings end the call at either)."""
    completion = capped(completion)
    search = next(tag_pairs(completion, ("search",)), None)
    stop = STOP_TAG.search(completion)
    if search is None and stop is None:
        return SearcherAction("invalid", error="neither <search>…</search> nor <stop>")
    if search is None or (stop is not None and stop.start() < search.start):
        return SearcherAction("stop")
    query = search.content.strip()
    return SearcherAction("search", query) if query else SearcherAction("invalid", error="empty <search> tag")


def is_abstention(answer: str) -> bool:
    return re.sub(r"[^a-z]", "", answer.lower()) == ABSTENTION


class DAC(Team):
    name = "dac"
    description = (
        "DAC: a searcher collects evidence (Search-R1 style, <stop> to end), a generator answers from it."
    )
    default_top_k = 3  # §4.1: at most four searches of the top-3 passages each
    default_max_turns = 4
    roles = ("searcher", "generator")
    gatherer_roles = ("searcher",)
    reader_roles = ("generator",)

    class Options(TeamOptions):
        """Training-only feature switches: unset, each is on in training and off at inference."""

        abstain: bool | None = Field(None, description="§3.2 abstention ('unknown') allowed")
        difference_rewards: bool | None = Field(None, description="§3.4 generator probes on partial evidence")
        hard_positives: bool | None = Field(None, description="§3.3 hard-positive generator inputs")

    options: Options

    def option(self, key: str, ctx: Context) -> bool:
        """A training-only feature switch: on in training unless the options say otherwise."""
        value = getattr(self.options, key)
        return ctx.training if value is None else value

    async def run(self, q: Question, ctx: Context) -> str:
        abstain = self.option("abstain", ctx)
        probes = self.option("difference_rewards", ctx)
        evidence, last_search = await self._search(q, ctx, abstain, probes)  # §3.1 steps 2-4
        answer = await self.read(q, ctx, evidence)  # §3.1 step 5
        if probes and last_search is not None:  # §3.4: the final call is G(Q, E≤T)
            DacTurnRecord(partial_abstained=DacEpisodeRecord.of(ctx.episode).abstained).write(last_search)
        if self.option("hard_positives", ctx) and sufficiency(
            [p.contents for p in evidence], q.golden_answers
        ):
            await self._hard_positive(q, evidence, abstain, ctx)  # §3.3
        return answer

    async def gather(self, q: Question, ctx: Context) -> list[Passage]:
        """The searcher in front of another method's reader: the evidence E, without §3.4's probes (they
        need DAC's own generator)."""
        evidence, _ = await self._search(q, ctx, abstain=False, probes=False)
        return evidence

    async def read(self, q: Question, ctx: Context, passages: list[Passage]) -> str:
        """The generator on another method's evidence, abstaining as in `run`."""
        abstain = self.option("abstain", ctx)
        _, answer, abstained = await self._generate(q, passages, abstain, ctx)
        ctx.episode.meta["abstention"] = abstain
        DacEpisodeRecord(abstained=abstained).write(ctx.episode)
        return answer

    async def _search(
        self, q: Question, ctx: Context, abstain: bool, probes: bool
    ) -> tuple[list[Passage], Turn | None]:
        """The searcher loop: search or stop after reading E_<t; E_t are the passages of search t. With
        `probes`, search turn t gets the outcome of G(Q, E≤t) when the searcher searches again (§3.4).
        Returns E and the last search turn."""
        messages = self.chat("searcher", question=q.question)
        transcript = Transcript(ctx.episode)
        evidence: list[Passage] = []
        last_search: Turn | None = None
        for t in range(self.settings.max_turns):
            ctx.step = t
            turn = await transcript.generate(
                ctx,
                "searcher",
                messages,
                stop=SEARCHER_STOP,
                max_new_tokens=SEARCHER_TOKENS,
            )
            action = parse_searcher(turn.completion)
            if action.kind == "search":
                if probes and last_search is not None:  # E≤t of the previous search t is complete
                    await self._probe(q, evidence, abstain, last_search, ctx)
                passages = await ctx.search(action.query, self.settings.top_k)
                transcript.add_env(information_block(passages))
                evidence = dedupe(evidence + passages)
                last_search = turn
            elif action.kind == "invalid":
                turn.flag_format_error(action.error or "invalid searcher action")
                transcript.add_env(self.prompts["invalid_action"])
            ctx.snapshot({"action": action.kind, "query": action.query, "evidence": [p.id for p in evidence]})
            if action.kind == "stop":
                break
        ctx.step += 1
        return evidence, last_search

    async def _probe(
        self, q: Question, evidence: list[Passage], abstain: bool, search: Turn, ctx: Context
    ) -> None:
        """§3.4: G(Q, E≤t) as if E≤t (the evidence up to and including `search`) were final; its abstention
        goes on `search`. A frozen call: the reward scheme and the trainer leave it alone."""
        turn, _, abstained = await self._generate(q, evidence, abstain, ctx)
        turn.frozen = True
        turn.meta.update(probe=True, evidence_step=search.step)
        DacTurnRecord(partial_abstained=abstained).write(search)

    async def _hard_positive(self, q: Question, evidence: list[Passage], abstain: bool, ctx: Context) -> None:
        """§3.3 and Appendix B.1: the generator on E′ = E ∪ E_N, three distractors from the top-15 passages
        for the original question, taken in reverse rank order from those not already in E."""
        pool = await ctx.search(q.question, HARD_POSITIVE_POOL)
        known = {p.id for p in evidence}
        distractors = [p for p in reversed(pool) if p.id not in known][:HARD_POSITIVE_DISTRACTORS]
        if not distractors:
            return
        turn, answer, abstained = await self._generate(q, evidence + distractors, abstain, ctx)
        turn.subgroup = HARD_POSITIVE
        DacTurnRecord(hard_positive=True, answer=answer, abstained=abstained).write(turn)

    async def _generate(
        self, q: Question, evidence: list[Passage], abstain: bool, ctx: Context
    ) -> tuple[Turn, str, bool]:
        """A = G(Q, E): Prompt 2 (abstention allowed) in training, Prompt 3 at test time. Returns the turn,
        the answer and whether the generator abstained (only possible with abstention on)."""
        documents = format_documents(evidence) or "(no documents were retrieved)"
        prompt = "generator_train" if abstain else "generator_test"
        turn = await ctx.llm(
            "generator",
            self.chat(prompt, question=q.question, documents=documents),
            stop=GENERATOR_STOP,
            max_new_tokens=GENERATOR_TOKENS,
        )
        parsed = parse_answer(turn.completion)
        if not parsed.ok:
            turn.flag_format_error(parsed.error or "bad answer format")
        if is_abstention(parsed.value) and not abstain:
            turn.flag_format_error("answered 'unknown' although abstention is off at test time")
            return turn, "", False
        return turn, parsed.value, is_abstention(parsed.value)
