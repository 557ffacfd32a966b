"""transformers (`hf`, fp32) vs OpenVINO GenAI (`ov`) on real team runs of the smoke questions.

For each method: the same questions, greedy decoding, the same retriever; each engine's model is loaded
before the clock starts, and the ov pipeline is built fresh for each method (its prefix cache starts cold,
so neither engine reuses work from another method's run). Prints seconds and questions/s of each, the
ratio, EM/F1 side by side with the paired F1 difference (ov − hf, 95% bootstrap interval over questions)
and how many predictions are identical. GenAI does not report prefix-cache hits, so none are printed.

    python benchmarks/bench_engine.py --methods naive_rag,search_r1,mask [--limit 5] [--model ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from searchteam.config import RunConfig
from searchteam.eval.compare import bootstrap_interval
from searchteam.eval.runner import evaluate, read_results
from searchteam.factory import build_components, build_team
from searchteam.llm.models import DEFAULT_MODEL


def run(method: str, backend: str, args: argparse.Namespace, out: Path) -> tuple[float, list[dict]]:
    config = RunConfig(
        method=method,
        model=args.model,
        backend=backend,
        ov_precision=args.precision,
        split="smoke",
        limit=args.limit,
        out=out / f"{method}-{backend}",
        device="cpu",
    )
    team = build_team(config)
    components = build_components(config, team)  # model loading is not timed
    summary = evaluate(config, components, progress=False)
    rows = sorted(read_results(config.out / "results.jsonl"), key=lambda r: r["id"])
    return summary["seconds_total"], rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="naive_rag,search_r1,mask")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--precision", default="int8", help="weights of the ov engine: int8 | fp16 | fp32")
    parser.add_argument("--limit", type=int, default=None, help="questions per smoke dataset (of 10)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    report = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            ov_seconds, ov_rows = run(method, "ov", args, Path(tmp))
            hf_seconds, hf_rows = run(method, "hf", args, Path(tmp))
            n = len(hf_rows)
            both = {"hf": hf_rows, "ov": ov_rows}
            f1 = {name: np.array([r["f1"] for r in rows]) for name, rows in both.items()}
            em = {name: np.mean([r["em"] for r in rows]) for name, rows in both.items()}
            low, high = bootstrap_interval(f1["ov"] - f1["hf"])
            same = sum(a["prediction"] == b["prediction"] for a, b in zip(hf_rows, ov_rows, strict=True))
            row = {
                "method": method,
                "model": args.model,
                "ov_precision": args.precision,
                "n": n,
                "hf_s": round(hf_seconds, 1),
                "ov_s": round(ov_seconds, 1),
                "hf_q_per_s": round(n / hf_seconds, 3),
                "ov_q_per_s": round(n / ov_seconds, 3),
                "speedup": round(hf_seconds / ov_seconds, 2),
                "em_hf": round(float(em["hf"]), 3),
                "em_ov": round(float(em["ov"]), 3),
                "f1_hf": round(float(f1["hf"].mean()), 3),
                "f1_ov": round(float(f1["ov"].mean()), 3),
                "f1_diff_ci95": [round(low, 3), round(high, 3)],
                "same_prediction": same,
            }
            report.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
