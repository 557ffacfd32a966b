"""Count, in finished eval runs, the predictions that repeat an answer or a listed entity of the method's
current prompt examples (`Team.example_answers`), and what `Team.solve`'s withdrawal would make of them:
a copy that neither the question nor any passage the episode retrieved contains becomes an empty answer.

    python experiments/example_copies.py runs/leak/search_r1-choose100 runs/dac/choose-base
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean

import yaml

from searchteam.config import RunConfig
from searchteam.factory import build_team
from searchteam.files import read_jsonl_tolerant
from searchteam.metrics import normalize_answer
from searchteam.retrieval.corpus import corpus_of_run, find_passages
from searchteam.teams.base import unsupported_copy


def report(run: Path) -> dict:
    config = yaml.safe_load((run / "config.yaml").read_text())
    copies = build_team(RunConfig(method=config["method"])).example_answers()
    rows = read_jsonl_tolerant(run / "results.jsonl")
    ids = {i for r in rows for s in r.get("searches") or [] for i in s["ids"]}
    corpus, _ = corpus_of_run(config)
    passages = find_passages(corpus, ids) if corpus else {}
    copied, withdrawn, f1_after = [], 0, []
    for row in rows:
        f1 = row["f1"]
        if normalize_answer(row["prediction"] or "") in copies:
            found = [i for s in row.get("searches") or [] for i in s["ids"] if i in passages]
            copied.append(row["prediction"])
            if unsupported_copy(
                row["prediction"], [row["question"], *(passages[i].contents for i in found)], copies
            ):
                withdrawn += 1
                f1 = 0.0
        f1_after.append(f1)
    return {
        "run": str(run),
        "method": config["method"],
        "n": len(rows),
        "copies": len(copied),
        "copied": sorted(set(copied)),
        "would_withdraw": withdrawn,
        "already_withdrawn": sum(1 for r in rows if r.get("withdrawn_example_answer")),
        "f1": round(mean(r["f1"] for r in rows), 4),
        "f1_after": round(mean(f1_after), 4),
    }


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(json.dumps(report(Path(path))))
