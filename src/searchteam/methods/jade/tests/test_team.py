import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.jade.team import parse_workflow
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(
    id="q", question="What nationality was the author of Buddenbrooks?", golden_answers=["German"]
)


def by_prompt(team, script: dict[str, list[str]]) -> ScriptedLLM:
    """Answer each request from the queue of the prompt (role) it was built from, found by its system text."""
    keys = {p["system"].strip(): key for key, p in team.prompts.items() if isinstance(p, dict)}

    def respond(request: GenerationRequest) -> str:
        queue = script[keys[request.messages[0]["content"]]]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return ScriptedLLM(respond)


async def run_one(script: dict[str, list[str]], **settings) -> Episode:
    team = get_team("jade", TeamSettings(**settings))
    backends = make_backends({"policy": by_prompt(team, script)}, TinyRetriever(PASSAGES))
    episodes, _ = await run_episodes(team.run, team.name, [QUESTION], backends, Sampling(), progress=False)
    assert episodes[0].error is None
    return episodes[0]


def user(turn) -> str:
    return turn.messages[-1]["content"]


async def test_serial_decomposition_expands_trace_and_later_subquestions_see_earlier_answers():
    ep = await run_one(
        {
            "planner": [
                "<workflow>QDS</workflow>",
                "<workflow>R, AG</workflow>",
                "<workflow>R, DS, AG</workflow>",
            ],
            "qds": ["<q1>Who wrote Buddenbrooks?</q1>\n<q2>What nationality was this novelist?</q2>"],
            "qr_serial": ["<query>Nationality of Thomas Mann</query>"],
            "ds": ["<id>0</id>"],
            "ag": ["<answer>Thomas Mann</answer>", "<answer>German</answer>"],
            "as": ["<answer>German</answer>"],
        },
        top_k=2,
    )
    roles = [t.role for t in ep.turns]
    assert roles == ["planner", "qds", "planner", "ag", "qr", "planner", "ds", "ag", "as"]
    assert ep.answer == "German" and all(t.parsed_ok for t in ep.turns)
    # round 1 expanded the trace: the root is decomposed, two pending sub-nodes follow it
    first = ep.states[0]["trace"]
    assert [n["status"] for n in first] == ["decomposed", "pending", "pending"]
    assert [n["mode"] for n in first] == ["root", "serial", "serial"]
    # the second sub-question is rewritten with the first one's answer before it is planned and searched
    resolve = ep.turns_of("qr")[0]
    assert "Who wrote Buddenbrooks?" in user(resolve) and "Answer 1: Thomas Mann" in user(resolve)
    planner = ep.turns_of("planner")[2]
    assert "Nationality of Thomas Mann" in user(planner) and "Buddenbrooks" not in user(planner)
    assert [r.query for r in ep.retrievals] == ["Who wrote Buddenbrooks?", "Nationality of Thomas Mann"]
    final = ep.states[-1]["trace"]
    assert final[2]["asked"] == "What nationality was this novelist?" and final[2]["answer"] == "German"
    assert ep.meta == {"jade_rounds": 3, "jade_retrievals": 2}
    assert [s["round"] for s in ep.states] == [1, 2, 3]


def parallel_script() -> dict[str, list[str]]:
    return {
        "planner": ["<workflow>QDP</workflow>", "<workflow>R, AG</workflow>"],
        "qdp": ["<q1>Which country was Thomas Mann from?</q1><q2>Which country is David Guterson from?</q2>"],
        "ag": ["<answer>Germany</answer>", "<answer>USA</answer>"],
        "as": ["<answer>Thomas Mann</answer>"],
    }


async def test_answer_summarizer_sees_the_trace_but_no_documents():
    ep = await run_one(parallel_script())
    summary = user(ep.turns_of("as")[0])
    assert QUESTION.question in summary
    assert "Sub-question 1: Which country was Thomas Mann from?\nAnswer 1: Germany" in summary
    assert "Sub-question 2: Which country is David Guterson from?\nAnswer 2: USA" in summary
    assert not any(p.text in summary for p in PASSAGES)


async def test_parallel_subquestions_are_solved_without_each_others_answers():
    ep = await run_one(parallel_script())
    assert [t.role for t in ep.turns] == ["planner", "qdp", "planner", "ag", "planner", "ag", "as"]
    second_ag = ep.turns_of("ag")[1]
    assert "David Guterson" in user(second_ag) and "Germany" not in user(second_ag)
    assert ep.states[0]["trace"][1]["mode"] == "parallel"


async def test_invalid_workflow_is_flagged_and_falls_back_to_retrieve_then_answer():
    ep = await run_one({"planner": ["<workflow>DS, R, AG</workflow>"], "ag": ["<answer>German</answer>"]})
    planner = ep.turns_of("planner")[0]
    assert not planner.parsed_ok and "R must appear before DS" in planner.parse_error
    assert [t.role for t in ep.turns] == ["planner", "ag"] and len(ep.retrievals) == 1
    assert ep.states[0]["workflow"] == ["R", "AG"]
    # a root solved directly needs no summarizer (Appendix F case 2)
    assert ep.answer == "German" and ep.meta == {"jade_rounds": 1, "jade_retrievals": 1}


async def test_a_fixed_workflow_replaces_the_planner():
    ep = await run_one({"ag": ["<answer>German</answer>"]}, top_k=2, options={"workflow": "R, AG"})
    assert [t.role for t in ep.turns] == ["ag"] and len(ep.retrievals) == 1
    assert user(ep.turns[0]).count("Document") == 2  # every retrieved document, no selector
    assert ep.states[0]["workflow"] == ["R", "AG"] and ep.answer == "German"


@pytest.mark.parametrize(
    ("workflow", "reason"),
    [("QDS", "cannot decompose"), ("AG, R", "AG must be the last"), ("R, XX", "unknown")],
)
def test_a_fixed_workflow_must_be_a_valid_solving_workflow(workflow, reason):
    with pytest.raises(ValueError, match=reason):
        get_team("jade", TeamSettings(options={"workflow": workflow}))


async def test_decomposition_without_subquestions_solves_the_node_instead():
    ep = await run_one(
        {
            "planner": ["<workflow>QDS</workflow>"],
            "qds": ["1. Who wrote it?"],
            "ag": ["<answer>German</answer>"],
        }
    )
    assert [t.role for t in ep.turns] == ["planner", "qds", "ag"]
    assert not ep.turns_of("qds")[0].parsed_ok and ep.answer == "German"


async def test_selector_keeps_only_listed_ids():
    ep = await run_one(
        {
            "planner": ["<workflow>QR, R, DS, AG</workflow>"],
            "qr": ["<query>Thomas Mann novelist</query>"],
            "ds": ["<id>1</id>"],
            "ag": ["<answer>German</answer>"],
        },
        top_k=3,
    )
    assert ep.retrievals[0].query == "Thomas Mann novelist"
    shown = [p.text in user(ep.turns_of("ag")[0]) for p in ep.retrievals[0].passages]
    assert shown == [False, True, False]
    # the selector judges documents against the node's question, not the search query
    assert QUESTION.question in user(ep.turns_of("ds")[0])


async def test_bad_selector_ids_are_flagged_and_every_document_kept():
    ep = await run_one(
        {
            "planner": ["<workflow>R, DS, AG</workflow>"],
            "ds": ["<id>9</id>"],
            "ag": ["<answer>German</answer>"],
        },
        top_k=3,
    )
    ds = ep.turns_of("ds")[0]
    assert not ds.parsed_ok and "out of range" in ds.parse_error
    assert all(p.text in user(ep.turns_of("ag")[0]) for p in ep.retrievals[0].passages)


async def test_rounds_are_capped():
    ep = await run_one(
        {
            "planner": ["<workflow>QDS</workflow>"],
            "qds": ["<q1>A narrower question?</q1>"],
            "as": ["<answer>?</answer>"],
        },
        max_turns=3,
    )
    assert [t.role for t in ep.turns] == ["planner", "qds"] * 3 + ["as"]
    assert ep.meta == {"jade_rounds": 3, "jade_retrievals": 0}
    assert [n["status"] for n in ep.states[-1]["trace"]] == ["decomposed"] * 3 + ["pending"]
    assert "(no answer)" in user(ep.turns_of("as")[0])


@pytest.mark.parametrize(
    ("text", "steps", "ok"),
    [
        ("<workflow>R, DS, AG</workflow>", ("R", "DS", "AG"), True),
        ("<workflow>QR -> RA -> AG</workflow>", ("QR", "R", "AG"), True),
        ("<workflow>AG</workflow>", ("AG",), True),
        ("<workflow>qdp</workflow>", ("QDP",), True),
        ("<workflow>QDS, R, AG</workflow>", ("R", "AG"), False),
        ("<workflow>R, DS</workflow>", ("R", "AG"), False),
        ("<workflow>DS, AG</workflow>", ("R", "AG"), False),
        ("<workflow>AG, R, AG</workflow>", ("R", "AG"), False),
        ("<workflow>R, Search, AG</workflow>", ("R", "AG"), False),
        ("<workflow></workflow>", ("R", "AG"), False),
        ("R, AG", ("R", "AG"), False),
    ],
)
def test_parse_workflow(text, steps, ok):
    workflow = parse_workflow(text)
    assert workflow.steps == steps and workflow.ok is ok


# short replies keep the real-model test quick; the format is what is exercised


def given(questions: list[str], mode: str | None = None) -> Question:
    meta = {"subquestions": questions} | ({"subquestion_mode": mode} if mode else {})
    return QUESTION.model_copy(update={"meta": meta})


async def run_given(question: Question, script: dict[str, list[str]]) -> Episode:
    team = get_team("jade", TeamSettings(top_k=2, options={"workflow": "R, AG", "decomposition": "given"}))
    backends = make_backends({"policy": by_prompt(team, script)}, TinyRetriever(PASSAGES))
    episodes, _ = await run_episodes(team.run, team.name, [question], backends, Sampling(), progress=False)
    return episodes[0]


async def test_a_given_decomposition_replaces_the_planners_first_round():
    ep = await run_given(
        given(["Which country was Thomas Mann from?", "Which country is David Guterson from?"]),
        {"ag": ["<answer>Germany</answer>", "<answer>USA</answer>"], "as": ["<answer>Thomas Mann</answer>"]},
    )
    assert [t.role for t in ep.turns] == ["ag", "ag", "as"] and ep.answer == "Thomas Mann"
    assert [r.query for r in ep.retrievals] == [
        "Which country was Thomas Mann from?",
        "Which country is David Guterson from?",
    ]
    assert [n["mode"] for n in ep.states[0]["trace"]] == ["root", "parallel", "parallel"]
    assert ep.meta == {"jade_rounds": 2, "jade_retrievals": 2, "jade_given": True}


async def test_given_serial_subquestions_are_rewritten_with_earlier_answers():
    ep = await run_given(
        given(["Who wrote Buddenbrooks?", "What nationality was this novelist?"], "serial"),
        {
            "qr_serial": ["<query>Nationality of Thomas Mann</query>"],
            "ag": ["<answer>Thomas Mann</answer>", "<answer>German</answer>"],
            "as": ["<answer>German</answer>"],
        },
    )
    assert [t.role for t in ep.turns] == ["ag", "qr", "ag", "as"]
    assert ep.retrievals[1].query == "Nationality of Thomas Mann" and ep.answer == "German"


async def test_a_question_without_subquestions_is_planned_as_usual():
    ep = await run_given(QUESTION, {"ag": ["<answer>German</answer>"]})
    assert [t.role for t in ep.turns] == ["ag"] and ep.meta["jade_given"] is False


@pytest.mark.parametrize(
    ("meta", "reason"),
    [
        ({"subquestions": "Who wrote it?"}, "non-empty list"),
        ({"subquestions": ["Who wrote it?", ""]}, "non-empty list"),
        ({"subquestions": ["Who wrote it?"], "subquestion_mode": "nested"}, "'parallel' or 'serial'"),
    ],
)
async def test_a_malformed_given_decomposition_fails_the_question_with_a_clear_error(meta, reason):
    ep = await run_given(QUESTION.model_copy(update={"meta": meta}), {"ag": ["<answer>German</answer>"]})
    assert reason in ep.error and "question q" in ep.error


def test_the_decomposition_source_must_be_known():
    with pytest.raises(ValueError, match="'decomposition' must be one of planner, given"):
        get_team("jade", TeamSettings(options={"decomposition": "oracle"}))
