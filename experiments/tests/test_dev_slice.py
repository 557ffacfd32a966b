"""experiments/dev_slice.py: the choice and report slices of issue 42 share no question."""

import subprocess
import sys
from pathlib import Path

from searchteam.config import RunConfig
from searchteam.data.benchmark import load_questions
from searchteam.factory import select_questions

SCRIPT = Path(__file__).parents[1] / "dev_slice.py"


def slice_of(tmp_path: Path, first: int, last: int) -> list:
    out = tmp_path / f"{first}-{last}.jsonl"
    subprocess.run(
        [sys.executable, str(SCRIPT), str(first), str(last), str(out)], check=True, capture_output=True
    )
    return load_questions(out)


def test_the_report_slice_follows_the_choice_slice_without_overlap(tmp_path):
    chosen, report = slice_of(tmp_path, 1, 100), slice_of(tmp_path, 101, 200)
    first_100 = select_questions(RunConfig(datasets=["hotpotqa", "2wikimultihopqa"], split="dev", limit=100))
    assert [q.id for q in chosen] == [q.id for q in first_100]
    assert len(report) == 200 and not {q.id for q in chosen} & {q.id for q in report}


def test_a_slice_past_the_end_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "1", "501", str(tmp_path / "x.jsonl")], capture_output=True
    )
    assert done.returncode != 0 and b"has 500 questions" in done.stderr
