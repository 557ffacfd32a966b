"""The trainer's processes: the accelerator a run creates first, and the collectives that keep several
processes in lockstep (summed counts, slowest timings, whitening over every process's advantages). With one
process each collective returns its own values."""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import (
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
    gather_object,
)

from searchteam import tracking
from searchteam.errors import ConfigError
from searchteam.rl.advantages import by_estimator, whiten_samples, whitens
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Sample
from searchteam.rl.run_log import run_trackers

SUPPORTED_DISTRIBUTED = (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU)


def check_distributed(kind: DistributedType) -> None:
    """Refuse the distributed modes the trainer does not run correctly (FSDP and DeepSpeed shard or step
    the model in ways its rollouts, reference logprobs and saving do not follow)."""
    if kind not in SUPPORTED_DISTRIBUTED:
        raise ConfigError(
            f"distributed mode {kind.value} is not supported: searchteam trains data-parallel (DDP), one "
            "process per GPU or CPU; launch with `searchteam train --num-processes N` or "
            "`accelerate launch --multi_gpu` without FSDP/DeepSpeed"
        )


def untracked(config: TrainConfig) -> tracking.TrackingSetup:
    """No trackers, with the trainer's config as the run's: a trainer built in code without a setup."""
    return tracking.TrackingSetup([tracking.NO_TRACKER], config={"train": config.model_dump(mode="json")})


def make_accelerator(
    config: TrainConfig,
    run_dir: Path,
    setup: tracking.TrackingSetup | None = None,
    device: str | None = None,
) -> Accelerator:
    """The accelerator of a training run, created before any model so that every process joins the
    process group (gloo on the CPU, NCCL on GPUs) with the run's timeout. DDP broadcasts no buffers in the
    forward pass (they are constants: rotary frequencies) and tolerates parameters a micro-batch leaves
    unused: other roles' adapters, a critic idle on SFT turns or turns no GAE estimates."""
    setup = setup or untracked(config)
    unused = config.lora_per_role or config.uses_critic
    accelerator = Accelerator(
        cpu=device == "cpu" or not torch.cuda.is_available(),
        mixed_precision=config.mixed_precision,
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=unused, broadcast_buffers=False),
            InitProcessGroupKwargs(timeout=timedelta(seconds=config.dist_timeout_s)),
        ],
        log_with=tracking.log_with(run_trackers(setup), run_dir) or None,
        project_dir=run_dir,
    )
    check_distributed(accelerator.distributed_type)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched:
        raise ConfigError(
            f"{launched} processes were launched but accelerate sees {accelerator.num_processes}: its state "
            "was set up before the trainer's (a PartialState() or Accelerator() created earlier without "
            "cpu=True on a CPU machine); create the training accelerator first"
        )
    return accelerator


def sum_over_ranks(accelerator: Accelerator, *values: float) -> list[float]:
    """The sums of `values` over all processes (one all-reduce; the values themselves in one process)."""
    if accelerator.num_processes == 1:
        return [float(v) for v in values]
    local = torch.tensor([float(v) for v in values], dtype=torch.float64, device=accelerator.device)
    return accelerator.reduce(local, reduction="sum").tolist()


def slowest(seconds: dict[str, float]) -> dict[str, float]:
    """Per key, the largest of the processes' values (timings: a step waits for its slowest process)."""
    merged: dict[str, float] = {}
    for part in gather_object([seconds]):
        for key, value in part.items():
            merged[key] = max(merged.get(key, value), value)
    return merged


def mean_over_ranks(values: dict[str, list[float]]) -> dict[str, float]:
    """Per key, the mean of every process's values."""
    merged: dict[str, list[float]] = defaultdict(list)
    for part in gather_object([dict(values)]):
        for key, vals in part.items():
            merged[key] += vals
    return {key: float(np.mean(vals)) for key, vals in merged.items()}


def whiten_over_ranks(accelerator: Accelerator, samples: list[Sample], config: TrainConfig) -> None:
    """`whiten_advantages`, with the mean and deviation of every process's samples."""
    estimators = [config.estimator_of(r) for r in [*config.role_estimators, ""]]
    if not any(whitens(e) for e in estimators):
        return
    parts = {est: part for est, part in by_estimator(samples, config).items() if whitens(est)}
    everyone = gather_object([{est: [s.advantage for s in part] for est, part in parts.items()}])
    rank = accelerator.process_index
    for est, part in parts.items():
        lists = [d.get(est, []) for d in everyone]
        population = [a for advantages in lists for a in advantages]
        whiten_samples(part, population, offset=sum(len(a) for a in lists[:rank]))
