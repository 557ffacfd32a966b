"""DECOR's hierarchical hybrid reward: a format gate, then team and role rewards from a judge (Eq. 2-3)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from searchteam.llm.base import LLM, GenerationRequest
from searchteam.methods.decor.team import GATED_ROLES, DecorRecord
from searchteam.metrics import cover_exact_match, f1_score, hit, sufficiency
from searchteam.rewards.base import (
    RewardOptions,
    RewardSpec,
    clear,
    gold_answers,
    passage_texts,
    record,
    trained_turns,
)
from searchteam.rewards.judge import (
    DEFAULT_MAX_NEW_TOKENS,
    ask_judge,
    format_passages,
    judge_request,
    load_judge_prompts,
)
from searchteam.types import Episode

logger = logging.getLogger(__name__)


class DecorOptions(RewardOptions):
    alpha: float = Field(0.6, ge=0.0, le=1.0, description="weight of R_team against R_role (Eq. 3)")
    lam: float = Field(
        0.5, ge=0.0, le=1.0, description="weight of F1 against the LLM judge in R_team (Eq. 2)"
    )
    judge_prompts: str = Field("decor_judge", description="prompt file in rewards/prompts/")
    judge_max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, description="new tokens per judge reply")


@dataclass
class _Check:
    """One judged item: the team answer (`turn is None`) or one role turn, with its rule-based proxy."""

    episode: int
    turn: int | None
    proxy: bool
    request: GenerationRequest | None = None
    verdict: bool | None = None

    @property
    def passed(self) -> bool:
        return self.proxy if self.verdict is None else self.verdict


class DecorReward:
    """DECOR's hierarchical hybrid reward (decor.txt §4.3, Eq. 2-3, judge prompts of Appendix B).

    - Format gate: if any planner, filter or answerer turn failed to parse, every trained turn of the episode
      gets −1 (R_fmt = 0) and nothing is judged.
    - R_team = λ · F1(a_final, g) + (1 − λ) · R_LJ(a_final, g), R_LJ ∈ {0, 1} from the answer judge (Eq. 2).
    - R_role ∈ {+1, −1} per planner, filter and answerer turn from its role judge.
    - Each of those turns gets R_total = α · R_team + (1 − α) · R_role (Eq. 3; α = 0.6, λ = 0.5 by default).
    Compressor turns (`turn.frozen`) get no reward.

    The judge is any `LLM`; all judge requests of a batch of episodes go in one `generate` call. A verdict
    without a parseable `<verdict>` tag falls back to the rule-based proxy and is counted in
    `episode.reward_terms["judge_unparsed"]`. Without a judge, the proxy decides everything (a warning is
    logged once): answer judge = cover-EM; planner +1 iff its query's retrieval contains a gold answer (for a
    STOP turn: iff the memory already does); filter +1 iff its evidence is non-blank and keeps a gold answer
    whenever its documents had one; answerer +1 iff correct (cover-EM) or the final memory lacks every gold
    answer (Appendix B.4: reasoning errors are penalized only when the memory holds the evidence).
    The memory before step t is the last snapshot (`episode.states`, key "memory") of an earlier step, else
    the earlier filter turns' `meta["evidence"]`. Outcome (`episode.reward`): R_team, or −1 when gated."""

    def __init__(self, options: DecorOptions, judge: LLM | None) -> None:
        self.options = options
        self.judge = judge
        self._warned = False
        if judge is not None:
            missing = {"answer", *GATED_ROLES} - set(load_judge_prompts(options.judge_prompts))
            if missing:
                raise ValueError(
                    f"judge prompts '{options.judge_prompts}' lack the prompt(s) {', '.join(sorted(missing))}"
                )

    def __call__(self, episodes: list[Episode]) -> None:
        if self.judge is None and not self._warned:
            logger.warning("DECOR reward: no judge configured: rule-based proxy for R_LJ and R_role")
            self._warned = True
        checks: list[_Check] = []
        for i, episode in enumerate(episodes):
            clear(episode)
            if self._format_ok(episode):
                checks += self._checks(i, episode)
        asked = [c for c in checks if c.request is not None]
        if self.judge is not None and asked:
            for check, verdict in zip(asked, ask_judge(self.judge, [c.request for c in asked]), strict=True):
                check.verdict = verdict
        by_episode: dict[int, list[_Check]] = {}
        for check in checks:
            by_episode.setdefault(check.episode, []).append(check)
        for i, episode in enumerate(episodes):
            if i in by_episode:
                self._assign(episode, by_episode[i])
            else:
                self._gate(episode)

    @staticmethod
    def _format_ok(episode: Episode) -> bool:
        return all(t.parsed_ok for t in episode.turns if t.role in GATED_ROLES and not t.frozen)

    def _gate(self, episode: Episode) -> None:
        for turn in trained_turns(episode):
            turn.reward = -1.0
        f1 = f1_score(episode.answer, gold_answers(episode))
        record(episode, -1.0, {"format_ok": 0.0, "f1": f1, "judge_calls": 0.0, "judge_unparsed": 0.0})

    def _assign(self, episode: Episode, checks: list[_Check]) -> None:
        a = self.options.alpha
        answer = next(c for c in checks if c.turn is None)
        f1 = f1_score(episode.answer, gold_answers(episode))
        judged = float(answer.passed)
        team = self.options.lam * f1 + (1 - self.options.lam) * judged
        roles: dict[str, list[float]] = {r: [] for r in GATED_ROLES}
        for check in checks:
            if check.turn is None:
                continue
            turn = episode.turns[check.turn]
            role_reward = 1.0 if check.passed else -1.0
            roles[turn.role].append(role_reward)
            turn.reward = a * team + (1 - a) * role_reward
        terms = {"format_ok": 1.0, "f1": f1, "judge_answer": judged, "team": team}
        terms |= {f"role_{r}": sum(v) / len(v) for r, v in roles.items() if v}
        asked = [c for c in checks if c.request is not None]
        terms["judge_calls"] = float(len(asked))
        terms["judge_unparsed"] = float(sum(c.verdict is None for c in asked))
        record(episode, team, terms)

    def _checks(self, index: int, episode: Episode) -> list[_Check]:
        golds = gold_answers(episode)
        golden = "; ".join(golds)
        question = episode.question.question
        checks = [
            _Check(
                index,
                None,
                proxy=bool(cover_exact_match(episode.answer, golds)),
                request=self._request(
                    "answer", question=question, prediction=episode.answer, references="\n".join(golds)
                ),
            )
        ]
        for position, turn in enumerate(episode.turns):
            if turn.role not in GATED_ROLES or turn.frozen:
                continue
            docs = [p for r in episode.retrievals if r.step == turn.step for p in r.passages]
            if turn.role == "planner":
                memory = _decor_memory(episode, turn.step)
                stop = DecorRecord.of(turn).query is None
                proxy = (
                    hit(_memory_evidence(memory), golds) if stop else sufficiency(passage_texts(docs), golds)
                )
                fields = {"question": question, "history": _memory_text(memory)}
            elif turn.role == "filter":
                recorded = DecorRecord.of(turn).evidence
                evidence = turn.completion if recorded is None else recorded
                had = sufficiency(passage_texts(docs), golds)
                proxy = bool(evidence.strip()) and (not had or bool(hit(evidence, golds)))
                query = next((r.query for r in episode.retrievals if r.step == turn.step), "")
                fields = {"query": query, "documents": format_passages(docs)}
            else:
                memory = _decor_memory(episode, None)
                correct = cover_exact_match(episode.answer, golds)
                proxy = bool(correct) or not hit(_memory_evidence(memory), golds)
                fields = {"question": question, "history": _memory_text(memory)}
            request = self._request(turn.role, output=turn.completion.strip(), golden=golden, **fields)
            checks.append(_Check(index, position, proxy=bool(proxy), request=request))
        return checks

    def _request(self, kind: str, **fields: str) -> GenerationRequest | None:
        if self.judge is None:
            return None
        return judge_request(self.options.judge_prompts, kind, fields, self.options.judge_max_new_tokens)


def _decor_memory(episode: Episode, before_step: int | None) -> list[dict[str, Any]]:
    """Memory entries ({query, evidence}) as they stood before `before_step` (None: the final memory)."""
    snapshots = [s for s in episode.states if "memory" in s]
    if snapshots:
        earlier = [s for s in snapshots if before_step is None or s.get("step", 0) < before_step]
        return list(earlier[-1]["memory"]) if earlier else []
    return [
        {
            "query": next((r.query for r in episode.retrievals if r.step == t.step), None),
            "evidence": DecorRecord.of(t).evidence or "",
        }
        for t in episode.turns
        if t.role == "filter" and (before_step is None or t.step < before_step)
    ]


def _memory_evidence(memory: list[dict[str, Any]]) -> str:
    return "\n".join(str(e.get("evidence", "")) for e in memory)


def _memory_text(memory: list[dict[str, Any]]) -> str:
    if not memory:
        return "(empty)"
    lines = []
    for i, entry in enumerate(memory, 1):
        query = entry.get("query")
        evidence = entry.get("evidence", "")
        lines.append(f"Search {i}: {query}\nResult: {evidence}" if query else f"Facts: {evidence}")
    return "\n".join(lines)


REWARD = RewardSpec(DecorOptions, lambda options, judge: DecorReward(options, judge), uses_judge=True)
