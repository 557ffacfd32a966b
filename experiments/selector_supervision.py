"""Supervised data for JADE's document selector: for each HotpotQA `train` question, the selector prompt
over BM25's top-k of the question, with the ids of the gold supporting paragraphs among them as the
target (`<id>0, 3</id>`); questions with none in the top-k are left out. The examples are written as
warm-start round 1's collected samples (score 1), so `searchteam train` with a one-round warm start and
`train: {roles: [ds]}` fine-tunes the selector on them instead of sampling:

    python experiments/selector_supervision.py runs/selector
    searchteam train --config CONFIG --out runs/selector        # config in docs/training.md

The target comes from the dataset's `supporting_titles`, not from the answer (DAC's hard positives and
DECOR's filter reward are the papers' per-role signals of this kind). docs/training.md ("A selector
trained on the supporting paragraphs") has the measurements.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from searchteam.data import load_benchmark
from searchteam.methods import get_team
from searchteam.retrieval import build_retriever
from searchteam.retrieval.base import Retriever
from searchteam.rl.warm_start.data import save_collected
from searchteam.teams.selectors import selection_fields
from searchteam.types import Episode, Question, Turn


def selection_episodes(questions: list[Question], retriever: Retriever, k: int) -> list[Episode]:
    """One JADE episode with one `ds` turn per question whose top-k holds a supporting paragraph."""
    team = get_team("jade")
    episodes = []
    for q, docs in zip(questions, retriever.search([q.question for q in questions], k), strict=True):
        supporting = set(q.meta.get("supporting_titles") or [])
        gold = [i for i, doc in enumerate(docs) if doc.title in supporting]
        if not gold:
            continue
        turn = Turn(
            role="ds",
            messages=team.chat("ds", question=q.question, **selection_fields(docs)),
            completion=f"<id>{', '.join(map(str, gold))}</id>",
        )
        episodes.append(Episode(question=q, method="jade", turns=[turn], answer=q.golden_answers[0]))
    return episodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the training run's --out folder")
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--dataset", default="hotpotqa", help="one with supporting_titles")
    args = parser.parse_args()
    questions = [q for q in load_benchmark([args.dataset], "train") if q.meta.get("supporting_titles")]
    episodes = selection_episodes(questions, build_retriever("bm25"), args.top_k)
    save_collected(args.run_dir, 1, episodes, [1.0] * len(episodes))
    both = sum(e.turns[0].completion.count(",") > 0 for e in episodes)
    print(f"{len(questions)} questions, {len(episodes)} with a supporting paragraph in the top {args.top_k}")
    print(f"({both} with more than one); written to {args.run_dir}")


if __name__ == "__main__":
    main()
