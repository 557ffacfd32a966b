"""Per-method credit assignment: a reward scheme reads finished Episodes and writes rewards onto their Turns.

A scheme is a callable `scheme(episodes) -> None`. It sets `turn.reward` on every turn it wants trained
(turns it leaves at None, such as frozen compressor or generator calls, are not its to reward), and on each
episode `meta["reward"]` (one scalar outcome for logging) and `meta["reward_terms"]` (its components, all
floats). Schemes only read what teams record (roles, `turn.meta`, `episode.meta`, retrievals, snapshots);
they never import a team, so the trainer can take any of them.

`build_reward_scheme(method, options, judge)` picks the scheme of a method; options are validated (unknown
keys and bad values are errors naming the method and the allowed options). Placement of outcome rewards
(`placement` option where offered): `every_turn` writes the outcome on every trained turn (for per-turn
GRPO-style advantages); `last_turn` writes it on the last trained turn and 0 on the others (for GAE with
γ = 1, or for `merge_continuations`, which sums the rewards of a continued chain of turns).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from searchteam.llm.base import LLM, GenerationRequest
from searchteam.rewards.judge import (
    DEFAULT_MAX_NEW_TOKENS,
    ask_judge,
    format_passages,
    judge_request,
    load_judge_prompts,
)
from searchteam.rewards.metrics import (
    answer_scores,
    cover_exact_match,
    exact_match,
    f1_score,
    hit,
    sufficiency,
)
from searchteam.types import Episode, Passage, Turn

logger = logging.getLogger(__name__)

RewardScheme = Callable[[list[Episode]], None]
Metric = Literal["em", "cover_em", "f1"]
Placement = Literal["every_turn", "last_turn"]
_TAG = re.compile(r"</?[A-Za-z_][^<>]*>")
METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "em": exact_match,
    "cover_em": cover_exact_match,
    "f1": f1_score,
}


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- shared helpers --------------------------------------------------------------------------------------


def _golds(episode: Episode) -> list[str]:
    return episode.question.golden_answers


def _trained(episode: Episode) -> list[Turn]:
    """Turns a scheme may reward: every turn except frozen ones (`meta["frozen"]`)."""
    return [t for t in episode.turns if not t.meta.get("frozen")]


def _place(turns: list[Turn], value: float, placement: Placement) -> None:
    for i, turn in enumerate(turns):
        turn.reward = value if placement == "every_turn" or i == len(turns) - 1 else 0.0


def _clear(episode: Episode) -> None:
    for turn in episode.turns:
        turn.reward = None


def _record(episode: Episode, reward: float, terms: dict[str, float]) -> None:
    episode.meta["reward"] = float(reward)
    episode.meta["reward_terms"] = {k: float(v) for k, v in terms.items()}


def _texts(passages: Sequence[Passage]) -> list[str]:
    return [p.contents for p in passages]


# ---- outcome baselines: search_r1, static_pipeline, ircot, naive_rag, direct -----------------------------


class OutcomeOptions(_Options):
    metric: Metric = Field("em", description="answer metric of the outcome reward")
    placement: Placement = "every_turn"


class StaticPipelineOptions(OutcomeOptions):
    metric: Metric = Field("f1", description="MMOA-RAG's shared reward is the answer F1")


class OutcomeReward:
    """One outcome reward for the whole team: `metric(answer, golds)` on every trained turn.

    Search-R1 (Jin et al., 2025) trains on the exact match of the final answer (default `em`); MMOA-RAG's
    static rewrite→select→generate pipeline shares the answer F1 among its agents (default `f1` for
    `static_pipeline`); IRCoT, naive RAG and direct answering default to `em` as well."""

    def __init__(self, method: str, options: OutcomeOptions) -> None:
        self.method = method
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        metric = METRICS[self.options.metric]
        for episode in episodes:
            _clear(episode)
            score = metric(episode.answer, _golds(episode))
            _place(_trained(episode), score, self.options.placement)
            _record(episode, score, answer_scores(episode.answer, _golds(episode)))


# ---- M-ASK ---------------------------------------------------------------------------------------------


class MaskOptions(_Options):
    format_penalty: float = Field(
        0.0,
        ge=0.0,
        description="subtracted from the reward of a turn that broke its format (not in the paper: 0 = off; "
        "1 is JADE's r_format, Eq. 7)",
    )


class MaskReward:
    """M-ASK turn-level rewards (m-ask.txt §3.3, Eq. 2-3, Algorithm 1 lines 8-32).

    - plan: r_plan = F1(a_0, y), a_0 = the plan turn's `meta["predicted_answer"]` (Eq. 2);
    - answer at turn t (`meta["turn"] = t`): r_ans = F1(a_t, y) (Eq. 2); the final answer call
      (`meta["turn"] = None`) gets F1 of its own answer;
    - search, summary and update turns of turn t (`meta["turn"]`, else the turn's step) share
      r_iter(t) = F1(a_t, y) − F1(a_{t−1}, y) (Eq. 3); a search turn with `meta["action"] == "end"` gets 0.

    Σ_t r_iter(t) telescopes to F1(a_T, y) − F1(a_0, y). At inference the Answer Agent does not evaluate
    every turn, so some a_t are missing: a missing a_t is carried forward from a_{t−1} (r_iter = 0), except
    at the last turn T, where a_T is the final answer (the final answer call's, else `episode.answer`), so the
    whole gain F1(a_final) − F1(a_0) lands on turn T and the telescoping sum still holds. The number of
    such imputed turns is `reward_terms["imputed_turns"]`. Outcome (`meta["reward"]`): F1 of the final
    answer.

    Not in the paper: with `format_penalty` p > 0, a turn that broke its format (`parsed_ok` False) gets its
    reward − p (M-ASK has no format reward; without one, RL on this machine let the plan agent drop its
    tags, docs/training.md)."""

    def __init__(self, options: MaskOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._score(episode)

    @staticmethod
    def _turn_of(turn: Turn) -> int:
        t = turn.meta.get("turn")
        return turn.step if t is None else int(t)

    def _score(self, episode: Episode) -> None:
        _clear(episode)
        golds = _golds(episode)
        plan = next((t for t in episode.turns if t.role == "plan"), None)
        a0 = str(plan.meta.get("predicted_answer", "")) if plan else ""
        answers = [t for t in episode.turns if t.role == "answer"]
        per_turn = {
            int(t.meta["turn"]): str(t.meta.get("predicted_answer", ""))
            for t in answers
            if t.meta.get("turn") is not None
        }
        final_call = next((t for t in answers if t.meta.get("turn") is None), None)
        final = str(final_call.meta.get("predicted_answer", episode.answer)) if final_call else episode.answer
        iterations = [
            self._turn_of(t)
            for t in episode.turns
            if t.role in ("summary", "update") or (t.role == "search" and t.meta.get("action") != "end")
        ]
        last = max(iterations, default=0)
        scores = [f1_score(a0, golds)]
        imputed = 0
        for t in range(1, last + 1):
            if t in per_turn:
                scores.append(f1_score(per_turn[t], golds))
            else:
                imputed += 1
                scores.append(f1_score(final, golds) if t == last else scores[-1])
        for turn in episode.turns:
            if turn.role == "plan":
                turn.reward = scores[0]
            elif turn.role == "answer":
                turn.reward = f1_score(str(turn.meta.get("predicted_answer", "")), golds)
            elif turn.role == "search" and turn.meta.get("action") == "end":
                turn.reward = 0.0
            elif turn.role in ("search", "summary", "update"):
                t = self._turn_of(turn)
                turn.reward = scores[t] - scores[t - 1] if 1 <= t <= last else 0.0
            if turn.reward is not None and not turn.parsed_ok:
                turn.reward -= self.options.format_penalty
        terms = answer_scores(episode.answer, golds) | {
            "format_errors": float(sum(not t.parsed_ok for t in episode.turns)),
            "plan_f1": scores[0],
            "last_turn_f1": scores[-1],
            "gain": scores[-1] - scores[0],
            "turns": float(last),
            "imputed_turns": float(imputed),
        }
        _record(episode, terms["f1"], terms)


# ---- QAgent --------------------------------------------------------------------------------------------


class QAgentOptions(_Options):
    stage: int = Field(1, ge=1, le=2, description="1: end-to-end RL (Eq. 7); 2: generalized RL (Eq. 10)")
    generator_metric: Metric = Field("cover_em", description="stage 2's non-strict EM of the generator")
    hit_weight: float = Field(0.5, ge=0.0, description="weight of Hit(τ, A*) in Eq. 10")
    placement: Placement = "every_turn"


class QAgentReward:
    """QAgent's two training stages (qagent.txt §3.3-3.4); rewards go on `agent` turns only.

    - Stage 1, end-to-end RL (Eq. 7): R = 1[every agent turn format-valid] · EM_strict(A*, Â), Â the agent's
      own answer (`episode.meta["agent_answer"]` in submodule mode, else `episode.answer`). A submodule
      episode whose agent never answered scores 0 (no answer tag: the format reward fails).
    - Stage 2, generalized RL (Eq. 10): R = EM(A*, Ã) + 0.5 · Hit(τ, A*), Ã the frozen generator's answer
      (`episode.answer` of a submodule-mode episode). The paper relaxes EM to non-strict EM here; the default
      `generator_metric` is cover-EM (a gold answer inside the prediction). Hit(τ, A*) is 1 when the
      trajectory (the recorded transcript, else the agent's outputs and every retrieved passage) contains a
      gold answer. The `generator` turns are frozen and get no reward.
    Outcome (`meta["reward"]`): R."""

    def __init__(self, options: QAgentOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            _clear(episode)
            agent = episode.turns_of("agent")
            submodule = bool(episode.turns_of("generator"))
            golds = _golds(episode)
            if self.options.stage == 1:
                own = episode.meta.get("agent_answer", "" if submodule else episode.answer)
                format_ok = bool(agent) and all(t.parsed_ok for t in agent)
                em = exact_match(str(own), golds)
                reward = float(format_ok) * em
                terms = {"stage": 1.0, "format_ok": float(format_ok), "agent_em": em}
            else:
                if not submodule:
                    raise ValueError(
                        f"qagent stage 2 rewards a frozen generator's answer (Eq. 10), but the episode of "
                        f"question '{episode.question.id}' has no generator turn: run the team with option "
                        "mode=submodule, or use stage 1"
                    )
                score = METRICS[self.options.generator_metric](episode.answer, golds)
                found = hit(self._trajectory(episode), golds)
                reward = score + self.options.hit_weight * found
                terms = {"stage": 2.0, "generator_score": score, "hit": found}
            _place(agent, reward, self.options.placement)
            _record(episode, reward, terms)

    @staticmethod
    def _trajectory(episode: Episode) -> str:
        """τ as text, tags blanked out (normalization would glue `<tag>word` into one token)."""
        segments = episode.meta.get("transcript")
        if segments:
            text = "\n".join(str(s.get("text", "")) for s in segments)
        else:
            parts = [t.completion for t in episode.turns_of("agent")]
            text = "\n".join(parts + _texts(episode.retrieved_passages()))
        return _TAG.sub(" ", text)


# ---- DECOR ---------------------------------------------------------------------------------------------


DECOR_ROLES = ("planner", "filter", "answerer")


class DecorOptions(_Options):
    alpha: float = Field(0.6, ge=0.0, le=1.0, description="weight of R_team against R_role (Eq. 3)")
    lam: float = Field(
        0.5, ge=0.0, le=1.0, description="weight of F1 against the LLM judge in R_team (Eq. 2)"
    )
    judge_prompts: str = Field("decor_judge", description="prompt file in rewards/prompts/")
    judge_max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1)


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
    Compressor turns (`meta["frozen"]`) get no reward.

    The judge is any `LLM`; all judge requests of a batch of episodes go in one `generate` call. A verdict
    without a parseable `<verdict>` tag falls back to the rule-based proxy and is counted in
    `reward_terms["judge_unparsed"]`. Without a judge, the proxy decides everything (a warning is logged
    once): answer judge = cover-EM; planner +1 iff its query's retrieval contains a gold answer (for a STOP
    turn: iff the memory already does); filter +1 iff its evidence is non-blank and keeps a gold answer
    whenever its documents had one; answerer +1 iff correct (cover-EM) or the final memory lacks every gold
    answer (Appendix B.4: reasoning errors are penalized only when the memory holds the evidence).
    The memory before step t is the last snapshot (`episode.states`, key "memory") of an earlier step, else
    the earlier filter turns' `meta["evidence"]`. Outcome (`meta["reward"]`): R_team, or −1 when gated."""

    def __init__(self, options: DecorOptions, judge: LLM | None) -> None:
        self.options = options
        self.judge = judge
        self._warned = False
        if judge is not None:
            missing = {"answer", *DECOR_ROLES} - set(load_judge_prompts(options.judge_prompts))
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
            _clear(episode)
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
        return all(t.parsed_ok for t in episode.turns if t.role in DECOR_ROLES and not t.meta.get("frozen"))

    def _gate(self, episode: Episode) -> None:
        for turn in _trained(episode):
            turn.reward = -1.0
        f1 = f1_score(episode.answer, _golds(episode))
        _record(episode, -1.0, {"format_ok": 0.0, "f1": f1, "judge_calls": 0.0, "judge_unparsed": 0.0})

    def _assign(self, episode: Episode, checks: list[_Check]) -> None:
        a = self.options.alpha
        answer = next(c for c in checks if c.turn is None)
        f1 = f1_score(episode.answer, _golds(episode))
        judged = float(answer.passed)
        team = self.options.lam * f1 + (1 - self.options.lam) * judged
        roles: dict[str, list[float]] = {r: [] for r in DECOR_ROLES}
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
        _record(episode, team, terms)

    def _checks(self, index: int, episode: Episode) -> list[_Check]:
        golds = _golds(episode)
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
            if turn.role not in DECOR_ROLES or turn.meta.get("frozen"):
                continue
            docs = [p for r in episode.retrievals if r.step == turn.step for p in r.passages]
            if turn.role == "planner":
                memory = _decor_memory(episode, turn.step)
                stop = turn.meta.get("query") is None
                proxy = hit(_memory_evidence(memory), golds) if stop else sufficiency(_texts(docs), golds)
                fields = {"question": question, "history": _memory_text(memory)}
            elif turn.role == "filter":
                evidence = str(turn.meta.get("evidence", turn.completion))
                had = sufficiency(_texts(docs), golds)
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
            "evidence": str(t.meta.get("evidence", "")),
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


# ---- DAC -----------------------------------------------------------------------------------------------


class DacOptions(_Options):
    difference_rewards: bool = Field(True, description="§3.4 turn-level difference rewards for the searcher")


class DacReward:
    """DAC's cross-verification rewards (dac.txt §3.2-3.4, Eq. 1-2; EM-based verifiers of Appendix B.1).

    s = 1[some passage retrieved by the searcher contains a gold answer] (sufficiency after normalization;
    only retrievals at or before the last searcher step count, so distractors added later for hard
    positives do not), v = ¬`episode.meta["abstained"]`, a = EM(answer).
    - searcher: r_S = 1[s ∧ ¬abstained] (Eq. 1);
    - generator: r_G = 1[EM ∨ (¬s ∧ abstained)] (Eq. 2); a generator turn with `meta["hard_positive"]`
      (§3.3) is scored with s = 1, i.e. 1[EM of its own `meta["answer"]`] (its completion's `<answer>` if
      that is not recorded). Frozen generator turns (`meta["frozen"]`: the team's §3.4 probes on partial
      evidence) get no reward. When the clean generator turn answered right (EM) and a hard-positive turn
      did not, that turn gets `meta["sft_target"]` = the clean completion: the pseudo-target of the auxiliary
      SFT loss (Appendix D, Eq. 7), which the trainer uses when `sft_coef` > 0.
    Searcher credit (§3.4): when searcher turns carry `meta["partial_reward"]` (R(E≤t), the search reward as
    if the evidence up to turn t were final) or `meta["partial_abstained"]` (whether G(Q, E≤t) abstained;
    then R(E≤t) = r_S(Q, E≤t, G(Q, E≤t)) = 1[s(E≤t) ∧ ¬partial_abstained] with E≤t the passages retrieved
    at steps ≤ t), turn t gets the difference r_t = R(E≤t) − R(E≤t−1), R(E≤0) = 0 (empty evidence is never
    sufficient). A turn without either (a `<stop>` or an invalid action) carries R(E≤t−1) forward, and the
    last searcher turn's R is the final r_S, so Σ_t r_t = r_S exactly and, with γ = 1, the return from
    turn t is r_S − R(E≤t−1). Otherwise (or with `difference_rewards=False`) the last searcher turn gets r_S
    and earlier ones 0.
    Outcome (`meta["reward"]`): EM of the final answer."""

    def __init__(self, options: DacOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._score(episode)

    def _score(self, episode: Episode) -> None:
        _clear(episode)
        golds = _golds(episode)
        searcher = episode.turns_of("searcher")
        last_step = max((t.step for t in searcher), default=None)
        sufficient = self._sufficient(episode, last_step)
        abstained = bool(episode.meta.get("abstained", False))
        em = exact_match(episode.answer, golds)
        r_search = float(sufficient and not abstained)
        r_generate = float(bool(em) or (not sufficient and abstained))
        partial = self.options.difference_rewards and any(
            "partial_reward" in t.meta or "partial_abstained" in t.meta for t in searcher
        )
        previous = 0.0
        for i, turn in enumerate(searcher):
            if i == len(searcher) - 1:
                current = r_search
            elif not partial:
                current = 0.0
            elif "partial_reward" in turn.meta:
                current = float(turn.meta["partial_reward"])
            elif "partial_abstained" in turn.meta:
                current = float(self._sufficient(episode, turn.step) and not turn.meta["partial_abstained"])
            else:
                current = previous
            turn.reward = current - previous if partial else current
            previous = current
        generators = [t for t in episode.turns_of("generator") if not t.meta.get("frozen")]
        clean = next((t for t in generators if not t.meta.get("hard_positive")), None)
        for turn in generators:
            turn.meta.pop("sft_target", None)
            if not turn.meta.get("hard_positive"):
                turn.reward = r_generate
                continue
            turn.reward = exact_match(self._own_answer(turn), golds)
            if clean is not None and em and not turn.reward:  # Eq. 7: right on E, wrong on E′
                turn.meta["sft_target"] = clean.completion
        terms = {
            "em": em,
            "sufficient": float(sufficient),
            "abstained": float(abstained),
            "searcher": r_search,
            "generator": r_generate,
            "difference_rewards": float(partial),
            "hard_positives": float(sum(bool(t.meta.get("hard_positive")) for t in episode.turns)),
        }
        _record(episode, em, terms)

    @staticmethod
    def _sufficient(episode: Episode, up_to_step: int | None) -> bool:
        passages = [
            p for r in episode.retrievals if up_to_step is None or r.step <= up_to_step for p in r.passages
        ]
        return bool(sufficiency(_texts(passages), _golds(episode)))

    @staticmethod
    def _own_answer(turn: Turn) -> str:
        if "answer" in turn.meta:
            return str(turn.meta["answer"])
        start, end = turn.completion.rfind("<answer>"), turn.completion.rfind("</answer>")
        return turn.completion[start + len("<answer>") : end] if 0 <= start < end else ""


# ---- JADE ----------------------------------------------------------------------------------------------


class JadeOptions(_Options):
    alpha: float = Field(0.05, ge=0.0, description="weight of the normalized round count N_rnd(T)")
    beta: float = Field(0.05, ge=0.0, description="weight of the normalized retrieval count N_ret")
    cost_limit: int = Field(3, ge=1, description="the limit both counts are normalized by")
    placement: Placement = Field("last_turn", description="Eq. 8: R_global on the terminal step only")


class JadeReward:
    """JADE's global shared reward with a local format penalty (jade.txt §3.3, Eq. 6-8).

    R_global = F1(ŷ, y) − (α · min(T / 3, 1) + β · min(N_ret / 3, 1)) (Eq. 6), T = `episode.meta
    ["jade_rounds"]`, N_ret = `episode.meta["jade_retrievals"]` (else the planner turns and the recorded
    retrievals), both normalized linearly to [0, 1] by the limit 3 (`cost_limit`). The paper gives no default
    for α and β; its sensitivity study (Fig. 3) shows single penalties up to 0.5 keep most of the F1 while
    α = β = 0.1 together collapses the workflow to one retrieve-generate round, so both default to 0.05.
    `last_turn` (default) is Eq. 8: r_{t,k} = r_format^{(t,k)} + 1[(t, k) = (T, K_T)] · R_global, with
    r_format = −1 for a turn that broke its format (`parsed_ok` False, Eq. 7) and 0 otherwise; GAE with
    γ = λ = 1 (Algorithm 2) then carries R_global back to every earlier turn exactly once. `every_turn`
    shares R_global with every turn (−1 instead for a broken one), for per-turn estimators such as GRPO;
    with a return-summing estimator it would count R_global once per remaining turn.
    Outcome (`meta["reward"]`): R_global."""

    def __init__(self, options: JadeOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        opts = self.options
        for episode in episodes:
            _clear(episode)
            f1 = f1_score(episode.answer, _golds(episode))
            rounds = int(episode.meta.get("jade_rounds", len(episode.turns_of("planner"))))
            retrievals = int(episode.meta.get("jade_retrievals", len(episode.retrievals)))
            cost = opts.alpha * min(rounds / opts.cost_limit, 1.0) + opts.beta * min(
                retrievals / opts.cost_limit, 1.0
            )
            global_reward = f1 - cost
            turns = _trained(episode)
            for i, turn in enumerate(turns):
                if opts.placement == "every_turn":
                    turn.reward = global_reward if turn.parsed_ok else -1.0
                else:
                    penalty = 0.0 if turn.parsed_ok else -1.0
                    turn.reward = penalty + (global_reward if i == len(turns) - 1 else 0.0)
            terms = {
                "f1": f1,
                "rounds": float(rounds),
                "retrievals": float(retrievals),
                "cost": cost,
                "format_errors": float(sum(not t.parsed_ok for t in turns)),
            }
            _record(episode, global_reward, terms)


# ---- registry ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    options: type[_Options]
    build: Callable[[Any, LLM | None], RewardScheme]
    uses_judge: bool = False


def _outcome(method: str) -> Callable[[Any, LLM | None], RewardScheme]:
    return lambda options, _judge: OutcomeReward(method, options)


SCHEMES: dict[str, _Entry] = {
    "mask": _Entry(MaskOptions, lambda o, _j: MaskReward(o)),
    "qagent": _Entry(QAgentOptions, lambda o, _j: QAgentReward(o)),
    "decor": _Entry(DecorOptions, lambda o, j: DecorReward(o, j), uses_judge=True),
    "dac": _Entry(DacOptions, lambda o, _j: DacReward(o)),
    "jade": _Entry(JadeOptions, lambda o, _j: JadeReward(o)),
    "search_r1": _Entry(OutcomeOptions, _outcome("search_r1")),
    "static_pipeline": _Entry(StaticPipelineOptions, _outcome("static_pipeline")),
    "ircot": _Entry(OutcomeOptions, _outcome("ircot")),
    "naive_rag": _Entry(OutcomeOptions, _outcome("naive_rag")),
    "direct": _Entry(OutcomeOptions, _outcome("direct")),
}


def reward_methods() -> list[str]:
    return sorted(SCHEMES)


def build_reward_scheme(
    method: str, options: dict[str, Any] | None = None, judge: LLM | None = None
) -> RewardScheme:
    """The reward scheme of `method`, with validated `options`; `judge` serves LLM-judged schemes (DECOR)."""
    entry = SCHEMES.get(method)
    if entry is None:
        raise ValueError(
            f"no reward scheme for method '{method}'; known methods: {', '.join(reward_methods())}"
        )
    try:
        parsed = entry.options.model_validate(options or {})
    except ValidationError as err:
        allowed = ", ".join(entry.options.model_fields) or "none"
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']} (got {e.get('input')!r})"
            for e in err.errors()
        )
        raise ValueError(
            f"bad reward options for '{method}': {problems}. Allowed options: {allowed}"
        ) from None
    if judge is not None and not entry.uses_judge:
        logger.warning("reward scheme '%s' uses no judge; the judge '%s' is ignored", method, judge.name)
    return entry.build(parsed, judge)
