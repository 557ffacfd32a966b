"""BM25 speed: our bm25s-backed BM25Retriever vs rank_bm25.BM25Okapi on the shipped corpus.

Both see the same tokens (bm25s' tokenizer: lower-cased, English stop words removed, Snowball-stemmed) and
the same k1/b; they differ in IDF (bm25s: Lucene's log(1 + (N-df+.5)/(df+.5)); rank_bm25: Robertson's
log((N-df+.5)/(df+.5)) with a floor), so rankings agree closely but not exactly. rank_bm25 scores every
document per query in Python, so by default it is timed on fewer queries; the output says how many.

    .venv/bin/python benchmarks/bench_bm25.py [--queries 500] [--rank-bm25-queries 100]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from rank_bm25 import BM25Okapi

from searchteam.data import CORPUS_PATH, load_benchmark
from searchteam.metrics import sufficiency
from searchteam.retrieval.bm25 import BM25Retriever, tokenize
from searchteam.retrieval.corpus import load_corpus, passage_text
from searchteam.types import Passage, Question

T = TypeVar("T")
K = 5
K1, B = 0.9, 0.4


@dataclass
class Timing:
    wall: float
    cpu: float  # this process, all threads: robust to other load on a shared machine

    def __str__(self) -> str:
        return f"{self.wall:6.2f} s wall, {self.cpu:6.2f} s CPU"

    def rate(self, n: int) -> str:
        return f"{n / self.wall:9.1f} queries/s, {1000 * self.cpu / n:6.2f} ms CPU/query"


def timed(fn: Callable[[], T]) -> tuple[T, Timing]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, Timing(time.perf_counter() - wall, time.process_time() - cpu)


def recall_at_k(questions: list[Question], hits: list[list[Passage]]) -> float:
    """Share of questions with a gold answer inside one of the retrieved passages."""
    found = [
        sufficiency([p.contents for p in h], q.golden_answers) for q, h in zip(questions, hits, strict=True)
    ]
    return float(np.mean(found))


class RankBM25Retriever:
    """rank_bm25.BM25Okapi over the same tokens, returning the same Passage rankings."""

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.okapi = BM25Okapi(tokenize([passage_text(p) for p in passages]), k1=K1, b=B)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        hits = []
        for tokens in tokenize(queries):
            scores = self.okapi.get_scores(tokens)
            top = np.argsort(-scores, kind="stable")[:k]
            hits.append([self.passages[i].model_copy(update={"score": float(scores[i])}) for i in top])
        return hits


def overlap(a: list[list[Passage]], b: list[list[Passage]]) -> float:
    """Mean share of top-k passage ids the two rankings have in common."""
    shared = [len({p.id for p in x} & {p.id for p in y}) / max(len(x), 1) for x, y in zip(a, b, strict=True)]
    return float(np.mean(shared))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--rank-bm25-queries", type=int, default=100)
    args = parser.parse_args()

    questions = load_benchmark(None, "dev")[: args.queries]
    queries = [q.question for q in questions]
    few = min(args.rank_bm25_queries, len(queries))
    print(f"corpus: {CORPUS_PATH.name}, load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"queries: first {len(queries)} dev questions of the shipped benchmark, k={K}, k1={K1}, b={B}\n")

    os.environ["SEARCHTEAM_CACHE"] = cache = tempfile.mkdtemp(prefix="bench-bm25-")  # build from scratch
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    ours, build = timed(lambda: BM25Retriever(k1=K1, b=B))
    _, reload = timed(lambda: BM25Retriever(k1=K1, b=B))
    ours.search(queries[:8], K)  # warm-up
    hits, batch = timed(lambda: ours.search(queries, K))
    _, single = timed(lambda: [ours.search([q], K) for q in queries])
    threaded = BM25Retriever(k1=K1, b=B, n_threads=2)
    _, threads = timed(lambda: threaded.search(queries, K))

    theirs, their_build = timed(lambda: RankBM25Retriever(load_corpus(CORPUS_PATH)))
    their_hits, their = timed(lambda: theirs.search(queries[:few], K))

    n = len(queries)
    print("index build (read corpus, tokenize, index):")
    print(f"  bm25s BM25Retriever   {build}  (+ save to cache)")
    print(f"  rank_bm25 BM25Okapi   {their_build}  (in memory only)")
    print(f"  bm25s reload from cache: {reload.wall:.2f} s wall")
    print("search:")
    print(f"  bm25s, one batch      {batch.rate(n)}  ({n} queries)")
    print(f"  bm25s, batch, 2 thr.  {threads.rate(n)}  ({n} queries)")
    print(f"  bm25s, one at a time  {single.rate(n)}  ({n} queries)")
    print(f"  rank_bm25             {their.rate(few)}  (first {few} queries only)")
    ours_qps, single_qps, their_qps = n / batch.wall, n / single.wall, few / their.wall
    cpu_ratio = (their.cpu / few) / (batch.cpu / n)
    print(
        f"  speed-up: {ours_qps / their_qps:.0f}x batched, {single_qps / their_qps:.0f}x one at a time (wall)"
    )
    print(f"            {cpu_ratio:.0f}x batched (CPU per query)")
    print(f"recall@{K} (a gold answer inside a top-{K} passage):")
    print(
        f"  on the first {few} queries: bm25s {recall_at_k(questions[:few], hits[:few]):.3f}, "
        f"rank_bm25 {recall_at_k(questions[:few], their_hits):.3f}; "
        f"top-{K} id overlap {overlap(hits[:few], their_hits):.3f}"
    )
    print(f"  bm25s on all {len(queries)} queries: {recall_at_k(questions, hits):.3f}")


if __name__ == "__main__":
    main()
