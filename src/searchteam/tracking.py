"""Experiment tracking through accelerate's trackers (`report_to`, accelerate's `log_with`).

`searchteam train` reports to TensorBoard under `RUN/tensorboard` when `report_to` is unset; eval, and a
`Trainer` built without a `TrackingSetup`, report only where `report_to` says. Nothing contacts a network
unless the run names a tracker that does (wandb, comet_ml, ...). A named tracker that is not installed is a
ConfigError; the training default is skipped with a warning when tensorboard is missing. The JSONL logs
stay the record of a run: trackers get the same numbers for plotting.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchteam.config import NO_TRACKER
from searchteam.errors import ConfigError
from searchteam.extras import install_hint

TENSORBOARD_DIR = "tensorboard"  # RUN_DIR/tensorboard holds the TensorBoard event files
# pip package of a tracker, where it differs from its name (TensorBoard comes with the [train] extra)
PIP_NAMES = {"comet_ml": "comet-ml", "tensorboard": "'searchteam[train]'"}


@dataclass
class TrackingSetup:
    """What a run reports and where: `report_to` (None: the command's default), the project name and the
    run's configuration (stored as hyperparameters)."""

    report_to: list[str] | None = None
    project: str = "searchteam"
    config: dict[str, Any] = field(default_factory=dict)


def trackers_for(report_to: list[str] | None, default: Sequence[str] = ()) -> list[str]:
    """The trackers a run uses: `report_to` as given (`[none]`: none), else `default`."""
    names = list(default) if report_to is None else report_to
    return [n for n in names if n != NO_TRACKER]


def is_installed(name: str) -> bool:
    """Whether accelerate can start tracker `name` here (its package is importable)."""
    from accelerate.utils import imports

    return bool(getattr(imports, f"is_{name}_available")())


def check_installed(names: Sequence[str]) -> None:
    """Refuse trackers whose package is missing (accelerate would silently drop them)."""
    missing = [n for n in names if not is_installed(n)]
    if missing:
        packages = " ".join(PIP_NAMES.get(n, n) for n in missing)
        raise ConfigError(
            f"report_to names {', '.join(missing)}, which is not installed: pip install {packages} "
            "(or leave it out of report_to)"
        )


def default_trackers() -> list[str]:
    """Training's default: TensorBoard when installed (else a warning)."""
    if not is_installed("tensorboard"):
        warnings.warn(
            f"tensorboard is not installed: no TensorBoard curves ({install_hint('train')}, or set "
            "report_to: none)",
            stacklevel=3,
        )
        return []
    return ["tensorboard"]


def log_with(names: Sequence[str], run_dir: Path) -> list[Any]:
    """accelerate's `log_with` entries: TensorBoard as a tracker writing to `run_dir/tensorboard`, the
    others by name (those that keep local files keep them under `run_dir`, the accelerator's project dir)."""
    from accelerate.tracking import TensorBoardTracker

    return [TensorBoardTracker(TENSORBOARD_DIR, run_dir) if n == "tensorboard" else n for n in names]


def start(accelerator, setup: TrackingSetup, run_name: str) -> None:
    """Start the accelerator's trackers, with the run's configuration as hyperparameters."""
    names = {"wandb": {"name": run_name}, "mlflow": {"run_name": run_name}}
    accelerator.init_trackers(setup.project, config=flat_config(setup.config), init_kwargs=names)


def finish(accelerator) -> None:
    """Close every started tracker: accelerate's `end_training` without tearing down the process group,
    which the caller may still be using."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers.clear()


def scalars(record: Mapping[str, Any], prefix: str = "", skip: Sequence[str] = ()) -> dict[str, float]:
    """The finite numbers of a (nested) record, keys joined by "/" under `prefix`: what trackers plot."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in skip:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= scalars(value, f"{name}/")
        elif isinstance(value, int | float) and math.isfinite(value):
            out[name] = float(value)
    return out


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A configuration as flat hyperparameters (TensorBoard takes only scalars and strings): nested keys
    joined by "/", lists as JSON, unset values left out."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= flat_config(value, f"{name}/")
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        elif value is not None:
            out[name] = json.dumps(value, default=str)
    return out


def report_once(setup: TrackingSetup, out: Path, values: Mapping[str, Any], step: int = 0) -> list[str]:
    """Log `values`' numbers once to the trackers `setup.report_to` names (eval's summary); returns them."""
    names = trackers_for(setup.report_to)
    if not names:
        return []
    check_installed(names)
    from accelerate import Accelerator

    accelerator = Accelerator(log_with=log_with(names, out), project_dir=out)
    start(accelerator, setup, out.name)
    try:
        accelerator.log(scalars(values), step=step)
    finally:
        finish(accelerator)
    return names
