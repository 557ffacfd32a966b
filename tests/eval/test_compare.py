"""`searchteam compare`: paired statistics on constructed runs, checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from searchteam.cli import app
from searchteam.data.benchmark import answer_form
from searchteam.errors import CompareError
from searchteam.eval.compare import bootstrap_interval, compare_runs, load_rows, sign_flip_p_value


def write_run(path: Path, rows: list[tuple[str, str, float, float]], torn: bool = False) -> Path:
    path.mkdir(parents=True)
    lines = [json.dumps({"id": i, "dataset": d, "em": em, "f1": f1}) for i, d, em, f1 in rows]
    text = "\n".join(lines) + "\n" + ('{"id": "torn", "data' if torn else "")
    (path / "results.jsonl").write_text(text)
    return path


def test_a_constant_difference_has_a_degenerate_interval() -> None:
    assert bootstrap_interval(np.full(7, 0.25)) == (0.25, 0.25)


def test_bootstrap_of_two_differences_spans_their_range() -> None:
    # resampling [1, 0] gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # percentiles are 0 and 1
    assert bootstrap_interval(np.array([1.0, 0.0])) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        ([1, 1, 1, 1], 2 / 16),  # only all-plus and all-minus reach |sum| = 4
        ([1, -1], 1.0),  # observed sum 0: every pattern reaches it
        ([0.5, 0.25, 0.25, 0, 0], 2 / 8),  # zeros carry no sign; |sum| = 1 only for +++ and −−−
        ([1, 1, -1], 8 / 8),  # |sum| = 1 is reached by every pattern of three ±1
        ([0, 0], 1.0),
    ],
)
def test_sign_flip_p_value_by_hand(diff: list[float], expected: float) -> None:
    assert sign_flip_p_value(np.array(diff, dtype=float)) == pytest.approx(expected)


def test_sign_flip_beyond_the_exact_limit_samples_sign_patterns() -> None:
    assert sign_flip_p_value(np.ones(30)) < 1e-3
    assert sign_flip_p_value(np.array([1.0, -1.0] * 15)) == 1.0


def test_runs_pair_by_question_id_per_hop_group(tmp_path: Path) -> None:
    a = write_run(
        tmp_path / "a",
        [
            ("q1", "nq", 0, 0.0),
            ("q2", "nq", 0, 0.0),
            ("q3", "hotpotqa", 1, 1.0),
            ("q4", "hotpotqa", 0, 0.5),
            ("q5", "nq", 1, 1.0),
        ],
    )
    b = write_run(
        tmp_path / "b",
        [
            ("q4", "hotpotqa", 1, 1.0),
            ("q3", "hotpotqa", 1, 1.0),
            ("q2", "nq", 0, 0.0),
            ("q1", "nq", 1, 1.0),
            ("q6", "nq", 1, 1.0),
        ],
        torn=True,
    )
    diffs, unpaired = compare_runs(a, b, ("f1",), by="group")
    by_slice = {d.slice: d for d in diffs}
    assert unpaired == {"only_a": 1, "only_b": 1}
    assert by_slice["all"].n == 4
    assert by_slice["all"].diff == pytest.approx((1 + 0 + 0 + 0.5) / 4)
    assert by_slice["single-hop"].diff == pytest.approx(0.5)
    assert by_slice["multi-hop"].diff == pytest.approx(0.25)
    assert (by_slice["all"].b_better, by_slice["all"].a_better) == (2, 0)
    assert by_slice["all"].p_value == pytest.approx(2 / 4)  # nonzero diffs 1, 0.5: |sum| 1.5 by ++ and −−


def test_unpairable_runs_and_bad_rows_are_clear_errors(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", [("q1", "nq", 0, 0.0)])
    b = write_run(tmp_path / "b", [("x", "nq", 0, 0.0)])
    with pytest.raises(CompareError, match="share no question ids"):
        compare_runs(a, b)
    with pytest.raises(CompareError, match="metric 'acc'"):
        compare_runs(a, a, ("acc",))
    with pytest.raises(CompareError, match="no such results file"):
        load_rows(tmp_path / "missing")
    dup = write_run(tmp_path / "dup", [("q1", "nq", 0, 0.0), ("q1", "nq", 1, 1.0)])
    with pytest.raises(CompareError, match=r"results.jsonl:2: question id 'q1' appears twice"):
        load_rows(dup)


def test_compare_command_prints_the_paired_table_and_json(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", [("q1", "nq", 0, 0.0), ("q2", "hotpotqa", 0, 0.5)])
    b = write_run(tmp_path / "b", [("q1", "nq", 1, 1.0), ("q2", "hotpotqa", 0, 0.5)])
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--json", "--by", "dataset"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    nq_f1 = next(d for d in report["diffs"] if d["slice"] == "nq" and d["metric"] == "f1")
    assert nq_f1["diff"] == 1.0 and nq_f1["n"] == 1
    table = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert table.exit_code == 0 and "B − A" in table.output
    missing = CliRunner().invoke(app, ["compare", str(a), str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "results file" in " ".join(missing.output.split())


@pytest.mark.parametrize(
    ("question", "golden", "form"),
    [
        ("Which film came out first, The Bag Man or Pyar Ka Bandhan?", ["Pyar Ka Bandhan"], "two-way"),
        ("Who was born first, János Damjanich or Bertram J. Rodgers?", ["János Damjanich"], "two-way"),
        ("Are Ed Wood and Scott Derrickson both American?", ["Yes"], "two-way"),
        ("Who is the paternal grandfather of Otto of Limburg?", ["Jobst of Limburg"], "open"),
        ("Was it the novel or the film that won, and who directed it?", ["Ridley Scott"], "open"),
        ("Is it Paris or Lyon?", ["Parisian"], "open"),  # a whole answer, not part of a word
    ],
)
def test_answer_form_marks_two_way_questions(question: str, golden: list[str], form: str) -> None:
    assert answer_form(question, golden) == form


def test_compare_by_form_slices_two_way_and_open_questions(tmp_path: Path) -> None:
    def run(path: Path, f1s: list[float]) -> Path:
        path.mkdir()
        rows = [
            {"id": "q1", "dataset": "2wikimultihopqa", "question": "Who was born first, A B or C D?"},
            {"id": "q2", "dataset": "hotpotqa", "question": "Are A and B both poets?"},
            {"id": "q3", "dataset": "hotpotqa", "question": "Who directed Alien?"},
        ]
        golds = [["C D"], ["no"], ["Ridley Scott"]]
        scored = zip(rows, golds, f1s, strict=True)
        lines = [json.dumps(r | {"golden_answers": g, "em": f, "f1": f}) for r, g, f in scored]
        (path / "results.jsonl").write_text("\n".join(lines) + "\n")
        return path

    a, b = run(tmp_path / "a", [1, 0, 0]), run(tmp_path / "b", [0, 1, 1])
    diffs, _ = compare_runs(a, b, ("f1",), by="form")
    by_slice = {d.slice: (d.n, d.diff) for d in diffs}
    assert by_slice == {"all": (3, pytest.approx(1 / 3)), "two-way": (2, 0.0), "open": (1, 1.0)}
    with pytest.raises(CompareError, match="use group, dataset, form or none"):
        compare_runs(a, b, by="type")
