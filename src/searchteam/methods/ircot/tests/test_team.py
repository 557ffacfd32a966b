import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.ircot.team import concluded_answer, first_sentence
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(id="q", question="Which novelist was German, David Guterson or Thomas Mann?")


def reasoning(sentences: list[str], answer: str = "<answer>Thomas Mann</answer>") -> ScriptedLLM:
    """The reasoner says the next scripted sentence (the last one repeats); the reader says `answer`."""
    queue = list(sentences)

    def respond(request: GenerationRequest) -> str:
        if "<answer>" in request.messages[0]["content"]:
            return answer
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return ScriptedLLM(respond)


async def run_one(llm: ScriptedLLM, **settings) -> Episode:
    team = get_team("ircot", TeamSettings(**settings))
    backends = make_backends({"policy": llm}, TinyRetriever(PASSAGES))
    episodes, _ = await run_episodes(team.run, team.name, [QUESTION], backends, Sampling(), progress=False)
    assert episodes[0].error is None
    return episodes[0]


async def test_step_cap_then_the_reader_answers():
    ep = await run_one(
        reasoning(["Thomas Mann was a novelist.", "He was German.", "Guterson is American."]), max_turns=3
    )
    assert [t.role for t in ep.turns] == ["reasoner"] * 3 + ["answer"]
    assert [t.step for t in ep.turns] == [0, 1, 2, 3]
    assert ep.answer == "Thomas Mann" and all(t.parsed_ok for t in ep.turns)
    reader = ep.turns_of("answer")[0].messages[-1]["content"]
    assert "Reasoning: Thomas Mann was a novelist. He was German. Guterson is American." in reader


async def test_each_first_sentence_is_the_next_query_and_the_chain_continues_from_it():
    llm = reasoning(["Mann was a German novelist. Guterson is not.", "Guterson is American. More text."])
    ep = await run_one(llm, max_turns=2)
    assert [r.query for r in ep.retrievals] == [
        QUESTION.question,
        "Mann was a German novelist.",
        "Guterson is American.",
    ]
    assert [t.meta["sentence"] for t in ep.turns_of("reasoner")] == [r.query for r in ep.retrievals[1:]]
    # the reasoner keeps writing one growing chain of thought
    assert [r.continuation for r in llm.requests[:2]] == ["", "Mann was a German novelist."]
    assert ep.states[-1]["thoughts"] == ["Mann was a German novelist.", "Guterson is American."]


async def test_passages_accumulate_without_duplicates():
    ep = await run_one(
        reasoning(["Thomas Mann was German.", "Paris is the capital of France."]), max_turns=2, top_k=1
    )
    seen = [p.id for r in ep.retrievals for p in r.passages]
    assert seen == ["1", "1", "3"]
    assert [s["passages"] for s in ep.states] == [["1"], ["1", "3"]]
    last_prompt = ep.turns_of("reasoner")[-1].messages[-1]["content"]
    assert last_prompt.count("Wikipedia Title: Thomas Mann") == 1
    reader = ep.turns_of("answer")[0].messages[-1]["content"]
    assert "Wikipedia Title: Thomas Mann" in reader and "Wikipedia Title: Paris" in reader


async def test_stops_on_so_the_answer_is():
    ep = await run_one(reasoning(["Thomas Mann was German.", "So the answer is: Thomas Mann."]), max_turns=5)
    assert [t.role for t in ep.turns] == ["reasoner", "reasoner"]
    assert ep.answer == "Thomas Mann" and len(ep.retrievals) == 2
    assert ep.states[-1]["concluded"] == "Thomas Mann"


async def test_empty_conclusion_and_empty_sentence_are_flagged_and_the_reader_answers():
    ep = await run_one(reasoning(["So the answer is:"]), max_turns=3)
    assert [t.role for t in ep.turns] == ["reasoner", "answer"]
    assert not ep.turns[0].parsed_ok and ep.answer == "Thomas Mann"
    ep = await run_one(reasoning(["\n\n"]), max_turns=3)
    assert [t.role for t in ep.turns] == ["reasoner", "answer"]
    assert ep.turns[0].parse_error == "empty reasoning sentence" and len(ep.retrievals) == 1


@pytest.mark.parametrize(
    ("text", "sentence", "answer"),
    [
        ("Mann was German. Guterson is American.", "Mann was German.", None),
        ("\nSo the answer is: St. Louis.\nMore.", "So the answer is: St. Louis.", "St. Louis"),
        ("Both lived there. So the answer is: yes.", "Both lived there.", None),
        ("Thus so the answer is Thomas Mann", "Thus so the answer is Thomas Mann", "Thomas Mann"),
        ("The answer is: Thomas Mann.", "The answer is: Thomas Mann.", "Thomas Mann"),
        ("So the answer is unclear yet.", "So the answer is unclear yet.", "unclear yet"),
        ("Maybe the answer is Mann. It is.", "Maybe the answer is Mann.", None),
        ("", "", None),
    ],
)
def test_first_sentence_and_concluded_answer(text, sentence, answer):
    assert first_sentence(text) == sentence
    assert concluded_answer(sentence) == answer


# short replies keep the real-model test quick; the format is what is exercised
