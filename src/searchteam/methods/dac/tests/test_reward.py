"""DAC's reward scheme on hand-built episodes, with rewards computed by hand from the paper's equations."""

from __future__ import annotations

import pytest

from searchteam.methods import build_reward_scheme
from searchteam.types import Episode
from tests.support.reward_episodes import episode, retrieval, rewards, turn


def dac_episode(answer: str, abstained: bool, searcher_meta: list[dict], qid: str = "q1") -> Episode:
    """Searcher turns at steps 0..n−1 (the last one stops); step 0 retrieves no gold, step 1 retrieves it."""
    turns = [turn("searcher", t, **meta) for t, meta in enumerate(searcher_meta)]
    turns.append(turn("generator", len(searcher_meta), f"<answer>{answer}</answer>"))
    return episode(
        "dac",
        turns,
        answer,
        qid=qid,
        retrievals=[retrieval(0, "France is in Europe."), retrieval(1, "Paris is the capital of France.")],
        meta={"abstention": True, "abstained": abstained},
    )


def test_dac_cross_verification_rewards_on_the_outcome():
    correct = dac_episode("Paris", False, [{}, {}, {}])
    abstained_on_sufficient = dac_episode("unknown", True, [{}, {}, {}], qid="q2")
    build_reward_scheme("dac")([correct, abstained_on_sufficient])
    assert rewards(correct) == [0.0, 0.0, 1.0, 1.0]
    assert rewards(abstained_on_sufficient) == [0.0, 0.0, 0.0, 0.0]
    assert correct.reward_terms["sufficient"] == 1.0


def test_dac_rewards_a_correct_abstention_on_insufficient_evidence():
    ep = dac_episode("unknown", True, [{}])  # only step 0 searched: its passage lacks the gold answer
    ep.retrievals = ep.retrievals[:1]
    build_reward_scheme("dac")([ep])
    assert rewards(ep) == [0.0, 1.0]
    assert ep.reward_terms["sufficient"] == 0.0


def test_dac_difference_rewards_from_partial_rewards_telescope():
    ep = dac_episode(
        "Paris", False, [{"partial_reward": 0.0}, {"partial_reward": 1.0}, {"partial_reward": 1.0}]
    )
    build_reward_scheme("dac")([ep])
    assert rewards(ep, "searcher") == [0.0, 1.0, 0.0]
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == 1.0


@pytest.mark.parametrize("final_abstained", [False, True])
def test_dac_difference_rewards_from_partial_abstentions_telescope(final_abstained):
    searcher = [{"partial_abstained": False}, {"partial_abstained": False}, {}]
    ep = dac_episode("unknown" if final_abstained else "Paris", final_abstained, searcher)
    build_reward_scheme("dac")([ep])
    # R(E≤0) = 0 (no gold yet), R(E≤1) = 1 (gold retrieved at step 1, accepted), last = final r_S
    final = 0.0 if final_abstained else 1.0
    assert rewards(ep, "searcher") == [0.0, 1.0, final - 1.0]
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == final


def test_dac_probe_generator_calls_are_not_rewarded_and_differences_telescope():
    # the team's layout (§3.4): G(Q, E≤0) probed before search 1 (a frozen generator call), the final call's
    # abstention recorded on the last search turn, nothing on the <stop> turn
    searcher = [{"partial_abstained": True}, {"partial_abstained": False}, {}]
    ep = dac_episode("Paris", False, searcher)
    probe = turn("generator", 1, "<answer>unknown</answer>", probe=True, frozen=True, evidence_step=0)
    ep.turns.insert(2, probe)
    build_reward_scheme("dac")([ep])
    assert rewards(ep) == [0.0, 1.0, None, 0.0, 1.0]  # s(0) = 0, s(1) = 1 = r_S; r_G = EM = 1
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == 1.0
    assert ep.reward_terms["hard_positives"] == 0.0


def test_dac_ignores_retrievals_after_the_searcher_and_scores_hard_positives_with_s_1():
    ep = dac_episode("unknown", True, [{}])
    ep.retrievals[1].step = 5  # e.g. distractors fetched for a hard positive after the search loop
    ep.turns.append(turn("generator", 1, "<answer>Paris</answer>", hard_positive=True))
    ep.turns.append(turn("generator", 1, "", hard_positive=True, answer="unknown", abstained=True))
    build_reward_scheme("dac", {"difference_rewards": False})([ep])
    assert rewards(ep) == [0.0, 1.0, 1.0, 0.0]


def test_dac_hard_positive_that_fails_where_the_clean_answer_succeeded_gets_an_sft_target():
    """Appendix D, Eq. 7: D_SFT = {(Q, E′, G(Q, E)) : a(Q, G(Q, E)) = 1, a(Q, G(Q, E′)) = 0}."""
    ep = dac_episode("Paris", False, [{}, {}])
    ep.turns.append(turn("generator", 2, "<answer>Lyon</answer>", hard_positive=True, answer="Lyon"))
    ep.turns.append(turn("generator", 2, "<answer>Paris</answer>", hard_positive=True, answer="Paris"))
    build_reward_scheme("dac")([ep])
    clean, wrong, right = ep.turns_of("generator")
    assert wrong.sft_target == clean.completion == "<answer>Paris</answer>"
    assert right.sft_target is None and clean.sft_target is None
    ep.answer = "Rome"  # the clean answer is wrong: no pseudo-target
    build_reward_scheme("dac")([ep])
    assert all(t.sft_target is None for t in ep.turns)
