"""The outcome reward of the baselines, the reward registry and the LLM judge's plumbing; each method's own
scheme is tested in its folder (methods/<m>/tests/test_reward.py)."""

from __future__ import annotations

import logging

import pytest

from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import build_reward_scheme, reward_methods
from searchteam.rewards.judge import judge_request, load_judge_prompts, parse_verdict
from tests.support.reward_episodes import F1_PARIS_FRANCE, episode, rewards, turn

# ---- outcome baselines ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "options", "expected"),
    [
        ("search_r1", None, 0.0),
        ("static_pipeline", None, F1_PARIS_FRANCE),
        ("ircot", None, 0.0),
        ("naive_rag", {"metric": "cover_em"}, 1.0),
        ("direct", {"metric": "f1"}, F1_PARIS_FRANCE),
    ],
)
def test_outcome_reward_on_every_turn(method, options, expected):
    ep = episode(method, [turn("a", 0), turn("b", 1)], "Paris France")
    build_reward_scheme(method, options)([ep])
    assert rewards(ep) == pytest.approx([expected, expected])
    assert ep.reward_terms["cover_em"] == 1.0


def test_outcome_reward_on_the_last_turn_only():
    ep = episode("search_r1", [turn("agent", 0), turn("agent", 1), turn("agent", 2)], "paris")
    build_reward_scheme("search_r1", {"placement": "last_turn"})([ep])
    assert rewards(ep) == [0.0, 0.0, 1.0]


# ---- registry and judge plumbing -----------------------------------------------------------------------


def test_registry_errors_name_what_was_wrong():
    assert {"mask", "qagent", "decor", "dac", "jade", "search_r1"} <= set(reward_methods())
    with pytest.raises(ValueError, match="known methods: .*decor"):
        build_reward_scheme("nope")
    with pytest.raises(ValueError, match="beta.*Allowed options: alpha, lam"):
        build_reward_scheme("decor", {"beta": 0.4})
    with pytest.raises(ValueError, match="alpha"):
        build_reward_scheme("decor", {"alpha": 1.5})
    with pytest.raises(ValueError, match="stage"):
        build_reward_scheme("qagent", {"stage": 3})
    with pytest.raises(ValueError, match="metric"):
        build_reward_scheme("search_r1", {"metric": "bleu"})


def test_a_judge_given_to_a_scheme_without_one_is_reported(caplog):
    with caplog.at_level(logging.WARNING):
        build_reward_scheme("mask", judge=ScriptedLLM([]))
    assert "uses no judge" in caplog.text


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("<verdict>YES</verdict>", True),
        ("reasoning... <verdict> no </verdict>", False),
        ("<verdict>NO</verdict> then <verdict>Yes", True),
        ("YES.", True),
        ("no", False),
        ("Yes, because the answer is right", None),
        ("", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


def test_judge_prompts_ask_for_a_verdict_tag_and_fill_their_fields():
    prompts = load_judge_prompts("decor_judge")
    assert set(prompts) == {"answer", "planner", "filter", "answerer"}
    assert all("<verdict>YES</verdict>" in p["system"] for p in prompts.values())
    request = judge_request("decor_judge", "answer", {"question": "Q?", "prediction": "P", "references": "R"})
    assert "Prediction: P" in request.messages[1]["content"] and request.sampling.stop == ("</verdict>",)
    assert request.continuation == "<verdict>"
    with pytest.raises(ValueError, match="needs field"):
        judge_request("decor_judge", "answer", {"question": "Q?"})
    with pytest.raises(ValueError, match="no 'critic' prompt"):
        judge_request("decor_judge", "critic", {})


def test_an_unknown_judge_prompt_file_is_refused_when_the_scheme_is_built():
    with pytest.raises(ValueError, match="no judge prompt file nope.yaml"):
        build_reward_scheme("decor", {"judge_prompts": "nope"}, judge=ScriptedLLM([]))
