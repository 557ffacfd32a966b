"""What a team's later searches add over its first, on questions with supporting titles (HotpotQA): after
the first search, how many supporting titles it held; how often a later search returned one not yet
retrieved (a second hop found); how many questions end with all of them; and the answers' F1 in each case.

Reads finished eval runs (`RUN/results.jsonl`: each search's passage ids, and the F1) or a warm start's
sampled episodes (`RUN/warm_start/collected-NN.jsonl`: episodes and their scores), where it also counts the
turns the environment wrote (Search-R1's privileged `bridge_hint`).

    python experiments/second_hop_turns.py runs/A runs/B/warm_start/collected-01.jsonl
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from searchteam.data import CORPUS_PATH, load_benchmark
from searchteam.eval.runner import read_results
from searchteam.files import read_jsonl_tolerant
from searchteam.retrieval.corpus import load_corpus


@dataclass(frozen=True)
class Searched:
    """One question's searches as lists of retrieved titles, in order, and its answer's F1."""

    id: str
    searches: list[list[str]]
    f1: float
    written: int = 0  # turns the environment wrote in the agent's name


def from_results(path: Path, titles_of: dict[str, str]) -> list[Searched]:
    return [
        Searched(r["id"], [[titles_of[i] for i in s["ids"]] for s in r["searches"]], r["f1"])
        for r in read_results(path)
        if not r.get("error")
    ]


def from_collected(path: Path) -> list[Searched]:
    return [
        Searched(
            r["question"]["id"],
            [[p["title"] for p in s["passages"]] for s in r["retrievals"]],
            r["score"],
            sum(bool(t.get("meta", {}).get("written")) for t in r["turns"]),
        )
        for r in read_jsonl_tolerant(path)
        if not r.get("error")
    ]


COUNTS = ["questions", "searches", "first: all", "first: some", "first: none", "later found new", "end: all"]


def tally(runs: list[Searched], supporting: dict[str, set[str]]) -> dict[str, float]:
    """The counts and mean F1s of one run over its questions that have supporting titles."""
    counts: dict[str, float] = dict.fromkeys([*COUNTS, "written"], 0)
    f1: dict[str, list[float]] = {"all found": [], "not all": [], "a later search found one": []}
    for run in runs:
        gold = supporting.get(run.id)
        if not gold or not run.searches:
            continue
        first = gold & set(run.searches[0])
        ended = gold & {t for s in run.searches for t in s}
        counts["questions"] += 1
        counts["searches"] += len(run.searches)
        counts[{len(gold): "first: all", 0: "first: none"}.get(len(first), "first: some")] += 1
        counts["later found new"] += ended != first
        counts["end: all"] += ended == gold
        counts["written"] += run.written > 0
        f1["all found" if ended == gold else "not all"].append(run.f1)
        if ended != first:
            f1["a later search found one"].append(run.f1)
    return counts | {f"F1, {case}": mean(xs) if xs else float("nan") for case, xs in f1.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="eval run folders or collected-NN.jsonl files")
    args = parser.parse_args()
    questions = load_benchmark(["hotpotqa", "musique"], "dev") + load_benchmark(["hotpotqa"], "train")
    supporting = {q.id: set(q.meta.get("supporting_titles") or []) for q in questions}
    titles_of = {p.id: p.title for p in load_corpus(CORPUS_PATH)}
    for path in args.runs:
        runs = from_collected(path) if path.is_file() else from_results(path / "results.jsonl", titles_of)
        c = tally(runs, supporting)
        n = int(c["questions"])
        print(f"{path}: {n} questions with supporting titles, {c['searches'] / max(n, 1):.2f} searches each")
        print(
            f"  after the first search all {int(c['first: all'])}, some {int(c['first: some'])}, none "
            f"{int(c['first: none'])}; a later search found a new one {int(c['later found new'])}; "
            f"all found in the end {int(c['end: all'])}"
        )
        if c["written"]:
            print(f"  with a turn the environment wrote: {int(c['written'])}")
        print(
            f"  F1: all found {c['F1, all found']:.3f}, not all {c['F1, not all']:.3f}, where a later search "
            f"found one {c['F1, a later search found one']:.3f}"
        )


if __name__ == "__main__":
    main()
