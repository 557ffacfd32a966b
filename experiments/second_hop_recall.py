"""How often BM25 finds a question's second-hop passage, without a hint and with one: what a search turn
could add over the question's own top-k if the model wrote the right query.

For every multi-hop question whose `supporting_titles` are two (HotpotQA, MuSiQue), the question's top-k is
searched first. Where it holds one supporting title but not the other (the missing one is the second hop),
the missing title is searched for with queries a searcher could write after reading the found passage:

- `question`: the question again (what the teams' repeated second query amounts to);
- `found passage`: the found supporting passage's text (a searcher that copies what it read);
- `question + bridge`: the question with the missing title appended (a searcher that names the bridge
  entity it read);
- `bridge`: the missing title alone;
- `question, the next k unseen`: the question again, from a retriever that leaves out the passages already
  returned (ranks k + 1 to 2k).

Each query's top-k counts as a hit when it holds a passage of the missing title. Also counted: how often the
found passage's text names the missing title (a searcher could copy the bridge from what it read). The
bridge queries use the gold title, so they are the hint that a privileged-sampling warm start would give,
not something a team has at test time.

    python experiments/second_hop_recall.py [--split train --limit 500 --k 5]
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable

from searchteam.data import CORPUS_PATH, load_benchmark
from searchteam.retrieval import build_retriever
from searchteam.types import Passage, Question

Query = Callable[[Question, Passage, str], str]
QUERIES: dict[str, Query] = {
    "question": lambda q, found, bridge: q.question,
    "found passage": lambda q, found, bridge: found.text,
    "question + bridge": lambda q, found, bridge: f"{q.question} {bridge}",
    "bridge": lambda q, found, bridge: bridge,
}


def two_hop(questions: list[Question]) -> list[Question]:
    return [q for q in questions if len(set(q.meta.get("supporting_titles") or [])) == 2]


def count(questions: list[Question], retriever, k: int) -> Counter:
    """Counts: questions, top-k holding both, one, none; then per query the hits on the missing title."""
    counts: Counter = Counter(questions=len(questions))
    deeper = retriever.search([q.question for q in questions], 2 * k)
    missing: list[tuple[Question, Passage, str]] = []
    for q, ranked in zip(questions, deeper, strict=True):
        gold = set(q.meta["supporting_titles"])
        found = [p for p in ranked[:k] if p.title in gold]
        held = {p.title for p in found}
        counts[{2: "both in top-k", 1: "one in top-k", 0: "none in top-k"}[len(held)]] += 1
        if len(held) == 1:
            bridge = (gold - held).pop()
            missing.append((q, found[0], bridge))
            counts["question, the next k unseen"] += any(p.title == bridge for p in ranked[k:])
    named = [bridge.lower() in found.text.lower() for _, found, bridge in missing]
    counts["bridge in found passage"] = sum(named)
    for name, query in QUERIES.items():
        results = retriever.search([query(q, found, bridge) for q, found, bridge in missing], k)
        counts[name] = sum(
            any(p.title == bridge for p in top) for (_, _, bridge), top in zip(missing, results, strict=True)
        )
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="train")
    parser.add_argument("--datasets", default="hotpotqa,musique")
    parser.add_argument("--limit", type=int, default=500, help="questions per dataset")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    retriever = build_retriever("bm25", corpus=CORPUS_PATH)
    for dataset in args.datasets.split(","):
        questions = two_hop(load_benchmark([dataset], args.split, args.limit))
        if not questions:
            print(f"{dataset} ({args.split}): no question with two supporting titles")
            continue
        c = count(questions, retriever, args.k)
        one = c["one in top-k"]
        print(
            f"{dataset} ({args.split}, top-{args.k}): {c['questions']} two-hop questions, both supporting "
            f"titles in the question's top-k {c['both in top-k']}, one {one}, none {c['none in top-k']}"
        )
        named = c["bridge in found passage"]
        print(f"  the found passage names the missing title: {named}/{one} ({named / max(one, 1):.0%})")
        for name in [*QUERIES, "question, the next k unseen"]:
            share = c[name] / max(one, 1)
            print(f"  the missing one found by the query '{name}': {c[name]}/{one} ({share:.0%})")


if __name__ == "__main__":
    main()
