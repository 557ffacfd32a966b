"""M-ASK control flow with the scripted double, and one end-to-end run of the real default model."""

from __future__ import annotations

import asyncio

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.mask.team import KnowledgeState, Operation, Step, parse_operation, parse_plan
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(
    id="q",
    question="Which novelist was German, David Guterson or Thomas Mann?",
    golden_answers=["Thomas Mann"],
)
PLAN = (
    "<q1>Was Thomas Mann German?</q1><a1>unknown</a1><q2>Was David Guterson German?</q2><a2>no</a2>"
    "<predicted_answer>Thomas Mann</predicted_answer>"
)
ROLE_MARKERS = {
    "plan": "decompose a given question",
    "search": "search query generation assistant",
    "summary": "evidence extraction assistant",
    "update": "update detection assistant",
    "answer": "final answer generation assistant",
}


def role_of(req: GenerationRequest) -> str:
    system = req.messages[0]["content"]
    return next(role for role, marker in ROLE_MARKERS.items() if marker in system)


def scripted(replies: dict[str, list[str] | str]) -> ScriptedLLM:
    """Each role answers from its own list (in order) or with a fixed string."""
    queues = {role: list(r) if isinstance(r, list) else r for role, r in replies.items()}

    def respond(req: GenerationRequest) -> str:
        reply = queues[role_of(req)]
        return reply.pop(0) if isinstance(reply, list) else reply

    return ScriptedLLM(respond)


def run(llm: ScriptedLLM, *, max_turns: int = 4, training: bool = False, **options: str) -> Episode:
    team = get_team("mask", TeamSettings(max_turns=max_turns, top_k=2, options=options))
    backends = make_backends({"policy": llm}, TinyRetriever(PASSAGES))
    episodes, _ = asyncio.run(
        run_episodes(team.run, "mask", [QUESTION], backends, Sampling(), progress=False, training=training)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0]


def default_replies(**overrides: list[str] | str) -> dict[str, list[str] | str]:
    return {
        "plan": PLAN,
        "search": "<search>Thomas Mann nationality</search>",
        "summary": "<evidence>Thomas Mann was a German novelist.</evidence>",
        "update": "<Update>t1</Update>",
        "answer": "<predicted_answer>Thomas Mann</predicted_answer>",
        **overrides,
    }


def test_update_replaces_step_and_add_appends():
    state = KnowledgeState("q?", (Step("a?", "unknown"), Step("b?", "B")), "x")
    updated = state.apply(Operation("update", 1), "a2?", "A")
    assert updated.trajectory == (Step("a2?", "A"), Step("b?", "B"))
    added = state.apply(Operation("add"), "c?", "C")
    assert added.trajectory == (*state.trajectory, Step("c?", "C"))
    assert state.trajectory == (Step("a?", "unknown"), Step("b?", "B"))  # states are values

    llm = scripted(
        default_replies(
            search=[
                "<search>Thomas Mann nationality</search>",
                "<search>Guterson nationality</search>",
                "<end>",
            ],
            summary=[
                "<evidence>Thomas Mann was German.</evidence>",
                "<evidence>Guterson is American.</evidence>",
            ],
            update=["<Update>t1</Update>", "<Add>t3</Add>"],
        )
    )
    ep = run(llm)
    final = ep.states[-1]["thinking_trajectory"]
    assert final == [
        {"query": "Thomas Mann nationality", "answer": "Thomas Mann was German."},
        {"query": "Was David Guterson German?", "answer": "no"},
        {"query": "Guterson nationality", "answer": "Guterson is American."},
    ]
    assert [t.meta["op"] for t in ep.turns_of("update")] == ["update", "add"]
    assert ep.answer == "Thomas Mann"


def test_end_stops_the_loop_and_tmax_caps_it():
    ep = run(scripted(default_replies(search="<end>")))
    assert [t.role for t in ep.turns] == ["plan", "search", "answer"]
    assert ep.retrievals == [] and ep.turns_of("search")[0].meta["action"] == "end"

    ep = run(scripted(default_replies()), max_turns=3)
    assert len(ep.turns_of("search")) == 3 and len(ep.retrievals) == 3
    assert [t.role for t in ep.turns[:5]] == ["plan", "search", "summary", "update", "search"]
    assert [t.step for t in ep.turns_of("update")] == [1, 2, 3]


def test_training_answers_every_turn_inference_once():
    ep = run(scripted(default_replies()), max_turns=3, training=False)
    assert len(ep.turns_of("answer")) == 1 and ep.turns_of("answer")[0].meta["final"]

    answers = [f"<predicted_answer>guess {i}</predicted_answer>" for i in range(1, 4)]
    ep = run(scripted(default_replies(answer=answers)), max_turns=3, training=True)
    calls = ep.turns_of("answer")
    assert [t.meta["turn"] for t in calls] == [1, 2, 3] and [t.step for t in calls] == [1, 2, 3]
    assert [t.meta["predicted_answer"] for t in calls] == ["guess 1", "guess 2", "guess 3"]
    assert [s["predicted_answer"] for s in ep.states] == ["Thomas Mann", "guess 1", "guess 2", "guess 3"]
    assert ep.turns_of("plan")[0].meta["predicted_answer"] == "Thomas Mann"  # a_0 for F1(a_0)
    assert ep.answer == "guess 3"


def test_answer_reply_continues_the_prefilled_tag():
    ep = run(scripted(default_replies(search="<end>", answer="Thomas Mann</predicted_answer>")))
    (turn,) = ep.turns_of("answer")
    assert turn.continuation == "<predicted_answer>" and turn.parsed_ok
    assert ep.answer == "Thomas Mann"
    ep = run(scripted(default_replies(search="<end>", answer="Mann, a German novelist who wrote")))
    assert not ep.turns_of("answer")[0].parsed_ok and "Mann" in ep.answer


def test_answer_reads_the_retrieved_passages_only_when_asked():
    llm = scripted(default_replies(search=["<search>German novelist</search>", "<end>"]))
    ep = run(llm, answer_reads="passages")
    (turn,) = ep.turns_of("answer")
    user = turn.messages[-1]["content"]
    assert "Doc 1 (Title: Thomas Mann) Thomas Mann was a German novelist." in user
    assert "Thinking trajectory:" in user and ep.answer == "Thomas Mann"
    (plain,) = run(scripted(default_replies(search=["<search>German novelist</search>", "<end>"]))).turns_of(
        "answer"
    )
    assert "Documents:" not in plain.messages[-1]["content"]


def test_search_prompt_shows_history_and_trajectory():
    llm = scripted(
        default_replies(
            search=["<search>Thomas Mann nationality</search>", "<end>"],
            summary=["<evidence>Mann was a German novelist.</evidence>"],
        )
    )
    ep = run(llm)
    first, second = (t.messages[-1]["content"] for t in ep.turns_of("search"))
    assert "(empty)" in first and "Was David Guterson German?" in first
    assert "1. Query: Thomas Mann nationality Summary: Mann was a German novelist." in second
    # the Search Agent sees the state, never the raw documents
    assert all(PASSAGES[0].text not in t.messages[-1]["content"] for t in ep.turns_of("search"))
    assert PASSAGES[0].text in ep.turns_of("summary")[0].messages[-1]["content"]


def test_search_prompt_ends_with_the_papers_reminder():
    ep = run(scripted(default_replies(search="<end>")))
    reminder = (
        "Output only one of the following two formats:\n<search>Your query here</search>\n<end>\n\n"
        "Do not include any extra text, explanations, or other tags."
    )
    (search,) = ep.turns_of("search")
    assert search.messages[-1]["content"].endswith(f"Search history:\n(empty)\n\n{reminder}")
    assert search.messages[1]["content"].endswith(reminder)  # the example exchange shows the same turn


def test_update_agent_input_is_the_same_in_training_and_at_inference():
    def update_prompts(training: bool) -> list[str]:
        answers = [f"<predicted_answer>guess {i}</predicted_answer>" for i in range(1, 3)]
        ep = run(scripted(default_replies(answer=answers)), max_turns=2, training=training)
        return [t.messages[-1]["content"] for t in ep.turns_of("update")]

    trained, inferred = update_prompts(True), update_prompts(False)
    assert trained == inferred and len(trained) == 2  # a_1 = "guess 1" in training, a_0 at inference
    assert all("guess" not in p and "Predicted answer" not in p for p in trained)
    assert trained[1].startswith(f"Original question: {QUESTION.question}\nThinking trajectory:\nt1. Q:")


def test_malformed_plan_and_update_fall_back_and_are_flagged():
    plan = parse_plan("I think it is Mann.", "Q?")
    assert plan.state.trajectory == (Step("Q?", "unknown"),) and plan.errors
    partial = parse_plan("<q1>A?</q1><a1>Mann</a1><q2>B?</q2>", "Q?")
    assert partial.state.trajectory[1] == Step("B?", "unknown") and partial.state.predicted_answer == "Mann"
    op, error = parse_operation("<Update>t5</Update>", 2)
    assert op == Operation("add") and "t1..t2" in error
    assert parse_operation("<update>τ_2</update>", 2) == (Operation("update", 2), None)

    llm = scripted(
        default_replies(plan="no tags here", search=["<search>Mann</search>", "<end>"], update="replace it")
    )
    ep = run(llm)
    plan_turn, update_turn = ep.turns_of("plan")[0], ep.turns_of("update")[0]
    assert not plan_turn.parsed_ok and "no <q1>" in plan_turn.parse_error
    assert not update_turn.parsed_ok and update_turn.meta["op"] == "add"
    assert [s["query"] for s in ep.states[-1]["thinking_trajectory"]] == [QUESTION.question, "Mann"]


def test_malformed_search_searches_the_question_first_then_ends():
    llm = scripted(default_replies(search="I would look it up."))
    ep = run(llm)
    searches = ep.turns_of("search")
    assert len(searches) == 2 and not any(t.parsed_ok for t in searches)
    assert [r.query for r in ep.retrievals] == [QUESTION.question]
    assert searches[1].meta["action"] == "end"
