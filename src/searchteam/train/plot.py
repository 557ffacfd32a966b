"""Training curves from a run's JSONL log, drawn with matplotlib's file-only Agg backend."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from searchteam.extras import has, install_hint, require
from searchteam.rl.config import LOG_NAME, WARM_START

PLOT_EXTRA, PLOT_WHAT = "train", "plotting training curves"

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("reward/",)),
    ("format error rate", ("format_error_rate/",)),
    ("response length (tokens)", ("response_length/",)),
    ("KL", ("kl_ref", "approx_kl")),
    ("clip fraction", ("clip_frac",)),
    ("value loss", ("value_loss",)),
    ("grad norm", ("grad_norm",)),
    ("seconds per step", ("time/",)),
)
WARM_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sampled episodes: answer F1, share kept", ("f1/sampled", "kept_share")),
    ("format error rate", ("format_error_rate/",)),
    ("response length (characters)", ("response_chars/",)),
    ("likelihood loss (mean token NLL)", ("sft_loss",)),
    ("seconds per round", ("time/",)),
)
SMOOTHED = "reward/mean"  # step rewards swing with the questions drawn; its trailing average shows the trend
SMOOTH_WINDOW = 8


def read_log(run_dir: Path, name: str = LOG_NAME) -> list[dict]:
    path = Path(run_dir) / name
    if not path.exists():
        raise FileNotFoundError(f"no training log at {path}; train first (it is written after each step)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _series(records: list[dict], key: str, x: str = "step") -> tuple[list[int], list[float]]:
    points = [(r[x], r[key]) for r in records if isinstance(r.get(key), int | float)]
    return [p[0] for p in points], [float(p[1]) for p in points]


def trailing_mean(values: list[float], window: int) -> list[float]:
    """Mean of each value and up to `window - 1` values before it."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i + 1 - max(0, i - window + 1))
        for i in range(len(values))
    ]


def _matching(records: list[dict], prefixes: tuple[str, ...]) -> list[str]:
    keys = sorted({k for r in records for k in r})
    return [k for k in keys if any(k == p or (p.endswith("/") and k.startswith(p)) for p in prefixes)]


def pyplot() -> ModuleType:
    """matplotlib's pyplot on the file-only Agg backend; matplotlib is in the [train] extra."""
    require("matplotlib", PLOT_EXTRA, PLOT_WHAT).use("Agg")
    return require("matplotlib.pyplot", PLOT_EXTRA, PLOT_WHAT)


def curves_after_training(run_dir: Path) -> str:
    """What `searchteam train` reports when it ends: the curves' path, or, without matplotlib, how to get
    them later (the finished run is not failed for want of a plot)."""
    if not has("matplotlib"):
        return f"none: {install_hint(PLOT_EXTRA)}, then searchteam plot {run_dir}"
    return str(plot_run(run_dir))


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write `plots/training_curves.png` (or `out`): one panel per metric family present in the log, with
    one line per role or component; with a warm start, also `plots/warm_start_curves.png` (per round).
    Returns the RL curves' path, or the warm start's when no RL step has run (`steps: 0`)."""
    run_dir = Path(run_dir)
    plots = run_dir / "plots"
    if (run_dir / WARM_START / "log.jsonl").exists():
        warm = read_log(run_dir / WARM_START, "log.jsonl")
        warm_curves = _plot(warm, WARM_PANELS, "round", plots / "warm_start_curves.png", run_dir)
        if not (run_dir / LOG_NAME).exists():
            return warm_curves
    return _plot(
        read_log(run_dir), PANELS, "step", Path(out) if out else plots / "training_curves.png", run_dir
    )


def _plot(
    records: list[dict],
    families: tuple[tuple[str, tuple[str, ...]], ...],
    x: str,
    target: Path,
    run_dir: Path,
) -> Path:
    panels = [(title, keys) for title, prefixes in families if (keys := _matching(records, prefixes))]
    if not panels:
        raise ValueError(f"the training log in {run_dir} has no metrics to plot")
    plt = pyplot()
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3 * rows), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels, strict=False):
        for key in keys:
            steps, values = _series(records, key, x)
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=key.split("/")[-1])
            if key == SMOOTHED and len(values) > SMOOTH_WINDOW:
                label = f"mean, {SMOOTH_WINDOW}-step trailing average"
                ax.plot(steps, trailing_mean(values, SMOOTH_WINDOW), "k--", linewidth=2, label=label)
        ax.set_title(title)
        ax.set_xlabel(x)
        if len(ax.get_lines()) > 1:
            ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
