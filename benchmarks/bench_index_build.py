"""What benchmark v2's larger corpus costs: BM25 index build and load time for v1's corpus (23,831 passages)
and v2's (53,118), in one run, each in a fresh cache, alternating the two so neither always runs second.
Times are this process's CPU seconds (all threads), which a second job on the machine inflates less than
wall time; wall time is printed beside them.

    python benchmarks/bench_index_build.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from searchteam.data.benchmark import CORPUS_PATH, benchmark_corpus
from searchteam.retrieval.bm25 import BM25Retriever


def timed(fn) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def build_and_load(corpus: Path) -> dict[str, tuple[float, float]]:
    """Build the index in an empty cache, then load it again as a later run would."""
    root = Path(tempfile.mkdtemp(prefix="bench-index-"))
    os.environ["SEARCHTEAM_CACHE"] = str(root)
    try:
        return {"build": timed(lambda: BM25Retriever(corpus)), "load": timed(lambda: BM25Retriever(corpus))}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    corpora = {"v1": benchmark_corpus("v1"), "v2": CORPUS_PATH}
    runs: dict[str, list[dict[str, tuple[float, float]]]] = {"v1": [], "v2": []}
    for repeat in range(args.repeats):
        for version in ("v1", "v2") if repeat % 2 == 0 else ("v2", "v1"):
            runs[version].append(build_and_load(corpora[version]))
    print("| corpus | step | CPU s (median) | wall s (median) |")
    print("|---|---|---|---|")
    medians = {}
    for version, timings in runs.items():
        for step in ("build", "load"):
            cpu = statistics.median(t[step][0] for t in timings)
            wall = statistics.median(t[step][1] for t in timings)
            medians[version, step] = cpu
            print(f"| {version} | {step} | {cpu:.2f} | {wall:.2f} |")
    for step in ("build", "load"):
        extra = medians["v2", step] - medians["v1", step]
        ratio = medians["v2", step] / medians["v1", step]
        print(f"v2 / v1 {step}: {ratio:.2f}x CPU (+{extra:.1f} s), {args.repeats} run(s) each")


if __name__ == "__main__":
    main()
