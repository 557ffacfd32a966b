"""Write the 213 multi-hop dev questions of benchmark v1 that no training choice of issue 10 used
(docs/training.md, "Held-out check"): hotpotqa and 2wikimultihopqa dev lines 151-200 (the first 150 of each
were the tuning set) and every v1 musique and bamboogle dev line. Evaluate with `searchteam eval --questions
OUT`.

    python experiments/heldout_questions.py runs/heldout.jsonl
"""

import sys
from pathlib import Path

from searchteam.data.benchmark import BENCHMARK_DIR, MULTI_HOP, V1_LINES

TUNED = 150  # dev questions per dataset that the earlier runs were compared and chosen on
TUNED_DATASETS = ("hotpotqa", "2wikimultihopqa")


def main(out: Path) -> None:
    lines = []
    for dataset in MULTI_HOP:
        dev = (BENCHMARK_DIR / "questions" / dataset / "dev.jsonl").read_text(encoding="utf-8").splitlines()
        dev = dev[: V1_LINES.get((dataset, "dev"), len(dev))]
        lines += dev[TUNED:] if dataset in TUNED_DATASETS else dev
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} questions -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
