import pytest

from searchteam.config import RunConfig
from searchteam.eval.summary import recall_ks, result_row, summarize
from searchteam.factory import build_team
from searchteam.metrics import (
    answer_scores,
    cover_exact_match,
    exact_match,
    f1_score,
    gold_rank,
    hit,
    normalize_answer,
    recall_at_k,
    substring_match,
    sufficiency,
)
from searchteam.teams.base import WITHDRAWN, prompt_answers
from searchteam.types import Episode, Passage, Question, Retrieval


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Beatles!", "beatles"),
        ("  an   Apple, a day ", "apple day"),
        ("Ｆｕｌｌ-width ＡＢＣ", "fullwidth abc"),
        ("“Curly quotes” — dash", "curly quotes dash"),
        ("theatre", "theatre"),
        ("", ""),
    ],
)
def test_normalize_answer(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_best_over_golds():
    assert exact_match("the Eiffel Tower.", ["Louvre", "Eiffel Tower"]) == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("", ["Paris"]) == 0.0


def test_cover_em_matches_whole_words_only():
    assert cover_exact_match("It was Frankie Valli, in 1967", ["Frankie Valli"]) == 1.0
    assert cover_exact_match("1990", ["1"]) == 0.0
    assert cover_exact_match("anything", [""]) == 0.0


def test_f1_partial_and_empty():
    assert f1_score("Thomas Mann", ["Mann"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("", ["Mann"]) == 0.0
    assert f1_score("Mann", ["Thomas Mann", "Mann"]) == 1.0
    assert f1_score("café", ["Café"]) == 1.0


@pytest.mark.parametrize(
    ("prediction", "golds", "f1"),
    [
        # HotpotQA's rule: a yes/no/noanswer gold or prediction scores 0 unless the two are equal
        ("No, they are not the same", ["no"], 0.0),  # token overlap alone: p 1/5, r 1 -> 1/3
        ("yes", ["yes"], 1.0),
        ("Yes.", ["yes"], 1.0),  # equal after normalization
        ("no", ["No way"], 0.0),  # the prediction is closed; overlap alone: p 1, r 1/2 -> 2/3
        ("noanswer", ["no answer"], 0.0),
        ("Paris France", ["Paris"], 2 / 3),  # p 1/2, r 1
        # a gold list mixing yes and an entity: the yes gold gives 0, "Paris" gives p 1/2, r 1
        ("yes Paris", ["yes", "Paris"], 2 / 3),
        ("yes", ["Paris", "yes"], 1.0),
        ("yes", ["Paris", "no"], 0.0),
    ],
)
def test_f1_hotpotqa_closed_answer_rule(prediction, golds, f1):
    assert f1_score(prediction, golds) == pytest.approx(f1)


def test_hit_and_sufficiency():
    assert hit("Paris is the capital of France.", ["paris"]) == 1.0
    assert sufficiency(["nothing here", "the capital, Paris"], ["Paris"]) == 1.0
    assert sufficiency([], ["Paris"]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "golds", "acc", "cover_em"),
    [
        ("1990", ["1"], 1.0, 0.0),  # plain substring: FlashRAG's acc counts "1" inside "1990"
        ("It was Frankie Valli, in 1967", ["frankie valli"], 1.0, 1.0),
        ("The Beatles", ["Beatles"], 1.0, 1.0),
        ("the Eiffel Tower", ["Eiffel"], 1.0, 1.0),
        ("Eiffel", ["Eiffel Tower"], 0.0, 0.0),  # the gold must be inside the prediction, not the reverse
        ("Parisian food", ["Paris"], 1.0, 0.0),
        ("London", ["Berlin", "london."], 1.0, 1.0),  # best over golds, after normalization
        ("theatre", ["The"], 0.0, 0.0),  # "The" normalizes to nothing, which matches nothing
        ("", ["Paris"], 0.0, 0.0),
    ],
)
def test_acc_is_plain_substring_containment(prediction, golds, acc, cover_em):
    assert substring_match(prediction, golds) == acc
    assert cover_exact_match(prediction, golds) == cover_em


def test_gold_rank_is_the_best_rank_over_all_searches():
    golds = ["Frankie Valli"]
    first_misses = [["Paris is in France.", "The Nile flows north."], ["Frankie Valli sang it.", "x"]]
    assert gold_rank(first_misses, golds) == 1  # a later search found it at rank 1
    assert gold_rank([["a", "b", "Valli and Frankie Valli"], ["c"]], golds) == 3
    assert gold_rank([["1990 census"]], ["1"]) is None  # whole words, as FlashRAG's has_answer
    assert gold_rank([], golds) is None
    assert [recall_at_k(3, k) for k in (1, 2, 3, 5)] == [0.0, 0.0, 1.0, 1.0]
    assert recall_at_k(None, 10) == 0.0


def test_answer_scores_keys():
    assert answer_scores("Paris", ["Paris"]) == {"em": 1.0, "cover_em": 1.0, "acc": 1.0, "f1": 1.0}


def _episode(qid: str, dataset: str, answer: str, golds: list[str], searches: list[list[str]]) -> Episode:
    retrievals = [
        Retrieval(
            query="q", k=len(texts), passages=[Passage(id=f"{qid}{i}", text=t) for i, t in enumerate(texts)]
        )
        for texts in searches
    ]
    question = Question(id=qid, question="?", golden_answers=golds, dataset=dataset)
    return Episode(question=question, method="m", answer=answer, retrievals=retrievals)


def test_summary_reports_acc_and_recall_at_k():
    episodes = [
        # EM, cover-EM and acc 1; gold first retrieved at rank 2
        _episode("a", "nq", "Frankie Valli", ["Frankie Valli"], [["no", "Frankie Valli sang", "no"]]),
        # acc 1 ("1" in "in 1990"), cover-EM 0; the first search misses, the second has it at rank 1
        _episode("b", "nq", "in 1990", ["1"], [["1990", "no", "no"], ["page 1 of 2", "no", "no"]]),
        # never searched: recall 0 at every k
        _episode("c", "hotpotqa", "x", ["y"], []),
    ]
    rows = [result_row(e) for e in episodes]
    assert [r["gold_rank"] for r in rows] == [2, 1, None]
    assert recall_ks(rows) == [1, 3]
    summary = summarize(rows, "m", "model", 1.0)
    assert (summary["em"], summary["cover_em"], summary["acc"]) == (0.3333, 0.3333, 0.6667)
    assert (summary["recall@1"], summary["recall@3"]) == (0.3333, 0.6667)
    nq = summary["per_dataset"]["nq"]
    assert (nq["acc"], nq["recall@1"], nq["recall@3"]) == (1.0, 0.5, 1.0)
    assert summary["per_dataset"]["hotpotqa"]["recall@3"] == 0.0


def test_summary_counts_predictions_equal_to_a_prompt_example_answer():
    rows = [
        result_row(_episode(i, "nq", a, ["x"], [])) for i, a in (("a", "George Orwell."), ("b", "Orwell"))
    ]
    assert summarize(rows, "m", "model", 1.0)["example_answer_copies"] == 0
    assert summarize(rows, "m", "model", 1.0, frozenset({"george orwell"}))["example_answer_copies"] == 1
    withdrawn = _episode("c", "nq", "", ["x"], [])
    withdrawn.meta[WITHDRAWN] = "George Orwell"
    assert summarize([*rows, result_row(withdrawn)], "m", "model", 1.0)["example_answers_withdrawn"] == 1


def test_prompt_answers_are_the_tagged_answers_of_every_prompt_string():
    prompts = {
        "system": "Write the answer between <answer> and </answer>. For example, <answer> Beijing </answer>.",
        "examples": [{"user": "Q", "assistant": "<think>t</think>\n<answer>The Kendalls</answer>"}],
        "summary": {
            "examples": [
                {"assistant": "<predicted_answer>Sam Altman</predicted_answer> <answer>...</answer>"}
            ]
        },
    }
    assert prompt_answers(prompts) == {"beijing", "kendalls", "sam altman"}
    named = {**prompts, "example_entities": ["George Orwell", "The Kendalls"]}
    assert prompt_answers(named) == {"beijing", "kendalls", "sam altman", "george orwell"}


@pytest.mark.parametrize("method", ["direct", "naive_rag"])
def test_the_answering_prompts_show_no_answer_to_copy(method):
    # qwen2.5-coder-0.5b copied "George Orwell" from direct's example on 23 of 50 NQ dev questions
    assert build_team(RunConfig(method=method)).example_answers() == frozenset()


def test_recall_ks_follow_the_deepest_search():
    def rows(depth):
        return [{"searches": [{"ids": ["p"] * depth}]}]

    assert recall_ks(rows(0)) == [] and recall_ks([]) == []
    assert recall_ks(rows(1)) == [1]
    assert recall_ks(rows(5)) == [1, 3, 5]
    assert recall_ks(rows(20)) == [1, 3, 5, 10, 20]


def test_summary_of_rows_from_an_older_run():
    row = result_row(_episode("a", "nq", "in 1990", ["1"], [["page 1"]]))
    old = {k: v for k, v in row.items() if k not in ("acc", "gold_rank")}
    summary = summarize([old, row], "m", "model", 1.0)
    assert summary["acc"] == 1.0  # recomputed from prediction and golds
    assert summary["recall@1"] == 1.0  # over the row that recorded gold_rank
