"""Batched runtime vs one question at a time: naive_rag on dev questions with the default model.

Prints questions/s of each mode, the ratio, the mean batch size, and the share of wall time spent
outside model and retrieval calls (orchestration overhead). Both modes use the same loaded model,
the same retriever, the same questions and greedy decoding, so the answers must be identical.

    python benchmarks/bench_runtime.py [--n 64] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from searchteam.data import load_benchmark
from searchteam.llm import build_llm
from searchteam.methods import get_team
from searchteam.retrieval import build_retriever
from searchteam.runtime import Sampling, make_backends, run_episodes


def run_mode(team, questions, llm, retriever, max_batch: int, concurrency: int):
    backends = make_backends({"policy": llm}, retriever, max_batch=max_batch)
    started = time.perf_counter()
    episodes, stats = asyncio.run(
        run_episodes(
            team.run, team.name, questions, backends, Sampling(), concurrency=concurrency, progress=False
        )
    )
    wall = time.perf_counter() - started
    batches = backends.llms["policy"].stats
    return episodes, stats, wall, batches.mean_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dataset", default="nq")
    args = parser.parse_args()

    questions = load_benchmark([args.dataset], "dev", limit=args.n)
    llm = build_llm("smollm2-135m")
    retriever = build_retriever("bm25")
    team = get_team("naive_rag")
    run_mode(team, questions[:2], llm, retriever, 2, 2)  # warm-up (allocator, thread pools)

    seq_eps, seq_stats, seq_wall, _ = run_mode(team, questions, llm, retriever, max_batch=1, concurrency=1)
    bat_eps, bat_stats, bat_wall, mean_batch = run_mode(
        team, questions, llm, retriever, max_batch=args.batch_size, concurrency=len(questions)
    )
    same = sum(
        a.answer == b.answer
        for a, b in zip(
            sorted(seq_eps, key=lambda e: e.question.id),
            sorted(bat_eps, key=lambda e: e.question.id),
            strict=True,
        )
    )
    n = len(questions)
    print(f"naive_rag, {n} {args.dataset} dev questions, smollm2-135m on CPU, bm25 top-5")
    print(
        f"one at a time : {n / seq_wall:6.3f} q/s  ({seq_wall:.1f}s)  orchestration share "
        f"{seq_stats.orchestration_share:.1%}"
    )
    print(
        f"batched ({args.batch_size:>3}): {n / bat_wall:6.3f} q/s  ({bat_wall:.1f}s)  orchestration share "
        f"{bat_stats.orchestration_share:.1%}  mean LLM batch {mean_batch:.1f}"
    )
    print(f"speed-up (batched / one at a time): {seq_wall / bat_wall:.2f}x")
    print(f"identical answers: {same}/{n} (padding can change greedy fp32 ties)")


if __name__ == "__main__":
    main()
