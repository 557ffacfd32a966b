"""JADE's global shared reward with a local format penalty (Eq. 6-8)."""

from __future__ import annotations

from pydantic import Field

from searchteam.methods.jade.team import JadeRecord
from searchteam.metrics import f1_score
from searchteam.rewards.base import (
    Placement,
    RewardOptions,
    RewardSpec,
    clear,
    gold_answers,
    record,
    trained_turns,
)
from searchteam.types import Episode


class JadeOptions(RewardOptions):
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
    Outcome (`episode.reward`): R_global."""

    def __init__(self, options: JadeOptions) -> None:
        self.options = options

    def __call__(self, episodes: list[Episode]) -> None:
        opts = self.options
        for episode in episodes:
            clear(episode)
            f1 = f1_score(episode.answer, gold_answers(episode))
            recorded = JadeRecord.of(episode)
            rounds = (
                recorded.jade_rounds if recorded.jade_rounds is not None else len(episode.turns_of("planner"))
            )
            retrievals = (
                recorded.jade_retrievals if recorded.jade_retrievals is not None else len(episode.retrievals)
            )
            cost = opts.alpha * min(rounds / opts.cost_limit, 1.0) + opts.beta * min(
                retrievals / opts.cost_limit, 1.0
            )
            global_reward = f1 - cost
            turns = trained_turns(episode)
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
            record(episode, global_reward, terms)


REWARD = RewardSpec(JadeOptions, lambda options, _judge: JadeReward(options))
