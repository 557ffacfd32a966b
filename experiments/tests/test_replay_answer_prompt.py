"""experiments/replay_answer_prompt.py: a replayed answer call is the static pipeline's own call."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "replay_answer_prompt.py"
spec = importlib.util.spec_from_file_location("replay_answer_prompt", SCRIPT)
replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(replay)

QUESTION = "Which novelist was German, David Guterson or Thomas Mann?"
DOCUMENTS = (
    "Document0 (Title: Thomas Mann) Thomas Mann was a German novelist.\n"
    "Document1 (Title: David Guterson) David Guterson is an American novelist."
)


def recorded_row(messages: list[dict]) -> dict:
    return {"question": QUESTION, "turns": [{"role": "ag", "messages": messages}]}


def test_the_shipped_answer_prompt_replays_to_the_same_messages():
    team = replay.pipeline_with_answer_prompt()
    messages = team.chat("ag", question=QUESTION, documents=DOCUMENTS)
    inputs = replay.recorded_inputs(recorded_row(messages))
    assert inputs == (QUESTION, DOCUMENTS)
    request = replay.request(team, *inputs)
    assert request.messages == messages and request.continuation == "<answer>"


def test_documents_after_the_question_are_found_too():
    prompt = {"system": "Answer.", "user": "Question: {question}\n\n{documents}\n\nNow, answer."}
    messages = replay.request(replay.pipeline_with_answer_prompt(prompt), QUESTION, DOCUMENTS).messages
    assert messages[-1]["content"].startswith("Question:")
    assert replay.recorded_inputs(recorded_row(messages)) == (QUESTION, DOCUMENTS)
