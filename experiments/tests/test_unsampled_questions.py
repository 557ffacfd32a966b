"""experiments/unsampled_questions.py: what shipped recipes sample, and the report set of the rest."""

import json
import subprocess
import sys
from pathlib import Path

from experiments.unsampled_questions import read_ids, sampled_ids
from searchteam.data.benchmark import BENCHMARK_DIR, load_questions
from searchteam.train.config import load_train_run_config

SCRIPT = Path(__file__).parents[1] / "unsampled_questions.py"


def recipe(name: str):
    return load_train_run_config(Path(name), {})


def train_ids(dataset: str) -> list[str]:
    return [q.id for q in load_questions(BENCHMARK_DIR / "questions" / dataset / "train.jsonl")]


def test_a_warm_start_alone_samples_its_round_of_questions():
    ids = sampled_ids(recipe("search_r1/qwen0.5b-cpu-bridge"))  # 1 round of 96 HotpotQA questions, no RL
    assert len(ids) == 96 and ids <= set(train_ids("hotpotqa"))


def test_rl_steps_and_refills_add_their_batches():
    cfg = recipe("search_r1/qwen0.5b-cpu")  # 96 warm-start questions, 24 steps of 4, one refill round
    warm_only = sampled_ids(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 0})}))
    no_refill = cfg.train.model_copy(update={"dynamic_sampling": False})
    steps = sampled_ids(cfg.model_copy(update={"train": no_refill}))
    everything = sampled_ids(cfg)
    assert len(warm_only) == 96
    assert warm_only < steps < everything
    assert len(everything) <= 96 + 24 * 4 * 2


def test_the_report_set_holds_every_other_train_question_once(tmp_path):
    seen = tmp_path / "eval-run"  # an earlier eval run read the first two HotpotQA train questions
    seen.mkdir()
    results = "".join(json.dumps({"id": id_, "f1": 0.0}) + "\n" for id_ in train_ids("hotpotqa")[:2])
    (seen / "results.jsonl").write_text(results, encoding="utf-8")
    out = tmp_path / "report.jsonl"
    subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            str(out),
            "--recipes",
            "search_r1/qwen0.5b-cpu-bridge",
            "--exclude",
            str(seen),
            "--datasets",
            "hotpotqa",
        ],
        check=True,
        capture_output=True,
        cwd=Path(__file__).parents[2],
    )
    report = read_ids(out)
    taken = sampled_ids(recipe("search_r1/qwen0.5b-cpu-bridge")) | set(train_ids("hotpotqa")[:2])
    assert report == set(train_ids("hotpotqa")) - taken
    assert len(report) == len(out.read_text(encoding="utf-8").splitlines())
