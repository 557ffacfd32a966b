"""Where a training step's time goes: weight sync, rollout (generation + retrieval), reward, policy update.

Runs `--steps` real training steps of a shipped or user config in a temporary run directory, once per
rollout engine in `--backends` (`hf` shares the policy model; `ov` loads its LoRA adapters after each
update, timed as weight sync), and prints per step and on average the split and the rollout share of the
step, then the rollout-time ratio hf / ov. With `--log RUN_DIR/train_log.jsonl` it summarizes the timings
an earlier `searchteam train` run logged.

    python benchmarks/bench_train_step.py [--config search_r1/smollm135m-cpu] [--steps 2] [--backends hf,ov]
    python benchmarks/bench_train_step.py --log runs/search_r1/smollm135m-cpu/train_log.jsonl
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

PHASES = ("weight_sync", "rollout", "reward", "update")


def run_steps(config: str, steps: int, backend: str) -> list[dict]:
    from searchteam.train.build import build_trainer
    from searchteam.train.config import load_train_run_config

    cfg = load_train_run_config(Path(config), {"train.steps": steps, "backend": backend})
    with tempfile.TemporaryDirectory() as run_dir:
        return build_trainer(cfg, Path(run_dir)).train()


def report(records: list[dict], label: str) -> None:
    print(label)
    print(f"{'step':>4} {'samples':>7} " + " ".join(f"{p + ' s':>10}" for p in PHASES) + "  rollout share")
    totals = dict.fromkeys(PHASES, 0.0)
    for r in records:
        times = {p: r.get(f"time/{p}", 0.0) for p in PHASES}
        for p in PHASES:
            totals[p] += times[p]
        share = times["rollout"] / sum(times.values())
        cells = " ".join(f"{times[p]:10.1f}" for p in PHASES)
        print(f"{r['step']:>4} {r['samples']:>7} {cells}  {share:12.1%}")
    n = len(records)
    step = sum(totals.values()) / n
    means = " ".join(f"{totals[p] / n:10.1f}" for p in PHASES)
    print(f"mean {'':>7} {means}  {totals['rollout'] / sum(totals.values()):12.1%}  ({step:.1f} s per step)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="search_r1/smollm135m-cpu")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--backends", default="hf,ov", help="rollout engines to compare, in this order")
    parser.add_argument("--log", type=Path, help="summarize this train_log.jsonl instead of training")
    args = parser.parse_args()
    if args.log:
        records = [json.loads(line) for line in args.log.read_text().splitlines() if line.strip()]
        report(records, f"timings logged in {args.log}")
        return
    rollout = {}
    for backend in args.backends.split(","):
        records = run_steps(args.config, args.steps, backend)
        report(records, f"{args.steps} steps of {args.config}, rollouts through {backend}")
        rollout[backend] = sum(r["time/rollout"] for r in records)
    if {"hf", "ov"} <= rollout.keys():
        print(f"rollout time hf / ov: {rollout['hf'] / rollout['ov']:.2f}x")


if __name__ == "__main__":
    main()
