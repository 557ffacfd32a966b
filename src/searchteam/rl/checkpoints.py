"""Training checkpoints: `RUN/checkpoints/step-NNNNNN` folders, each written whole or not at all
(`paths.atomic_dir`), holding what a resumed run needs to continue exactly where the saved one was: the
trained weights (and exported adapters/model), optimizer, scheduler, RNG states (python, numpy, torch,
CUDA) and the step with its config."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from searchteam.files import atomic_dir
from searchteam.rl.config import CHECKPOINTS, TrainConfig
from searchteam.rl.policy import Policy

STATE = "trainer_state.json"


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step-{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary folders of interrupted saves are ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def checkpoint_due(step: int, config: TrainConfig) -> bool:
    """Whether the run saves after step `step` (1-based): every `save_every` steps, and at the last."""
    every = config.save_every
    return step == config.steps or (every > 0 and step % every == 0)


def save_checkpoint(
    folder: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    step: int,
    config: TrainConfig,
) -> None:
    """Write the checkpoint of `step` to `folder` in one rename (one already there is replaced)."""
    with atomic_dir(folder) as tmp:
        policy.save(tmp / "policy")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        state = {"step": step, "config": config.model_dump(mode="json")}
        (tmp / STATE).write_text(json.dumps(state, indent=2), encoding="utf-8")


def load_checkpoint(
    folder: Path,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> int:
    """Restore weights, optimizer, scheduler and RNG states from `folder`; returns its step."""
    state = json.loads((folder / STATE).read_text(encoding="utf-8"))
    policy.load(folder / "policy")
    on_cpu = {"map_location": "cpu"}  # not onto the device of the process that saved it
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, **on_cpu))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True, **on_cpu))
    set_rng_state(torch.load(folder / "rng.pt", weights_only=False, **on_cpu))
    return int(state["step"])


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints (`keep` ≤ 0: keep all)."""
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
