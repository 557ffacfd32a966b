"""DAC's cross-verification rewards for searcher and generator, with turn-level difference rewards."""

from __future__ import annotations

from pydantic import Field

from searchteam.methods.dac.team import DacEpisodeRecord, DacTurnRecord
from searchteam.metrics import exact_match, sufficiency
from searchteam.rewards.base import RewardOptions, RewardSpec, clear, gold_answers, passage_texts, record
from searchteam.types import Episode, Turn


class DacOptions(RewardOptions):
    difference_rewards: bool = Field(True, description="§3.4 turn-level difference rewards for the searcher")


class DacReward:
    """DAC's cross-verification rewards (dac.txt §3.2-3.4, Eq. 1-2; EM-based verifiers of Appendix B.1).

    s = 1[some passage retrieved by the searcher contains a gold answer] (sufficiency after normalization;
    only retrievals at or before the last searcher step count, so distractors added later for hard
    positives do not), v = ¬`episode.meta["abstained"]`, a = EM(answer).
    - searcher: r_S = 1[s ∧ ¬abstained] (Eq. 1);
    - generator: r_G = 1[EM ∨ (¬s ∧ abstained)] (Eq. 2); a generator turn with `meta["hard_positive"]`
      (§3.3) is scored with s = 1, i.e. 1[EM of its own `meta["answer"]`] (its completion's `<answer>` if
      that is not recorded). Frozen generator turns (`turn.frozen`: the team's §3.4 probes on partial
      evidence) get no reward. When the clean generator turn answered right (EM) and a hard-positive turn
      did not, that turn gets `turn.sft_target` = the clean completion: the pseudo-target of the auxiliary
      SFT loss (Appendix D, Eq. 7), which the trainer uses when `sft_coef` > 0.
    Searcher credit (§3.4): when searcher turns carry `meta["partial_reward"]` (R(E≤t), the search reward as
    if the evidence up to turn t were final) or `meta["partial_abstained"]` (whether G(Q, E≤t) abstained;
    then R(E≤t) = r_S(Q, E≤t, G(Q, E≤t)) = 1[s(E≤t) ∧ ¬partial_abstained] with E≤t the passages retrieved
    at steps ≤ t), turn t gets the difference r_t = R(E≤t) − R(E≤t−1), R(E≤0) = 0 (empty evidence is never
    sufficient). A turn without either (a `<stop>` or an invalid action) carries R(E≤t−1) forward, and the
    last searcher turn's R is the final r_S, so Σ_t r_t = r_S exactly and, with γ = 1, the return from
    turn t is r_S − R(E≤t−1). Otherwise (or with `difference_rewards=False`) the last searcher turn gets r_S
    and earlier ones 0.
    Outcome (`episode.reward`): EM of the final answer."""

    def __init__(self, options: DacOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._score(episode)

    def _score(self, episode: Episode) -> None:
        clear(episode)
        golds = gold_answers(episode)
        searcher = episode.turns_of("searcher")
        last_step = max((t.step for t in searcher), default=None)
        sufficient = self._sufficient(episode, last_step)
        abstained = DacEpisodeRecord.of(episode).abstained
        em = exact_match(episode.answer, golds)
        r_search = float(sufficient and not abstained)
        r_generate = float(bool(em) or (not sufficient and abstained))
        records = [DacTurnRecord.of(t) for t in searcher]
        partial = self.options.difference_rewards and any(
            r.partial_reward is not None or r.partial_abstained is not None for r in records
        )
        previous = 0.0
        for i, (turn, rec) in enumerate(zip(searcher, records, strict=True)):
            if i == len(searcher) - 1:
                current = r_search
            elif not partial:
                current = 0.0
            elif rec.partial_reward is not None:
                current = rec.partial_reward
            elif rec.partial_abstained is not None:
                current = float(self._sufficient(episode, turn.step) and not rec.partial_abstained)
            else:
                current = previous
            turn.reward = current - previous if partial else current
            previous = current
        generators = [t for t in episode.turns_of("generator") if not t.frozen]
        clean = next((t for t in generators if not DacTurnRecord.of(t).hard_positive), None)
        for turn in generators:
            turn.sft_target = None
            if not DacTurnRecord.of(turn).hard_positive:
                turn.reward = r_generate
                continue
            turn.reward = exact_match(self._own_answer(turn), golds)
            if clean is not None and em and not turn.reward:  # Eq. 7: right on E, wrong on E′
                turn.sft_target = clean.completion
        terms = {
            "em": em,
            "sufficient": float(sufficient),
            "abstained": float(abstained),
            "searcher": r_search,
            "generator": r_generate,
            "difference_rewards": float(partial),
            "hard_positives": float(sum(DacTurnRecord.of(t).hard_positive for t in episode.turns)),
        }
        record(episode, em, terms)

    @staticmethod
    def _sufficient(episode: Episode, up_to_step: int | None) -> bool:
        passages = [
            p for r in episode.retrievals if up_to_step is None or r.step <= up_to_step for p in r.passages
        ]
        return bool(sufficiency(passage_texts(passages), gold_answers(episode)))

    @staticmethod
    def _own_answer(turn: Turn) -> str:
        own = DacTurnRecord.of(turn).answer
        if own is not None:
            return own
        start, end = turn.completion.rfind("<answer>"), turn.completion.rfind("</answer>")
        return turn.completion[start + len("<answer>") : end] if 0 <= start < end else ""


REWARD = RewardSpec(DacOptions, lambda options, _judge: DacReward(options))
