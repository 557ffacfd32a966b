"""`searchteam compare RUN_A RUN_B`: two eval runs paired question by question.

A quality claim ("B beats A") rests on the paired difference of per-question scores, not on two means: the
same questions are hard for both runs, so pairing removes most of the variance. For each slice (all
questions, each hop group, each dataset) this reports n, both means, the mean difference B − A, its 95%
paired bootstrap interval (questions resampled with replacement) and a two-sided paired sign-flip p-value
(exact up to `EXACT_SIGN_FLIP` nonzero differences, Monte Carlo beyond, where the smallest possible value
is 1 / (ROUNDS + 1))."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from searchteam.data.benchmark import answer_form, hop_group
from searchteam.errors import CompareError, JsonlError
from searchteam.files import read_jsonl_numbered

RESULTS = "results.jsonl"
EXACT_SIGN_FLIP = 16  # 2^16 sign patterns enumerate in well under a second
ROUNDS = 10_000


@dataclass
class PairedDiff:
    """Run B minus run A on one metric over the questions both runs answered."""

    slice: str
    metric: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    b_better: int  # questions where B scored higher
    a_better: int

    @property
    def significant(self) -> bool:
        """Whether the 95% interval excludes 0."""
        return self.ci_low > 0 or self.ci_high < 0


def load_rows(run: Path) -> dict[str, dict[str, Any]]:
    """The result rows of an eval run (its directory or its results.jsonl) by question id. A torn last
    line of a run still in progress is skipped; the file is not modified."""
    path = run / RESULTS if run.is_dir() else run
    if not path.exists():
        raise CompareError(f"{path}: no such results file; pass an eval run directory (with {RESULTS})")
    rows: dict[str, dict[str, Any]] = {}
    try:
        numbered = read_jsonl_numbered(path)
    except JsonlError as exc:
        raise CompareError(f"{exc}: not a JSON result row") from None
    for number, row in numbered:
        if row["id"] in rows:
            raise CompareError(f"{path}:{number}: question id {row['id']!r} appears twice")
        rows[row["id"]] = row
    return rows


def bootstrap_interval(
    diff: np.ndarray, rounds: int = ROUNDS, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences."""
    if len(diff) == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (rounds, len(diff)))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def sign_flip_p_value(diff: np.ndarray, rounds: int = ROUNDS, seed: int = 0) -> float:
    """Two-sided p-value of "no difference": under the null each paired difference is as likely to have
    the opposite sign, so count the sign patterns whose |sum| reaches the observed one."""
    nonzero = diff[diff != 0]
    if len(nonzero) == 0:
        return 1.0
    observed = abs(nonzero.sum()) - 1e-12
    if len(nonzero) <= EXACT_SIGN_FLIP:
        signs = np.array(list(itertools.product((1, -1), repeat=len(nonzero))))
        return float(np.mean(np.abs(signs @ nonzero) >= observed))
    signs = np.random.default_rng(seed).choice((1, -1), size=(rounds, len(nonzero)))
    hits = int(np.sum(np.abs(signs @ nonzero) >= observed))
    return (hits + 1) / (rounds + 1)  # counts the observed pattern: a sampled p is never 0


def paired_diff(slice_name: str, metric: str, a: np.ndarray, b: np.ndarray, seed: int = 0) -> PairedDiff:
    diff = b - a
    low, high = bootstrap_interval(diff, seed=seed)
    return PairedDiff(
        slice=slice_name,
        metric=metric,
        n=len(diff),
        mean_a=float(a.mean()) if len(a) else 0.0,
        mean_b=float(b.mean()) if len(b) else 0.0,
        diff=float(diff.mean()) if len(diff) else 0.0,
        ci_low=low,
        ci_high=high,
        p_value=sign_flip_p_value(diff, seed=seed),
        b_better=int((diff > 0).sum()),
        a_better=int((diff < 0).sum()),
    )


SLICES: dict[str, Callable[[dict[str, Any]], str]] = {
    "group": lambda row: hop_group(row["dataset"]),
    "dataset": lambda row: row["dataset"],
    "form": lambda row: answer_form(row.get("question", ""), row.get("golden_answers", [])),
}


def compare_runs(
    run_a: Path, run_b: Path, metrics: tuple[str, ...] = ("em", "f1"), by: str = "group", seed: int = 0
) -> tuple[list[PairedDiff], dict[str, int]]:
    """Paired differences B − A per slice (`by`: "group" = single-/multi-hop, "dataset", "form" = two-way
    or open questions, see `answer_form`, or "none") and metric, plus how many questions only one run
    answered (they are left out of every slice)."""
    rows_a, rows_b = load_rows(run_a), load_rows(run_b)
    shared = sorted(rows_a.keys() & rows_b.keys())
    if not shared:
        raise CompareError(f"{run_a} and {run_b} share no question ids: were they run on the same questions?")
    for metric in metrics:
        if metric not in rows_a[shared[0]] or metric not in rows_b[shared[0]]:
            raise CompareError(f"metric {metric!r} is not in both runs' result rows")
    slices: dict[str, list[str]] = {"all": shared}
    if by != "none":
        key = SLICES.get(by)
        if key is None:
            raise CompareError(f"unknown slice {by!r}: use {', '.join(SLICES)} or none")
        for qid in shared:
            slices.setdefault(key(rows_a[qid]), []).append(qid)
    diffs = [
        paired_diff(
            name,
            metric,
            np.array([float(rows_a[q][metric]) for q in ids]),
            np.array([float(rows_b[q][metric]) for q in ids]),
            seed,
        )
        for name, ids in slices.items()
        for metric in metrics
    ]
    unpaired = {"only_a": len(rows_a.keys() - rows_b.keys()), "only_b": len(rows_b.keys() - rows_a.keys())}
    return diffs, unpaired


def report_json(diffs: list[PairedDiff], unpaired: dict[str, int]) -> dict[str, Any]:
    return {"diffs": [asdict(d) | {"significant": d.significant} for d in diffs], **unpaired}
