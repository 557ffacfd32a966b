"""DECOR's reward scheme on hand-built episodes, with rewards computed by hand from the paper's equations."""

from __future__ import annotations

import logging

import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import build_reward_scheme
from searchteam.types import Episode
from tests.support.reward_episodes import F1_PARIS_FRANCE, episode, retrieval, rewards, turn


def decor_episode(answer: str, evidence: str, qid: str = "q1", *, filter_ok: bool = True) -> Episode:
    """Planner searches, filter keeps `evidence`, compressor (frozen), planner stops, answerer answers."""
    turns = [
        turn("planner", 1, "<think>t</think><search>capital of France</search>", query="capital of France"),
        turn("filter", 1, f"<think>t</think><filter>{evidence}</filter>", ok=filter_ok, evidence=evidence),
        turn("compressor", 1, "<facts>x</facts>", frozen=True),
        turn("planner", 2, "<think>t</think><search>None</search>", query=None),
        turn("answerer", 2, f"<think>t</think><answer>{answer}</answer>"),
    ]
    return episode(
        "decor",
        turns,
        answer,
        qid=qid,
        retrievals=[retrieval(1, "Paris is the capital of France.", query="capital of France")],
        states=[{"step": 1, "memory": [{"query": "capital of France", "evidence": evidence}]}],
    )


def test_decor_proxy_rewards_without_a_judge(caplog):
    good = decor_episode("Paris France", "Paris is the capital of France.")
    lazy = decor_episode("Lyon", "No relevant information.", qid="q2")
    scheme = build_reward_scheme("decor")
    with caplog.at_level(logging.WARNING):
        scheme([good, lazy])
        scheme([decor_episode("Paris", "Paris.")])
    assert sum("no judge configured" in r.message for r in caplog.records) == 1
    team = 0.5 * F1_PARIS_FRANCE + 0.5 * 1.0  # λ·F1 + (1−λ)·cover-EM proxy of the answer judge
    assert rewards(good) == pytest.approx([0.6 * team + 0.4] * 2 + [None] + [0.6 * team + 0.4] * 2)
    # lazy: team reward 0; the filter dropped the gold the documents had (−1); the memory lacks the answer,
    # so the wrong answerer is not blamed (+1); the STOP planner stopped on a memory without it (−1).
    assert rewards(lazy) == pytest.approx([0.4, -0.4, None, -0.4, 0.4])
    assert good.reward == pytest.approx(team)
    assert lazy.reward_terms["role_planner"] == 0.0


def test_decor_format_gate_gives_every_trained_turn_minus_one():
    ep = decor_episode("Paris", "Paris is the capital.", filter_ok=False)
    judge = ScriptedLLM(lambda r: "<verdict>YES</verdict>")
    build_reward_scheme("decor", judge=judge)([ep])
    assert rewards(ep) == [-1.0, -1.0, None, -1.0, -1.0]
    assert ep.reward == -1.0 and ep.reward_terms["format_ok"] == 0.0
    assert judge.requests == []


def test_decor_batches_every_judge_call_of_a_batch_into_one_generate_call():
    def verdicts(request: GenerationRequest) -> str:
        system = request.messages[0]["content"]
        if "planner agent" in system:
            return "I think it is fine."  # unparseable: the proxy decides
        if "expert evaluation model" in system:
            return "NO</verdict>"  # the reply continues the prefilled "<verdict>"
        return "YES</verdict>"

    judge = ScriptedLLM(verdicts)
    episodes = [
        decor_episode("Paris France", "Paris is the capital of France.", qid="q1"),
        decor_episode("Lyon", "No relevant information.", qid="q2"),
        decor_episode("Paris", "Paris.", qid="q3", filter_ok=False),
    ]
    build_reward_scheme("decor", {"alpha": 0.5, "lam": 0.4}, judge=judge)(episodes)
    assert judge.batch_sizes == [10]  # 2 judged episodes × (answer + 2 planners + filter + answerer)
    good, lazy, gated = episodes
    team = 0.4 * F1_PARIS_FRANCE  # the answer judge said NO
    assert rewards(good) == pytest.approx([0.5 * team + 0.5] * 2 + [None] + [0.5 * team + 0.5] * 2)
    # lazy: planners fall back to the proxy (+1, −1); the judge accepts the filter and the answerer
    assert rewards(lazy) == pytest.approx([0.5, 0.5, None, -0.5, 0.5])
    assert lazy.reward_terms["judge_unparsed"] == 2.0
    assert lazy.reward_terms["judge_calls"] == 5.0
    assert rewards(gated) == [-1.0, -1.0, None, -1.0, -1.0]
    first = judge.requests[0]
    assert "Paris France" in first.messages[1]["content"] and first.sampling.temperature == 0.0
