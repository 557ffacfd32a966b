"""How much a document selector or a searcher could add in front of naive RAG's reader: the reader answers
the same questions from naive RAG's top-k passages, from the first passage alone, from an oracle selection
(the first top-k passage holding a gold answer string, or every such passage; the whole top-k where none
holds one), and from the question's gold supporting paragraphs looked up by title in the corpus
(`gold_support`: a perfect searcher; hotpotqa and musique questions carry `supporting_titles`). Each
selection is a normal eval run under OUT/SELECTION, so `searchteam compare OUT/top_k OUT/oracle_first
--by dataset` gives the paired differences.

    python experiments/evidence_headroom.py --model qwen2.5-coder-0.5b --limit 150 --out runs/headroom

`--support-recall RUN ...` instead counts, for any eval runs, the questions with supporting titles whose
searches retrieved all of them or at least one (what a searcher found, e.g. QAgent's against naive RAG's).

The oracles read the gold answers or paragraphs, so their runs are upper bounds, not methods.
docs/training.md ("Where the F1 is lost") has the measurements.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from functools import cache
from pathlib import Path

from searchteam.data import CORPUS_PATH, load_benchmark
from searchteam.data.benchmark import MULTI_HOP
from searchteam.eval.runner import evaluate, read_results
from searchteam.factory import build_components, load_run_config
from searchteam.methods.naive_rag.team import NaiveRAG
from searchteam.metrics import hit
from searchteam.retrieval.corpus import load_corpus
from searchteam.runtime.context import Context
from searchteam.teams.answering import answer_call
from searchteam.teams.base import TeamSettings, format_documents
from searchteam.types import Passage, Question

Selection = Callable[[list[Passage], Question], list[Passage]]


def holding(docs: list[Passage], q: Question) -> list[Passage]:
    return [d for d in docs if hit(d.contents, q.golden_answers)]


@cache
def passages_by_title() -> dict[str, list[Passage]]:
    by_title: dict[str, list[Passage]] = {}
    for passage in load_corpus(CORPUS_PATH):
        by_title.setdefault(passage.title, []).append(passage)
    return by_title


def gold_support(docs: list[Passage], q: Question) -> list[Passage]:
    """The first corpus passage of each supporting title, in the dataset's order; the top-k without them."""
    found = [passages_by_title().get(title, [])[:1] for title in q.meta.get("supporting_titles", [])]
    return [p for passages in found for p in passages] or docs


def support_found(run: Path) -> tuple[int, int, int]:
    """(questions with supporting titles, those whose searches retrieved all of them, or at least one)."""
    titles_of = {p.id: p.title for passages in passages_by_title().values() for p in passages}
    supporting = {q.id: set(q.meta.get("supporting_titles") or []) for q in load_benchmark(MULTI_HOP, "dev")}
    counted = all_found = any_found = 0
    for row in read_results(run / "results.jsonl"):
        wanted = supporting.get(row["id"])
        if not wanted:
            continue
        found = wanted & {titles_of[i] for search in row["searches"] for i in search["ids"]}
        counted, all_found, any_found = counted + 1, all_found + (found == wanted), any_found + bool(found)
    return counted, all_found, any_found


SELECTIONS: dict[str, Selection] = {
    "top_k": lambda docs, q: docs,
    "first": lambda docs, q: docs[:1],
    "oracle_first": lambda docs, q: holding(docs, q)[:1] or docs,
    "oracle_all": lambda docs, q: holding(docs, q) or docs,
    "gold_support": gold_support,
}


class SelectedRAG(NaiveRAG):
    """Naive RAG whose reader sees only the selected passages of its top-k."""

    def __init__(self, select: Selection, settings: TeamSettings | None = None) -> None:
        super().__init__(settings)
        self.select = select

    async def run(self, q: Question, ctx: Context) -> str:
        docs = await ctx.search(q.question, k=self.settings.top_k)
        shown = self.select(docs, q)
        return await answer_call(ctx, self, question=q.question, documents=format_documents(shown))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dataset", default="hotpotqa,2wikimultihopqa")
    parser.add_argument("--limit", type=int, default=150, help="questions per dataset")
    parser.add_argument("--questions", type=Path, help="a question file instead of --dataset/--limit")
    parser.add_argument("--out", type=Path, help="folder of the selection runs")
    parser.add_argument("--selections", default="top_k,first,oracle_first,oracle_all", help="comma-separated")
    parser.add_argument("--support-recall", type=Path, nargs="+", metavar="RUN", help="count found titles")
    args = parser.parse_args()
    if args.support_recall:
        for run_dir in args.support_recall:
            counted, all_found, any_found = support_found(run_dir)
            print(f"{run_dir}: all supporting titles found {all_found}/{counted}, at least one {any_found}")
        return

    if args.out is None:
        parser.error("--out is required to run the selections")
    run = {"method": "naive_rag", "model": args.model, "datasets": args.dataset.split(","), "split": "dev"}
    run |= {"questions": args.questions} if args.questions else {"limit": args.limit}
    components = None
    for name in args.selections.split(","):
        config = load_run_config(None, {**run, "out": args.out / name, "resume": True})
        team = SelectedRAG(SELECTIONS[name], TeamSettings(top_k=config.top_k))
        components = components or build_components(config, team)
        components.team = team
        summary = evaluate(config, components)
        print(f"{name}: EM {summary['em']:.3f} F1 {summary['f1']:.3f} (n = {summary['n']})")


if __name__ == "__main__":
    main()
