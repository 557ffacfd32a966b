"""QAgent's reward scheme on hand-built episodes, with rewards computed by hand from the paper's equations."""

from __future__ import annotations

import pytest

from searchteam.methods import build_reward_scheme
from tests.support.reward_episodes import episode, retrieval, rewards, turn


def test_qagent_stage1_needs_every_agent_turn_well_formed():
    ok = episode("qagent", [turn("agent", 0), turn("agent", 1)], "Paris")
    bad = episode("qagent", [turn("agent", 0, ok=False), turn("agent", 1)], "Paris", qid="q2")
    wrong = episode("qagent", [turn("agent", 0)], "Lyon", qid="q3")
    build_reward_scheme("qagent", {"stage": 1})([ok, bad, wrong])
    assert rewards(ok) == [1.0, 1.0]
    assert rewards(bad) == [0.0, 0.0]
    assert rewards(wrong) == [0.0]
    assert bad.reward_terms == {"stage": 1.0, "format_ok": 0.0, "agent_em": 1.0}


def test_qagent_stage1_in_submodule_mode_scores_the_agents_own_answer():
    answered = episode(
        "qagent", [turn("agent"), turn("generator", 1)], "Lyon", meta={"agent_answer": "Paris"}
    )
    silent = episode("qagent", [turn("agent"), turn("generator", 1)], "Paris", qid="q2")
    build_reward_scheme("qagent")([answered, silent])
    assert rewards(answered) == [1.0, None]
    assert rewards(silent) == [0.0, None]


def test_qagent_stage2_rewards_the_frozen_generator_plus_half_a_hit():
    gold_retrieved = episode(
        "qagent",
        [turn("agent", 0), turn("agent", 1), turn("generator", 2)],
        "It is Paris.",
        retrievals=[retrieval(0, "Paris is the capital of France.")],
    )
    only_in_trajectory = episode(
        "qagent",
        [turn("agent", 0), turn("generator", 1)],
        "Lyon",
        qid="q2",
        retrievals=[retrieval(0, "France is a country.")],
        meta={"transcript": [{"source": "model", "text": "<plan>maybe Paris</plan>"}]},
    )
    missed = episode("qagent", [turn("agent", 0), turn("generator", 1)], "Lyon", qid="q3")
    build_reward_scheme("qagent", {"stage": 2})([gold_retrieved, only_in_trajectory, missed])
    assert rewards(gold_retrieved) == [1.5, 1.5, None]
    assert rewards(only_in_trajectory) == [0.5, None]
    assert rewards(missed) == [0.0, None]
    assert gold_retrieved.reward_terms == {"stage": 2.0, "generator_score": 1.0, "hit": 1.0}


def test_qagent_stage2_refuses_end_to_end_episodes():
    with pytest.raises(ValueError, match="mode=submodule"):
        build_reward_scheme("qagent", {"stage": 2})([episode("qagent", [turn("agent")], "Paris")])
