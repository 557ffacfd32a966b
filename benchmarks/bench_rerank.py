"""Reranking: retrieval recall@k of BM25 alone vs BM25 + a reranker on the shipped dev questions.

BM25 fetches the top `--depth` passages per question; the reranker (default: the shipped all-MiniLM-L6-v2
as a bi-encoder, since no cross-encoder ships offline; any sentence-transformers CrossEncoder with
`--reranker cross:NAME`) rescores them. recall@k is the share of questions with a passage containing a gold
answer (whole words, `searchteam.metrics.gold_rank`) in the top k, before and after; recall@depth
bounds what any reranking of those candidates can reach. Also prints the time each stage took.

    .venv/bin/python benchmarks/bench_rerank.py [--limit 100] [--datasets nq,hotpotqa] [--depth 20]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

from searchteam.data import load_benchmark
from searchteam.data.benchmark import hop_group
from searchteam.metrics import gold_rank, recall_at_k
from searchteam.retrieval import build_retriever
from searchteam.retrieval.corpus import passage_text
from searchteam.retrieval.rerank import build_scorer, rerank
from searchteam.types import Passage, Question

KS = (1, 3, 5)


def recalls(questions: list[Question], rankings: list[list[Passage]], ks: list[int]) -> dict[int, float]:
    """recall@k for each k: the share of questions whose ranking has a gold answer within its top k."""
    ranks = [
        gold_rank([[p.contents for p in ranking]], q.golden_answers)
        for q, ranking in zip(questions, rankings, strict=True)
    ]
    return {k: sum(recall_at_k(r, k) for r in ranks) / len(ranks) for k in ks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=None, help="comma-separated (default: every dev dataset)")
    parser.add_argument("--limit", type=int, default=100, help="questions per dataset")
    parser.add_argument("--depth", type=int, default=20, help="BM25 candidates the reranker rescores")
    parser.add_argument("--reranker", default="all-MiniLM-L6-v2")
    parser.add_argument("--batch", type=int, default=32, help="questions per reranker call")
    args = parser.parse_args()

    datasets = args.datasets.split(",") if args.datasets else None
    questions = load_benchmark(datasets, "dev", args.limit)
    ks = sorted({k for k in KS if k < args.depth} | {args.depth})
    bm25 = build_retriever("bm25")
    scorer = build_scorer(args.reranker)
    print(
        f"{len(questions)} dev questions, BM25 top {args.depth} reranked by {scorer.name} "
        f"({type(scorer).__name__})"
    )

    start = time.perf_counter()
    candidates = bm25.search([q.question for q in questions], args.depth)
    bm25_seconds = time.perf_counter() - start
    start = time.perf_counter()
    reranked: list[list[Passage]] = []
    for first in range(0, len(questions), args.batch):
        part = list(
            zip(questions[first : first + args.batch], candidates[first : first + args.batch], strict=True)
        )
        pairs = [(q.question, passage_text(p)) for q, found in part for p in found]
        scores = iter(scorer.score(pairs))
        reranked += [rerank(found, [next(scores) for _ in found], args.depth) for _, found in part]
    rerank_seconds = time.perf_counter() - start

    slices: dict[str, list[int]] = defaultdict(list)
    for i, q in enumerate(questions):
        slices["all"].append(i)
        slices[hop_group(q.dataset)].append(i)
    print(f"\n{'slice':<11} {'n':>5}  " + "  ".join(f"{'R@' + str(k):>17}" for k in ks))
    for name, rows in slices.items():
        qs = [questions[i] for i in rows]
        before = recalls(qs, [candidates[i] for i in rows], ks)
        after = recalls(qs, [reranked[i] for i in rows], ks)
        cells = "  ".join(f"{before[k]:.3f} → {after[k]:.3f} ({after[k] - before[k]:+.3f})" for k in ks)
        print(f"{name:<11} {len(rows):>5}  {cells}")
    n = len(questions)
    print(
        f"\nBM25: {bm25_seconds:.2f} s ({1000 * bm25_seconds / n:.1f} ms/question); "
        f"rerank: {rerank_seconds:.2f} s ({1000 * rerank_seconds / n:.1f} ms/question, "
        f"{n * args.depth / rerank_seconds:.0f} passages/s)"
    )


if __name__ == "__main__":
    main()
