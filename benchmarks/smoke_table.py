"""The smoke tables of docs/results.md: every method with its defaults, one after another.

Runs `searchteam eval --method M --split smoke` (the 90 smoke questions unless `--limit`), or on a questions
file (`--questions`), with the chosen model and backend into `--out/M`, resuming runs already there, and
prints one markdown row per method: EM / cover-EM / F1 per hop group, LLM calls, tokens and retrievals per
question, format-error rate per role and wall time.

    python benchmarks/smoke_table.py --out runs/smoke [--model qwen2.5-coder-0.5b] [--methods mask,dac]
    python benchmarks/smoke_table.py --out runs/v2 --questions runs/v2/report250.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from searchteam.config import RunConfig
from searchteam.eval.runner import evaluate
from searchteam.llm.models import DEFAULT_MODEL
from searchteam.methods import METHODS

GROUPS = ("single-hop", "multi-hop")


def row(summary: dict) -> str:
    cells = []
    for group in GROUPS:
        g = summary["per_group"].get(group, {})
        cells.append(f"{g.get('em', 0):.3f} / {g.get('cover_em', 0):.3f} / {g.get('f1', 0):.3f}")
    errors = ", ".join(f"{role} {rate:.0%}" for role, rate in sorted(summary["format_error_rate"].items()))
    tokens = summary["prompt_tokens_mean"] + summary["completion_tokens_mean"]
    counts = f"{summary['llm_calls_mean']:.1f} | {tokens:.0f} | {summary['retrievals_mean']:.1f}"
    wall = f"{summary['seconds_total']:.0f} s"
    name = f"{summary['method']} | {summary['n']}"
    return f"| {name} | {cells[0]} | {cells[1]} | {counts} | {errors or '–'} | {wall} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--limit", type=int, default=None, help="questions per smoke dataset (of 10)")
    parser.add_argument("--questions", type=Path, default=None, help="a questions file instead of smoke")
    args = parser.parse_args()
    header = "method | n | single-hop EM / cover-EM / F1 | multi-hop EM / cover-EM / F1 | LLM calls/q"
    print(f"| {header} | tokens/q | retrievals/q | format-error rate per role | wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for method in args.methods.split(","):
        config = RunConfig(
            method=method,
            model=args.model,
            backend=args.backend,
            split="smoke",
            questions=args.questions,
            limit=args.limit,
            out=args.out / method,
            resume=True,
        )
        print(row(evaluate(config, progress=False)), flush=True)


if __name__ == "__main__":
    main()
