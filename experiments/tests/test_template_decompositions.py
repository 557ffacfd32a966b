"""experiments/template_decompositions.py: comparison and chain decompositions and the facts-decide count, on
constructed questions and runs."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "template_decompositions.py"
spec = importlib.util.spec_from_file_location("template_decompositions", SCRIPT)
comparison = importlib.util.module_from_spec(spec)
spec.loader.exec_module(comparison)


def test_a_film_date_question_becomes_two_parallel_subquestions():
    fields = comparison.decomposition("Which film came out earlier, Dead Mine or Witch Story?")
    assert fields == {
        "template": "film released",
        "subquestions": ["When was the film Dead Mine released?", "When was the film Witch Story released?"],
        "subquestion_mode": "parallel",
        "options": ["Dead Mine", "Witch Story"],
        "wants": "earlier",
    }


def test_a_director_question_becomes_a_serial_chain_per_film():
    fields = comparison.decomposition(
        "Which film has the director who was born later, They Who Dare or Lianna?"
    )
    assert fields["subquestion_mode"] == "serial" and fields["wants"] == "later"
    assert fields["subquestions"] == [
        "Who directed the film They Who Dare?",
        "When was this director born?",
        "Who directed the film Lianna?",
        "When was this director born?",
    ]


@pytest.mark.parametrize("question", ["Are Chrysalis and Look both women's magazines?", "Who directed Heat?"])
def test_other_questions_have_no_template(question):
    assert comparison.decomposition(question) is None


def row(answers: list[str | None], prediction: str, gold: str) -> dict:
    trace = [{"status": "decomposed", "answer": None}] + [{"status": "solved", "answer": a} for a in answers]
    return {
        "id": "q",
        "prediction": prediction,
        "golden_answers": [gold],
        "em": float(prediction == gold),
        "states": [{"trace": trace}],
    }


FILM = comparison.decomposition("Which film came out earlier, Dead Mine or Witch Story?")
DIRECTOR = comparison.decomposition("Which film has the director died first, Raiders Of Red Gap or Lianna?")


@pytest.mark.parametrize(
    ("answers", "fields", "picked"),
    [
        (["2012", "May 3, 1969"], FILM, "Witch Story"),  # earlier wanted: 1969 < 2012
        (["1969", "1969"], FILM, None),  # the same year decides nothing
        (["2012", "I don't know"], FILM, None),
        (["Lambert Hillyer", "1958", "Joan Micklin Silver", "2020"], DIRECTOR, "Raiders Of Red Gap"),
        (["Lambert Hillyer", "1958"], DIRECTOR, None),  # a chain left unsolved
    ],
)
def test_the_facts_decide_when_both_halves_end_in_different_years(answers, fields, picked):
    assert comparison.decided_by_facts(row(answers, "x", "x"), fields) == picked


def test_report_counts_rightly_decided_questions_and_answers_that_follow_them(tmp_path, capsys):
    rows = [
        row(["2012", "1969"], "Witch Story", "Witch Story"),  # decided rightly, followed
        row(["2012", "1969"], "Dead Mine", "Witch Story"),  # decided rightly, not followed
        row(["1969", "2012"], "Dead Mine", "Witch Story"),  # decided wrongly (a wrong fact), followed
        row(["no idea", "1969"], "1969", "Witch Story"),  # undecided, names no option
        row(["Norodom Suramarit", "Carl Jung"], "Carl Jung", "Norodom Sutharot"),  # a chain: not counted
    ]
    run = tmp_path / "run"
    run.mkdir()
    for i, r in enumerate(rows):
        r["id"] = f"q{i}"
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    questions = tmp_path / "questions.jsonl"
    chain = {"id": "q4"} | comparison.decomposition("Who is the father-in-law of P?", ("chain",))
    film = {
        "question": "Which film came out earlier, Dead Mine or Witch Story?",
        "golden_answers": ["x"],
    } | FILM
    chain |= {"question": "Who is the father-in-law of P?", "golden_answers": ["x"]}
    lines = [json.dumps({"id": f"q{i}"} | film) for i in range(4)] + [json.dumps(chain)]
    questions.write_text("\n".join(lines) + "\n")
    comparison.report(run, questions)
    out = capsys.readouterr().out
    assert "n 4, EM 0.250, answer names an option 3, the facts decide 3, rightly 2" in out
    assert "follows them on 1 of those 2" in out


@pytest.mark.parametrize(
    ("question", "template", "subquestions"),
    [
        (
            "Who is the paternal grandmother of Otto Of Limburg?",
            "relative",
            ["Who is the father of Otto Of Limburg?", "Who is the mother of this person?"],
        ),
        (
            "Who is the father-in-law of Sisowath Kossamak?",
            "relative",
            ["Who is the spouse of Sisowath Kossamak?", "Who is the father of this person?"],
        ),
        (
            "What is the place of birth of the director of film Preston Tylk?",
            "director's fact",
            ["Who is the director of the film Preston Tylk?", "What is the place of birth of this director?"],
        ),
        (
            "What nationality is the performer of song Gone Fishin' (Song)?",
            "performer's fact",
            ["Who is the performer of the song Gone Fishin' (Song)?", "What nationality is this performer?"],
        ),
    ],
)
def test_a_compositional_question_becomes_a_two_hop_serial_chain(question, template, subquestions):
    assert comparison.decomposition(question) is None  # chains are written only when asked for
    fields = comparison.decomposition(question, ("comparison", "chain"))
    assert fields == {"template": template, "subquestions": subquestions, "subquestion_mode": "serial"}
