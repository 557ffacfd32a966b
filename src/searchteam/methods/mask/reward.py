"""M-ASK's turn-level rewards: F1 of every predicted answer and its gain per search turn (Eq. 2-3)."""

from __future__ import annotations

from pydantic import Field

from searchteam.methods.mask.team import END_ACTION, MaskRecord
from searchteam.metrics import answer_scores, f1_score
from searchteam.rewards.base import RewardOptions, RewardSpec, clear, gold_answers, record
from searchteam.types import Episode, Turn


class MaskOptions(RewardOptions):
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
    such imputed turns is `episode.reward_terms["imputed_turns"]`. Outcome (`episode.reward`): F1 of the final
    answer.

    Not in the paper: with `format_penalty` p > 0, a turn that broke its format (`parsed_ok` False) gets its
    reward − p (M-ASK has no format reward; without one, RL on this machine let the plan agent drop its
    tags, experiments/log.md)."""

    def __init__(self, options: MaskOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._score(episode)

    @staticmethod
    def _turn_of(turn: Turn) -> int:
        t = MaskRecord.of(turn).turn
        return turn.step if t is None else t

    def _score(self, episode: Episode) -> None:
        clear(episode)
        golds = gold_answers(episode)
        records = [MaskRecord.of(t) for t in episode.turns]
        plan = next((r for t, r in zip(episode.turns, records, strict=True) if t.role == "plan"), None)
        a0 = (plan.predicted_answer if plan else None) or ""
        answers = [r for t, r in zip(episode.turns, records, strict=True) if t.role == "answer"]
        per_turn = {r.turn: r.predicted_answer or "" for r in answers if r.turn is not None}
        final_call = next((r for r in answers if r.turn is None), None)
        final = (
            episode.answer
            if final_call is None or final_call.predicted_answer is None
            else final_call.predicted_answer
        )
        iterations = [
            self._turn_of(t)
            for t, r in zip(episode.turns, records, strict=True)
            if t.role in ("summary", "update") or (t.role == "search" and r.action != END_ACTION)
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
        for turn, rec in zip(episode.turns, records, strict=True):
            if turn.role == "plan":
                turn.reward = scores[0]
            elif turn.role == "answer":
                turn.reward = f1_score(rec.predicted_answer or "", golds)
            elif turn.role == "search" and rec.action == END_ACTION:
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
        record(episode, terms["f1"], terms)


REWARD = RewardSpec(MaskOptions, lambda options, _judge: MaskReward(options))
