import pytest

from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.teams.selectors import parse_selection, selection_tokens
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(id="q", question="Which novelist was German, David Guterson or Thomas Mann?")


async def run_one(script: list[str], question: Question = QUESTION, **settings) -> Episode:
    team = get_team("static_pipeline", TeamSettings(**settings))
    backends = make_backends({"policy": ScriptedLLM(script)}, TinyRetriever(PASSAGES))
    episodes, _ = await run_episodes(team.run, team.name, [question], backends, Sampling(), progress=False)
    assert episodes[0].error is None
    return episodes[0]


async def test_fixed_order_rewrite_retrieve_select_generate():
    ep = await run_one(
        [
            "<query>Thomas Mann German</query>\n<query>David Guterson</query>",
            "<id>0</id>",
            "<answer>Thomas Mann</answer>",
        ],
        top_k=1,
    )
    assert [t.role for t in ep.turns] == ["qr", "ds", "ag"]
    assert [r.query for r in ep.retrievals] == ["Thomas Mann German", "David Guterson"]
    assert all(t.parsed_ok for t in ep.turns) and ep.answer == "Thomas Mann"
    # the selector sees both candidates, numbered from 0; the generator only the selected one
    ds_prompt = ep.turns_of("ds")[0].messages[-1]["content"]
    assert "Document0 (Title: Thomas Mann)" in ds_prompt and "Document1 (Title: David Guterson)" in ds_prompt
    ag_prompt = ep.turns_of("ag")[0].messages[-1]["content"]
    assert "German novelist" in ag_prompt and "American novelist" not in ag_prompt
    assert ep.states[0]["selected"] == ["1"] and ep.states[0]["candidates"] == ["1", "2"]


async def test_the_generator_has_no_example_and_its_reply_is_opened_with_the_answer_tag():
    ep = await run_one(["<query>Thomas Mann German</query>", "<id>0</id>", "Thomas Mann</answer>"])
    ag = ep.turns_of("ag")[0]
    assert [m["role"] for m in ag.messages] == ["system", "user"] and ag.continuation == "<answer>"
    assert ag.parsed_ok and ep.answer == "Thomas Mann"


async def test_out_of_range_ids_are_flagged_and_valid_ones_kept():
    ep = await run_one(["<query>Thomas Mann German</query>", "<id>7, 0</id>", "<answer>Thomas Mann</answer>"])
    ds = ep.turns_of("ds")[0]
    assert not ds.parsed_ok and "out of range" in ds.parse_error
    assert ds.meta["selected_ids"] == [0]


async def test_missing_selection_keeps_every_candidate_and_missing_query_uses_the_question():
    ep = await run_one(["Thomas Mann", "Documents 1 and 2 help.", "<answer>Thomas Mann</answer>"], top_k=3)
    qr, ds = ep.turns_of("qr")[0], ep.turns_of("ds")[0]
    assert not qr.parsed_ok and [r.query for r in ep.retrievals] == [QUESTION.question]
    assert not ds.parsed_ok and "missing <id>" in ds.parse_error
    ag_prompt = ep.turns_of("ag")[0].messages[-1]["content"]
    assert all(p.text in ag_prompt for p in PASSAGES)


@pytest.mark.parametrize(
    ("text", "ids", "ok"),
    [
        ("<id>0, 2</id>", [0, 2], True),
        ("<id>Document0, Document2</id>", [0, 2], True),
        ("<id>2, 2</id>", [2], True),
        ("<id>5</id>", [0, 1, 2], False),
        ("<id></id>", [0, 1, 2], False),
        ("0, 1", [0, 1, 2], False),
    ],
)
def test_parse_selection(text, ids, ok):
    selection = parse_selection(text, 3)
    assert selection.ids == ids and selection.ok is ok


# short replies keep the real-model test quick; the format is what is exercised


def test_the_selector_has_room_to_list_every_id_and_close_its_tag():
    # Qwen2.5's tokenizer spells "<id>0, 1, ..., n-1</id>" in 19 (n = 5), 34 (10) and 74 (20) tokens
    assert selection_tokens(5) == 32  # the cap before
    assert selection_tokens(10) == 48 and selection_tokens(20) == 88
