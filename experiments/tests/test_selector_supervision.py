"""experiments/selector_supervision.py: selector targets from supporting titles, read by the warm start."""

import importlib.util
from pathlib import Path

from searchteam.rl.warm_start.data import read_collected
from searchteam.teams.selectors import parse_selection
from searchteam.types import Question
from tests.support.helpers import PASSAGES, TinyRetriever

SCRIPT = Path(__file__).resolve().parent.parent / "selector_supervision.py"
spec = importlib.util.spec_from_file_location("selector_supervision", SCRIPT)
supervision = importlib.util.module_from_spec(spec)
spec.loader.exec_module(supervision)


def question(qid: str, text: str, titles: list[str]) -> Question:
    return Question(id=qid, question=text, golden_answers=["x"], meta={"supporting_titles": titles})


def test_the_target_lists_the_supporting_paragraphs_ids_and_round_1_reads_them_back(tmp_path: Path) -> None:
    questions = [
        # TinyRetriever ranks by word overlap: Thomas Mann (1), then Paris (3), then David Guterson (2)
        question("q1", "thomas mann was german paris", ["Paris", "Thomas Mann"]),
        question("q2", "thomas mann was german", ["Lyon"]),  # no supporting paragraph retrieved: left out
    ]
    episodes = supervision.selection_episodes(questions, TinyRetriever(PASSAGES), k=2)
    assert [e.question.id for e in episodes] == ["q1"]
    [turn] = episodes[0].turns
    assert turn.role == "ds" and turn.completion == "<id>0, 1</id>"
    prompt = turn.messages[-1]["content"]
    assert "Document0 (Title: Thomas Mann)" in prompt and "Document1 (Title: Paris)" in prompt
    assert "(0, 1, ..., 1)" in prompt  # the id range the selector prompt states
    assert parse_selection(turn.completion, 2).ids == [0, 1]
    supervision.save_collected(tmp_path, 1, episodes, [1.0])
    read_episodes, scores = read_collected(tmp_path, 1)
    assert scores == [1.0] and read_episodes[0].turns[0].completion == "<id>0, 1</id>"
