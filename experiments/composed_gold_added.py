"""How often a composed team's gatherers added a gold passage that the question's own top-k lacked.

For each question (dev or train) of a composed team's eval run, a passage is gold when its title is one of the
question's `supporting_titles`. The question's top-k is naive RAG's retrieval in NAIVE_RUN (the same
retriever and question, so the same passages). Counted per run: questions where a gatherer that calls a
model handed over a gold passage whose title the top-k lacked; and questions whose reader saw every
supporting title, against naive RAG's top-k; and the searches a model wrote after reading (per question,
and the share that repeat the question).

    python experiments/composed_gold_added.py NAIVE_RUN RUN [RUN ...]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path

from searchteam.data import load_benchmark
from searchteam.data.benchmark import benchmark_corpus
from searchteam.retrieval.corpus import load_corpus


def rows(run: Path) -> dict[str, dict]:
    lines = (run / "results.jsonl").read_text(encoding="utf-8").splitlines()
    return {row["id"]: row for row in map(json.loads, lines)}


def titles_by_id(ids: set[str]) -> dict[str, str]:
    return {p.id: p.title for p in load_corpus(benchmark_corpus()) if p.id in ids}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("naive_run", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args()
    naive = rows(args.naive_run)
    runs = {run: rows(run) for run in args.runs}
    questions = [q for split in ("dev", "train") for q in load_benchmark(None, split)]
    gold = {q.id: set(q.meta.get("supporting_titles") or []) for q in questions}
    wanted = {i for row in naive.values() for s in row["searches"] for i in s["ids"]}
    for by_id in runs.values():
        for row in by_id.values():
            record = row["states"][-1]
            wanted |= set(record["evidence"]) | {i for p in record["parts"] for i in p["passages"]}
    title = titles_by_id(wanted)
    top_k = {qid: {title[i] for s in row["searches"] for i in s["ids"]} for qid, row in naive.items()}
    n = len(naive)
    both_top_k = sum(bool(gold[q]) and gold[q] <= top_k[q] for q in naive)
    print(f"naive RAG top-k: every supporting title for {both_top_k} of {n}")
    for run, by_id in runs.items():
        added = both = 0
        for qid, row in by_id.items():
            record = row["states"][-1]
            searched = {title[i] for p in record["parts"] if p["place"] == "gatherer" and p["roles"]
                        for i in p["passages"]}  # fmt: skip
            added += bool((searched & gold[qid]) - top_k[qid])
            both += bool(gold[qid]) and gold[qid] <= {title[i] for i in record["evidence"]}
        print(f"{run}: a gatherer added a gold title the top-k lacked on {added} of {len(by_id)}; "
              f"the reader saw every supporting title on {both}")  # fmt: skip
        print(f"  {written_searches(by_id.values())}")


def written_searches(rows: Iterable[dict]) -> str:
    """The searches a model wrote after its first turn (`after_turns` > 0): how many per question, and how
    many repeat the question word for word."""
    rows = list(rows)
    queries = [(s["query"], row["question"]) for row in rows for s in row["searches"] if s["after_turns"] > 0]
    repeats = sum(query.strip().lower() == question.strip().lower() for query, question in queries)
    return (f"{len(queries) / len(rows):.2f} written searches a question, {repeats} of {len(queries)} "
            f"repeat the question")  # fmt: skip


if __name__ == "__main__":
    main()
