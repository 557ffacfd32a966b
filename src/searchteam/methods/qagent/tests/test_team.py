import asyncio

import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.qagent.team import parse_round
from searchteam.rl.warm_start.data import policy_turns
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(id="q", question="Which novelist was German?", golden_answers=["Thomas Mann"])

THREE_QUERIES = (
    "<plan> Find the nationality of each novelist. </plan>\n<search>\n<query>Thomas Mann novelist</query>\n"
    "<query>David Guterson novelist</query>\n<query>German novelist</query>\n</search>"
)
ANSWER = (
    "<reflection> Thomas Mann was German. </reflection>\n"
    "<plan> Answer now. </plan>\n<answer> Thomas Mann </answer>"
)


def run(responder, options: dict | None = None, generator=None, **settings) -> tuple[Episode, TinyRetriever]:
    team = get_team("qagent", TeamSettings(options=options or {}, **settings))
    retriever = TinyRetriever(PASSAGES)
    llms = {"policy": ScriptedLLM(responder)} | ({"generator": generator} if generator else {})
    backends = make_backends(llms, retriever)
    episodes, _ = asyncio.run(
        run_episodes(team.run, "qagent", [QUESTION], backends, Sampling(), progress=False)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0], retriever


def search_then_answer(req: GenerationRequest) -> str:
    return ANSWER if "<information>" in req.continuation else THREE_QUERIES


def test_three_queries_are_retrieved_in_one_round_into_one_information_block():
    ep, retriever = run(search_then_answer, top_k=1)
    assert ep.answer == "Thomas Mann" and all(t.parsed_ok for t in ep.turns)
    assert [r.query for r in ep.retrievals] == [
        "Thomas Mann novelist",
        "David Guterson novelist",
        "German novelist",
    ]
    assert {r.step for r in ep.retrievals} == {0} and retriever.calls == [[r.query for r in ep.retrievals]]
    env = [s["text"] for s in ep.meta["transcript"] if s["source"] == "env"]
    assert len(env) == 1 and env[0].count("Doc ") == 3 and env[0].startswith("\n\n<information>")
    # env spans of the second call cover exactly the information block
    [[start, end]] = ep.turns[1].env_spans
    assert end - start == len(env[0])
    assert ep.states[0] == {
        "step": 0,
        "action": "search",
        "queries": [r.query for r in ep.retrievals],
        "passages": ["1", "2"],
        "retries": 0,
    }


def test_malformed_output_gets_a_retry_prompt_counted_and_flagged():
    def responder(req: GenerationRequest) -> str:
        if "invalid" not in req.continuation:
            return "I am not sure what to do."
        return search_then_answer(req)

    ep, _ = run(responder)
    assert ep.answer == "Thomas Mann"
    assert [t.parsed_ok for t in ep.turns] == [False, True, True] and "neither" in ep.turns[0].parse_error
    assert (
        ep.meta["transcript"][1]["source"] == "env" and "Let me try again" in ep.meta["transcript"][1]["text"]
    )
    assert ep.meta["retries"] == 1 and [s["retries"] for s in ep.states] == [1, 1, 1]


def test_retries_are_capped_then_the_answer_is_forced():
    def responder(req: GenerationRequest) -> str:
        return " Thomas Mann </answer>" if req.continuation.endswith("<answer>") else "rambling"

    ep, _ = run(responder, {"max_retries": 1}, max_turns=5)
    assert ep.meta["retries"] == 1 and len(ep.turns) == 3  # malformed, retry, malformed -> give up, forced
    assert ep.answer == "Thomas Mann" and ep.meta["transcript"][-2]["text"].endswith("<answer>")


def test_max_rounds_cap_searching():
    ep, _ = run(
        lambda req: THREE_QUERIES if not req.continuation.endswith("<answer>") else "x</answer>", max_turns=2
    )
    assert len(ep.retrievals) == 6 and [s["step"] for s in ep.states] == [0, 1]
    assert len(ep.turns) == 3 and ep.answer == "x"
    assert "no <reflection> after <information>" in ep.turns[1].parse_error


def test_submodule_mode_hands_deduplicated_passages_to_the_generator():
    generator = ScriptedLLM(lambda req: "<answer>Thomas Mann</answer>", name="frozen")

    def agent(req: GenerationRequest) -> str:
        # two rounds retrieve overlapping passages; the agent's own answer is kept aside
        return (
            "<plan>p</plan><search><query>German novelist</query></search>"
            if req.continuation.count("<information>") < 2
            else ANSWER.replace("Thomas Mann </answer>", "Paris </answer>")
        )

    ep, _ = run(agent, {"mode": "submodule"}, generator=generator, top_k=2)
    assert ep.answer == "Thomas Mann" and ep.meta["agent_answer"] == "Paris"
    assert [t.role for t in ep.turns] == ["agent", "agent", "agent", "generator"]
    gen = ep.turns[-1]
    assert gen.model == "frozen" and len(generator.requests) == 1 and gen.step == 3  # its model's name
    prompt = gen.messages[-1]["content"]
    assert prompt.count("Thomas Mann was a German novelist.") == 1 and prompt.count("Doc ") == 2
    assert QUESTION.question in prompt and "<plan>" not in prompt and "<information>" not in prompt


def test_submodule_generator_falls_back_to_the_policy_model():
    ep, _ = run(search_then_answer, {"mode": "submodule"})
    assert ep.turns[-1].role == "generator" and ep.turns[-1].model == "policy"
    assert ep.turns[-1].frozen is True  # §3.4's generator is frozen: never a training sample


def test_an_unfrozen_generator_is_a_training_sample():
    ep, _ = run(search_then_answer, {"mode": "submodule", "frozen_generator": False})
    assert ep.turns[-1].frozen is False
    assert [t.role for t in policy_turns(ep, roles=("generator",))] == ["generator"]


def test_an_unfrozen_generator_needs_submodule_mode_and_a_bool():
    with pytest.raises(ValueError, match="needs mode: submodule"):
        get_team("qagent", TeamSettings(options={"frozen_generator": False}))
    with pytest.raises(ValueError, match="true or false"):
        get_team("qagent", TeamSettings(options={"mode": "submodule", "frozen_generator": "no"}))


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="end_to_end, submodule"):
        get_team("qagent", TeamSettings(options={"mode": "both"}))


def test_parse_round_tolerates_common_slips():
    bare = parse_round("<plan>p</plan><search> Thomas Mann </search>", after_information=False)
    assert bare.kind == "search" and bare.queries == ["Thomas Mann"] and "no <query>" in bare.issues[0]
    many = parse_round("<plan>p</plan><search>" + "<query>a</query>" * 5 + "</search>", False)
    assert many.queries == ["a", "a", "a"] and "5 queries" in many.issues[0]
    assert parse_round("<search><query>a</query></search>", False).issues == ["no <plan> before <search>"]
    assert parse_round("<plan>p</plan><search></search>", False).kind == "malformed"
    cut = parse_round("<plan>p</plan><search><query>a</query><query>b</query><query>c", False)
    assert cut.kind == "search" and cut.queries == ["a", "b"] and "unclosed <search>" in cut.issues[0]
    assert parse_round("<plan>p</plan><search><query>a", False).kind == "malformed"
