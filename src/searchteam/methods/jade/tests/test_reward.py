"""JADE's reward scheme on hand-built episodes, with rewards computed by hand from the paper's equations."""

from __future__ import annotations

import pytest

from searchteam.methods import build_reward_scheme
from searchteam.types import Episode
from tests.support.reward_episodes import episode, retrieval, rewards, turn


def jade_episode(**meta) -> Episode:
    turns = [turn("planner", 1), turn("qr", 1, ok=False), turn("ag", 1), turn("as", 2)]
    return episode("jade", turns, "Paris", meta=meta)


def test_jade_cost_terms_and_format_penalty_shared_by_every_turn():
    ep = jade_episode(jade_rounds=2, jade_retrievals=4)
    build_reward_scheme("jade", {"alpha": 0.3, "beta": 0.6, "placement": "every_turn"})([ep])
    expected = 1.0 - (0.3 * 2 / 3 + 0.6 * 1.0)  # N_ret/3 is capped at 1
    assert rewards(ep) == pytest.approx([expected, -1.0, expected, expected])
    assert ep.reward == pytest.approx(expected)
    assert ep.reward_terms["format_errors"] == 1.0


def test_jade_default_is_eq_8_global_reward_on_the_terminal_step_only():
    ep = jade_episode(jade_rounds=1, jade_retrievals=1)
    build_reward_scheme("jade")([ep])
    expected = 1.0 - (0.05 / 3 + 0.05 / 3)  # R_global = 0.9667
    assert rewards(ep) == pytest.approx([0.0, -1.0, 0.0, expected])  # r_format + 1[terminal]·R_global


def test_jade_default_returns_count_the_global_reward_once():
    # the example: 4 turns, R_global = 0.967; γ = 1 returns are 0.967 each by default, while
    # every_turn placement sums it once per remaining turn (3.87, 2.90, 1.93, 0.97)
    def returns(placement: str | None) -> list[float]:
        turns = [turn("planner", 1), turn("qr", 1), turn("ag", 1), turn("as", 2)]
        ep = episode("jade", turns, "Paris", meta={"jade_rounds": 1, "jade_retrievals": 1})
        build_reward_scheme("jade", {"placement": placement} if placement else None)([ep])
        return [sum(rewards(ep)[i:]) for i in range(4)]

    r_global = 1.0 - 0.1 / 3
    assert returns(None) == pytest.approx([r_global] * 4)
    assert returns("every_turn") == pytest.approx([4 * r_global, 3 * r_global, 2 * r_global, r_global])


def test_jade_counts_turns_and_retrievals_when_the_team_did_not_record_them():
    ep = jade_episode()
    ep.retrievals = [retrieval(1, "a"), retrieval(1, "b"), retrieval(2, "c")]
    build_reward_scheme("jade", {"alpha": 0.3, "beta": 0.3})([ep])
    assert ep.reward_terms["rounds"] == 1.0 and ep.reward_terms["retrievals"] == 3.0
    assert ep.reward == pytest.approx(1.0 - 0.3 / 3 - 0.3)
