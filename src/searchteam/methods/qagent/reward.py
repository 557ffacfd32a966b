"""QAgent's rewards: stage 1 trains the agent end to end (Eq. 7), stage 2 for a frozen generator (Eq. 10)."""

from __future__ import annotations

import re

from pydantic import Field

from searchteam.methods.qagent.team import QAgentRecord
from searchteam.metrics import exact_match, hit
from searchteam.rewards.base import (
    METRICS,
    Metric,
    Placement,
    RewardOptions,
    RewardSpec,
    clear,
    gold_answers,
    passage_texts,
    place,
    record,
)
from searchteam.teams.transcript import TRANSCRIPT
from searchteam.types import Episode

_TAG = re.compile(r"</?[A-Za-z_][^<>]*>")


class QAgentOptions(RewardOptions):
    stage: int = Field(1, ge=1, le=2, description="1: end-to-end RL (Eq. 7); 2: generalized RL (Eq. 10)")
    generator_metric: Metric = Field("cover_em", description="stage 2's non-strict EM of the generator")
    hit_weight: float = Field(0.5, ge=0.0, description="weight of Hit(τ, A*) in Eq. 10")
    placement: Placement = Field(
        "every_turn",
        description="every_turn: the outcome on every trained turn; last_turn: on the last one, 0 on the "
        "others (for GAE with γ > 0 or merge_continuations)",
    )


class QAgentReward:
    """QAgent's two training stages (qagent.txt §3.3-3.4); rewards go on `agent` turns only.

    - Stage 1, end-to-end RL (Eq. 7): R = 1[every agent turn format-valid] · EM_strict(A*, Â), Â the agent's
      own answer (`QAgentRecord.agent_answer` in submodule mode, else `episode.answer`). A submodule
      episode whose agent never answered scores 0 (no answer tag: the format reward fails).
    - Stage 2, generalized RL (Eq. 10): R = EM(A*, Ã) + 0.5 · Hit(τ, A*), Ã the frozen generator's answer
      (`episode.answer` of a submodule-mode episode). The paper relaxes EM to non-strict EM here; the default
      `generator_metric` is cover-EM (a gold answer inside the prediction). Hit(τ, A*) is 1 when the
      trajectory (the recorded transcript, else the agent's outputs and every retrieved passage) contains a
      gold answer. The `generator` turns are frozen and get no reward.
    Outcome (`episode.reward`): R."""

    def __init__(self, options: QAgentOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            clear(episode)
            agent = episode.turns_of("agent")
            submodule = bool(episode.turns_of("generator"))
            golds = gold_answers(episode)
            if self.options.stage == 1:
                recorded = QAgentRecord.of(episode).agent_answer
                own = recorded if recorded is not None else ("" if submodule else episode.answer)
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
            place(agent, reward, self.options.placement)
            record(episode, reward, terms)

    @staticmethod
    def _trajectory(episode: Episode) -> str:
        """τ as text, tags blanked out (normalization would glue `<tag>word` into one token)."""
        segments = episode.meta.get(TRANSCRIPT)
        if segments:
            text = "\n".join(str(s.get("text", "")) for s in segments)
        else:
            parts = [t.completion for t in episode.turns_of("agent")]
            text = "\n".join(parts + passage_texts(episode.retrieved_passages()))
        return _TAG.sub(" ", text)


REWARD = RewardSpec(QAgentOptions, lambda options, _judge: QAgentReward(options))
