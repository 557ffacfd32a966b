"""M-ASK's reward scheme on hand-built episodes, with rewards computed by hand from the paper's equations."""

from __future__ import annotations

import pytest

from searchteam.methods import build_reward_scheme
from searchteam.types import Episode, Turn
from tests.support.reward_episodes import F1_PARIS_FRANCE, episode, rewards, turn


def mask_iteration(t: int, answer: str | None = None, **turn_meta) -> list[Turn]:
    """Search, summary, update (and answer) of turn t, all at step t; `turn_meta` may add `turn=t`."""
    turns = [
        turn("search", t, action="search", **turn_meta),
        turn("summary", t, **turn_meta),
        turn("update", t, **turn_meta),
    ]
    if answer is not None:
        turns.append(turn("answer", t, turn=t, final=False, predicted_answer=answer))
    return turns


def test_mask_training_episode_turn_rewards():
    turns = [
        turn("plan", 0, turn=0, predicted_answer="Lyon"),
        *mask_iteration(1, "Paris France", turn=1),
        *mask_iteration(2, "Paris", turn=2),
        turn("search", 3, turn=3, action="end"),
    ]
    ep = episode("mask", turns, "Paris")
    build_reward_scheme("mask")([ep])
    assert rewards(ep, "plan") == [0.0]
    assert rewards(ep, "answer") == pytest.approx([F1_PARIS_FRANCE, 1.0])
    gain_1, gain_2 = F1_PARIS_FRANCE, 1.0 - F1_PARIS_FRANCE
    assert rewards(ep, "search") == pytest.approx([gain_1, gain_2, 0.0])
    assert rewards(ep, "summary") == rewards(ep, "update") == pytest.approx([gain_1, gain_2])
    assert ep.reward == 1.0
    assert ep.reward_terms["imputed_turns"] == 0.0


def test_mask_format_penalty_is_off_by_default_and_lowers_only_broken_turns():
    def scored(options: dict) -> Episode:
        turns = [
            turn("plan", 0, ok=False, turn=0, predicted_answer="Lyon"),
            turn("search", 1, turn=1, action="search"),
            turn("summary", 1, ok=False, turn=1),
            turn("update", 1, turn=1),
            turn("answer", 1, turn=1, final=False, predicted_answer="Paris"),
        ]
        ep = episode("mask", turns, "Paris")
        build_reward_scheme("mask", options)([ep])
        return ep

    paper = scored({})
    assert rewards(paper) == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0])  # Eq. 2-3 alone: formats do not count
    penalized = scored({"format_penalty": 1.0})
    assert rewards(penalized) == pytest.approx([-1.0, 1.0, 0.0, 1.0, 1.0])
    assert penalized.reward == 1.0 and penalized.reward_terms["format_errors"] == 2.0


def test_mask_inference_episode_carries_answers_forward_and_uses_the_final_answer_last():
    turns = [
        turn("plan", 0, predicted_answer="Paris France"),
        *mask_iteration(1),
        *mask_iteration(2),
        turn("search", 3, action="end"),
        turn("answer", 2, turn=None, final=True, predicted_answer="Paris"),
    ]
    ep = episode("mask", turns, "Paris")
    build_reward_scheme("mask")([ep])
    assert rewards(ep, "search") == pytest.approx([0.0, 1.0 - F1_PARIS_FRANCE, 0.0])
    assert rewards(ep, "answer") == [1.0]
    assert ep.reward_terms["imputed_turns"] == 2.0


@pytest.mark.parametrize(
    ("a0", "per_turn", "final", "last_f1"),
    [
        ("Lyon", ["Paris France", "Lyon", "Paris"], "Paris", 1.0),
        ("Paris", ["Lyon", None, None], "Marseille", 0.0),
        ("Paris France", [None, "Paris", None], "Paris France", F1_PARIS_FRANCE),
    ],
)
def test_mask_iteration_rewards_telescope(a0, per_turn, final, last_f1):
    turns = [turn("plan", 0, predicted_answer=a0)]
    for t, answer in enumerate(per_turn, 1):
        turns += mask_iteration(t, answer)
    turns.append(turn("answer", len(per_turn), turn=None, final=True, predicted_answer=final))
    ep = episode("mask", turns, final)
    build_reward_scheme("mask")([ep])
    terms = ep.reward_terms
    assert terms["last_turn_f1"] == pytest.approx(last_f1)
    assert sum(rewards(ep, "search")) == pytest.approx(last_f1 - terms["plan_f1"])
    assert sum(rewards(ep, "summary")) == pytest.approx(terms["gain"])
