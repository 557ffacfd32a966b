"""DECOR control flow with the scripted double, and one end-to-end run of the real default model."""

from __future__ import annotations

import asyncio

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.decor.team import Entry, Memory, approx_tokens, parse_planner
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Passage, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(
    id="q",
    question="Which novelist was German, David Guterson or Thomas Mann?",
    golden_answers=["Thomas Mann"],
)
SECRET = "Mann kept a pet heron named Gustav in Lubeck."
DOCS = [
    *PASSAGES,
    Passage(id="4", title="Thomas Mann's heron", text=f"Thomas Mann novelist German. {SECRET}"),
]
ROLE_MARKERS = {
    "planner": "You are the planner",
    "filter": "strict information filter",
    "answerer": "answers user queries strictly",
    "compressor": "text processing utility",
}
EVIDENCE = "<think>Doc 1 names him.</think><filter>Thomas Mann was a German novelist.</filter>"


def role_of(req: GenerationRequest) -> str:
    system = req.messages[0]["content"]
    return next(role for role, marker in ROLE_MARKERS.items() if marker in system)


def scripted(**replies: list[str] | str) -> ScriptedLLM:
    """Each role answers from its own list (in order) or with a fixed string."""
    defaults: dict[str, list[str] | str] = {
        "planner": "<think>Need his nationality.</think><search>Thomas Mann German novelist</search>",
        "filter": EVIDENCE,
        "answerer": "<think>Memory says so.</think><answer>Thomas Mann</answer>",
        "compressor": "<facts>- Thomas Mann was German.</facts>",
    }
    queues = {role: list(r) if isinstance(r, list) else r for role, r in {**defaults, **replies}.items()}

    def respond(req: GenerationRequest) -> str:
        reply = queues[role_of(req)]
        return reply.pop(0) if isinstance(reply, list) else reply

    return ScriptedLLM(respond)


def run(llm: ScriptedLLM, *, max_turns: int = 4, training: bool = False, **options: int) -> Episode:
    team = get_team("decor", TeamSettings(max_turns=max_turns, top_k=5, options=options))
    backends = make_backends({"policy": llm}, TinyRetriever(DOCS))
    episodes, _ = asyncio.run(
        run_episodes(team.run, "decor", [QUESTION], backends, Sampling(), progress=False, training=training)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0]


def test_compression_triggers_past_the_limit_and_not_before():
    query = "Thomas Mann German novelist"
    entry_tokens = Entry(query, "Thomas Mann was a German novelist.").tokens
    # two entries fit exactly: no compression; the third would exceed the limit
    ep = run(scripted(), max_turns=3, memory_max_tokens=2 * entry_tokens)
    assert [s["compressed"] for s in ep.states] == [False, False, True]
    compressor = ep.turns_of("compressor")
    assert len(compressor) == 1 and compressor[0].step == 3 and compressor[0].frozen
    assert "Search 2: Thomas Mann German novelist" in compressor[0].messages[-1]["content"]
    final = ep.states[-1]
    assert final["memory"] == [
        {"query": None, "evidence": "- Thomas Mann was German."},
        {"query": query, "evidence": "Thomas Mann was a German novelist."},
    ]
    assert final["query_history"] == [query] * 3  # q_<t survives compression

    ep = run(scripted(), max_turns=3, memory_max_tokens=3 * entry_tokens)
    assert not ep.turns_of("compressor") and not any(s["compressed"] for s in ep.states)


def test_memory_size_estimate():
    assert approx_tokens("one two three") == 4
    memory = Memory().add(Entry("a b", "c d e f"))
    assert memory.tokens == approx_tokens("a b") + approx_tokens("c d e f") == 3 + 6


def test_compressor_uses_its_own_model_when_configured():
    policy, frozen = scripted(), scripted(compressor="<facts>- condensed</facts>")
    team = get_team("decor", TeamSettings(max_turns=2, options={"memory_max_tokens": 1}))
    backends = make_backends({"policy": policy, "compressor": frozen}, TinyRetriever(DOCS))
    episodes, _ = asyncio.run(
        run_episodes(team.run, "decor", [QUESTION], backends, Sampling(), progress=False)
    )
    compressor = episodes[0].turns_of("compressor")
    assert [t.model for t in compressor] == ["scripted"] and len(frozen.requests) == 1  # the model's name
    assert all(role_of(r) != "compressor" for r in policy.requests)


def test_planner_and_answerer_never_see_raw_documents():
    ep = run(scripted(), max_turns=3)
    assert any(SECRET in p.text for r in ep.retrievals for p in r.passages)  # the passage was retrieved
    assert all(SECRET in t.messages[-1]["content"] for t in ep.turns_of("filter"))
    for turn in ep.turns_of("planner") + ep.turns_of("answerer"):
        assert all(SECRET not in m["content"] for m in turn.messages)
    planner = ep.turns_of("planner")[1].messages[-1]["content"]
    assert (
        "Thomas Mann was a German novelist." in planner and "previous search queries: Thomas Mann" in planner
    )
    answerer = ep.turns_of("answerer")[0].messages[-1]["content"]
    assert "Result: Thomas Mann was a German novelist." in answerer and ep.answer == "Thomas Mann"


def test_none_stops_the_loop():
    planner = [
        "<think>Need it.</think><search>Thomas Mann</search>",
        "<think>Enough.</think><search>None</search>",
    ]
    ep = run(scripted(planner=planner))
    assert [t.role for t in ep.turns] == ["planner", "filter", "planner", "answerer"]
    assert len(ep.retrievals) == 1 and ep.turns_of("planner")[1].meta["query"] is None
    assert all(t.parsed_ok for t in ep.turns)


def test_tmax_caps_the_loop():
    ep = run(scripted(), max_turns=2)
    assert len(ep.turns_of("planner")) == 2 and len(ep.states) == 2 and ep.turns[-1].role == "answerer"


def test_malformed_outputs_are_flagged_with_fallbacks():
    assert parse_planner("<think>x</think>", memory_empty=True, question="Q?").query == "Q?"
    assert parse_planner("<think>x</think>", memory_empty=False, question="Q?").stop
    unclosed = parse_planner("<think>x</think><search>Mann birthplace and", memory_empty=False, question="Q?")
    assert unclosed.stop and unclosed.error == "missing <search> tag"

    llm = scripted(
        planner=["<search>Thomas Mann</search>", "no idea"],
        filter="Thomas Mann was a German novelist, said Doc 1.",
        answerer="Thomas Mann",
    )
    ep = run(llm)
    planner, filter_turn, answerer = (
        ep.turns_of("planner"),
        ep.turns_of("filter")[0],
        ep.turns_of("answerer")[0],
    )
    assert planner[0].parse_error == "missing <think> block" and planner[0].meta["query"] == "Thomas Mann"
    assert planner[1].parse_error == "missing <search> tag" and planner[1].meta["query"] is None  # → STOP
    assert filter_turn.parse_error == "missing <filter> tag"
    assert ep.states[0]["memory"][0]["evidence"] == "Thomas Mann was a German novelist, said Doc 1."
    assert not answerer.parsed_ok and ep.answer == "Thomas Mann"

    ep = run(scripted(compressor=""), max_turns=2, memory_max_tokens=1)
    compressor = ep.turns_of("compressor")[0]
    assert compressor.parse_error == "missing <facts> tag"
    assert ep.states[-1]["memory"][0] == {"query": None, "evidence": "Thomas Mann was a German novelist."}


def test_training_episode_ends_at_the_first_format_violation():
    # §4.3: in training the first broken planner/filter/answerer output truncates the episode (R = −1)
    bad_filter = scripted(filter="Thomas Mann was German.")
    trained = run(bad_filter, training=True)
    assert [t.role for t in trained.turns] == ["planner", "filter"] and trained.answer == ""
    assert trained.meta["truncated_at"] == {"role": "filter", "step": 1, "error": "missing <filter> tag"}
    assert not trained.states  # the broken evidence never entered the memory

    bad_planner = run(scripted(planner=["<search>Thomas Mann</search>"]), training=True)
    assert [t.role for t in bad_planner.turns] == ["planner"] and not bad_planner.retrievals
    assert bad_planner.meta["truncated_at"]["role"] == "planner"

    bad_answer = run(scripted(answerer="Thomas Mann"), max_turns=1, training=True)
    assert [t.role for t in bad_answer.turns] == ["planner", "filter", "answerer"]
    assert bad_answer.answer == "" and bad_answer.meta["truncated_at"]["role"] == "answerer"

    good = run(scripted(), max_turns=2, training=True)
    assert "truncated_at" not in good.meta and good.answer == "Thomas Mann"


def test_inference_episode_continues_on_fallbacks():
    ep = run(scripted(filter="Thomas Mann was German."), max_turns=2)
    assert [t.role for t in ep.turns] == ["planner", "filter", "planner", "filter", "answerer"]
    assert "truncated_at" not in ep.meta and ep.answer == "Thomas Mann"
    asked = run(scripted(filter="Thomas Mann was German."), max_turns=2, truncate_on_format_error=True)
    assert [t.role for t in asked.turns] == ["planner", "filter"]


def test_token_caps_leave_room_for_think_and_tag():
    llm = scripted()
    run(llm, max_turns=1)
    caps = {role_of(r): r.sampling.max_new_tokens for r in llm.requests}
    assert caps == {"planner": 256, "filter": 384, "answerer": 256}
