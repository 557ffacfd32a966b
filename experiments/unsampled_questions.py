"""Write the train questions that no named recipe ever samples, as a report set for the adapters those
recipes trained: every warm-start round, RL step and DAPO refill batch of each recipe, recomputed from
its seeds with the trainer's own `questions_for_step` and `resample_questions`. `--exclude` drops the
questions of earlier eval runs (their `results.jsonl`) or question files, so a set is read only once.

    python experiments/unsampled_questions.py runs/sets/report-train.jsonl \
        --recipes search_r1/qwen0.5b-cpu,search_r1/qwen0.5b-cpu-bridge --exclude runs/hint/sr1-train30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from searchteam.data.benchmark import BENCHMARK_DIR, load_questions
from searchteam.eval.runner import read_results
from searchteam.train.build import training_questions
from searchteam.train.config import TrainRunConfig, load_train_run_config, warm_start_run_config
from searchteam.train.rollout import questions_for_step, resample_questions
from searchteam.types import Question


def sampled_ids(cfg: TrainRunConfig) -> set[str]:
    """The ids of every train question `cfg`'s run samples: its warm start's rounds, then each RL step's
    batch and, with dynamic sampling, its refill batches."""
    questions = training_questions(cfg)
    ids: set[str] = set()

    def take(batch: list[Question]) -> None:
        ids.update(q.id for q in batch)

    if cfg.warm_start is not None:
        warm = warm_start_run_config(cfg)
        for round_index in range(cfg.warm_start.rounds):
            take(questions_for_step(questions, round_index, warm.questions_per_step, warm.seed))
    refills = cfg.train.resample_rounds if cfg.train.dynamic_sampling else 0
    for step in range(cfg.train.steps):
        take(questions_for_step(questions, step, cfg.questions_per_step, cfg.seed))
        for attempt in range(1, refills + 1):
            take(resample_questions(questions, step, attempt, cfg.questions_per_step, cfg.seed))
    return ids


def read_ids(path: Path) -> set[str]:
    """Question ids of an eval run directory or of a questions JSONL file."""
    if path.is_dir():
        return {r["id"] for r in read_results(path / "results.jsonl")}
    return {q.id for q in load_questions(path)}


def unsampled_lines(datasets: list[str], taken: set[str]) -> list[str]:
    """The train lines of `datasets`, in file order, whose question id is not in `taken`."""
    lines = []
    for dataset in datasets:
        train = BENCHMARK_DIR / "questions" / dataset / "train.jsonl"
        lines += [
            line
            for line in train.read_text(encoding="utf-8").splitlines()
            if line and json.loads(line)["id"] not in taken
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--recipes", required=True, help="comma-separated recipe names or YAML files")
    parser.add_argument("--exclude", type=Path, nargs="*", default=[], help="eval runs or question files")
    parser.add_argument("--datasets", default="hotpotqa,2wikimultihopqa")
    args = parser.parse_args()
    taken: set[str] = set()
    for recipe in args.recipes.split(","):
        taken |= sampled_ids(load_train_run_config(Path(recipe), {}))
    for path in args.exclude:
        taken |= read_ids(path)
    lines = unsampled_lines(args.datasets.split(","), taken)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"{len(lines)} questions -> {args.out}")


if __name__ == "__main__":
    main()
