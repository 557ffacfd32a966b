"""experiments/heldout_questions.py: the held-out multi-hop questions share none with the tuning set."""

import subprocess
import sys
from pathlib import Path

from searchteam.config import RunConfig
from searchteam.data.benchmark import load_questions
from searchteam.factory import select_questions


def test_the_held_out_question_file_shares_no_question_with_the_tuning_set(tmp_path):
    out = tmp_path / "heldout.jsonl"
    script = Path(__file__).parents[1] / "heldout_questions.py"
    subprocess.run([sys.executable, str(script), str(out)], check=True, capture_output=True)
    held_out = load_questions(out)
    tuned = select_questions(RunConfig(datasets=["hotpotqa", "2wikimultihopqa"], split="dev", limit=150))
    assert len(held_out) == 213 and len(tuned) == 300
    assert not {q.id for q in held_out} & {q.id for q in tuned}
    assert {q.dataset for q in held_out} == {"hotpotqa", "2wikimultihopqa", "musique", "bamboogle"}
