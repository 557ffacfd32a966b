"""Write a slice of the shipped dev questions for `searchteam eval --questions OUT`: lines FIRST-LAST
(1-based, inclusive) of each named dataset's dev split. Recipes are chosen on hotpotqa and 2wikimultihopqa
dev lines 1-100 and reported once, after choosing, on lines 101-200.

    python experiments/dev_slice.py 101 150 runs/report100.jsonl
    python experiments/dev_slice.py 1 50 runs/nq50.jsonl --datasets nq
"""

import argparse
from pathlib import Path

from searchteam.data.benchmark import BENCHMARK_DIR


def dev_slice(first: int, last: int, datasets: list[str]) -> list[str]:
    """The dev lines first..last (1-based, inclusive) of each dataset, in the order given."""
    lines = []
    for dataset in datasets:
        dev = (BENCHMARK_DIR / "questions" / dataset / "dev.jsonl").read_text(encoding="utf-8").splitlines()
        if last > len(dev):
            raise SystemExit(f"{dataset} dev has {len(dev)} questions, not {last}")
        lines += dev[first - 1 : last]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("first", type=int)
    parser.add_argument("last", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--datasets", default="hotpotqa,2wikimultihopqa")
    args = parser.parse_args()
    lines = dev_slice(args.first, args.last, args.datasets.split(","))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(lines)} questions -> {args.out}")


if __name__ == "__main__":
    main()
