"""second_hop_recall: the counts of one scripted retriever, by hand."""

from __future__ import annotations

from experiments.second_hop_recall import count, two_hop
from searchteam.types import Passage, Question

A = Passage(id="a", title="Alpha", text="Alpha was founded by Beta.")
B = Passage(id="b", title="Beta", text="Beta was born in Gamma.")
C = Passage(id="c", title="Gamma", text="Gamma is a city.")


class Scripted:
    """Top-k by the query's first word: 'Where' (the question) finds Alpha only, 'Beta' finds Beta."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        by_word = {"Where": [A, C], "Beta": [B], "Alpha": [A, C]}
        return [by_word.get(q.split()[0], [C])[:k] for q in queries]


def test_the_missing_title_is_counted_per_query():
    both = Question(id="2", question="Alpha Beta?", meta={"supporting_titles": ["Alpha", "Beta"]})
    one = Question(
        id="1", question="Where was the founder of Alpha born?", meta={"supporting_titles": ["Alpha", "Beta"]}
    )
    single = Question(id="3", question="Alpha?", meta={"supporting_titles": ["Alpha"]})
    questions = two_hop([one, both, single])
    assert [q.id for q in questions] == ["1", "2"]
    c = count(questions, Scripted(), k=2)
    # "Alpha Beta?" starts with Alpha: its top-2 is Alpha and Gamma, so it too misses Beta
    assert (c["questions"], c["both in top-k"], c["one in top-k"], c["none in top-k"]) == (2, 0, 2, 0)
    assert c["bridge in found passage"] == 2  # Alpha's text names Beta
    assert c["question"] == 0  # the questions again: Alpha and Gamma
    assert c["found passage"] == 0  # "Alpha was founded ..." finds Alpha and Gamma
    assert c["bridge"] == 2  # "Beta" finds Beta
    assert c["question + bridge"] == 0  # the question's first word still leads
    assert c["question, the next k unseen"] == 0  # ranks 3-4 of "Where" and "Alpha": none
