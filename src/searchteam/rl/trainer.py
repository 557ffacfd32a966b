"""The RL loop on PyTorch + accelerate (runs as is under `accelerate launch`): rollout → reward → samples →
advantages → `ppo_epochs` passes of clipped-surrogate updates → log → checkpoint; optionally preceded by a
warm-start stage of rejection-sampling fine-tuning. The `Trainer` runs the loop and DAPO's re-sampling;
its parts each have a module: the update (`rl.update`), the advantage estimators (`rl.advantages`), the
warm start (`rl.warm_start`), checkpoints (`rl.checkpoints`), the run's log, trackers and rollout
traces (`rl.run_log`) and the processes (`rl.distributed`).

The trainer never imports a team: the caller supplies `rollout(step) -> episodes` (e.g. the runtime driving a
team with the policy's model) and `reward(episodes)`, which writes `turn.reward` (a per-method scheme)."""

from __future__ import annotations

import math
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

import searchteam.rl.warm_start.data as ws
from searchteam import tracking
from searchteam.rl.advantages import informative_mask
from searchteam.rl.checkpoints import (
    checkpoint_dir,
    checkpoint_due,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
)
from searchteam.rl.config import TrainConfig
from searchteam.rl.distributed import check_distributed, make_accelerator, slowest, sum_over_ranks, untracked
from searchteam.rl.experience import Render, Sample, samples_from_episodes
from searchteam.rl.policy import Policy
from searchteam.rl.run_log import RunLog, credit_stats, light, mismatch_stats, mismatch_sums, role_stats
from searchteam.rl.update import PolicyUpdater
from searchteam.rl.warm_start.loop import WarmStartLoop
from searchteam.types import FAILURE_KINDS, Episode

Rollout = Callable[..., list[Episode]]  # rollout(step) or rollout(step, attempt=k)
RewardFn = Callable[[list[Episode]], None]


def lr_multiplier(step: int, config: TrainConfig) -> float:
    """Learning-rate factor for training step `step` (0-based): linear warm-up over `warmup_steps`, then
    constant, linear or cosine decay to `min_lr_ratio` at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps))
    floor = config.min_lr_ratio
    if config.schedule == "linear":
        return 1.0 - (1.0 - floor) * progress
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer:
    """PPO / GRPO / GSPO trainer for one Policy. `train()` runs until `config.steps`; `resume()` first
    restores the newest (or a given) checkpoint so that the run continues exactly where it stopped.
    Construction seeds python, numpy and torch from `seed` (after the policy's LoRA init), which also
    orders the mini-batches.
    `tracking_setup` names the trackers (`report_to`, unset: TensorBoard; no setup: none), their
    project and the configuration they store for the accelerator the trainer makes (`make_accelerator`);
    a given `accelerator` logs to its own `log_with` trackers, started at the first record unless already.

    Under several processes every process rolls out its share of the questions, and the processes stay in
    lockstep: they agree on the number of micro-batches of every optimizer step (padding with zero-weight
    ones), normalize the loss by the counts of all processes (so that W processes compute the
    single-process loss on the union of their data), and log and save from the main process."""

    def __init__(
        self,
        policy: Policy,
        rollout: Rollout,
        reward: RewardFn,
        config: TrainConfig,
        run_dir: Path,
        *,
        render: Render | None = None,
        accelerator: Accelerator | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        warm_start: ws.WarmStart | None = None,
        tracking_setup: tracking.TrackingSetup | None = None,
        seed: int = 0,
    ) -> None:
        _check_policy(policy, config)
        _warn_half_precision_weights(policy)
        self.config = config
        self.rollout = rollout
        self.reward = reward
        self.render = render
        self.warm_start = warm_start
        self.run_dir = Path(run_dir)
        self.step = 0
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.tracking = tracking_setup or untracked(config)
        self.accelerator = accelerator or make_accelerator(config, self.run_dir, self.tracking)
        check_distributed(self.accelerator.distributed_type)
        self.log = RunLog(self.run_dir, self.accelerator, self.tracking, on_step)
        self.policy = policy
        groups = policy.param_groups(config.lr, config.role_lr, config.value_lr)
        optimizer = torch.optim.AdamW(
            groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        # the schedule wraps `optimizer.step` before accelerate captures it (its fp16 step swaps it back)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, config))
        self.model, self.optimizer = self.accelerator.prepare(policy, optimizer)
        self.updater = PolicyUpdater(policy, self.model, self.optimizer, self.accelerator, config, seed)
        self.policy.eval()

    # ---- the loop -------------------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        """Run the warm start's remaining rounds (if configured and RL has not begun), then the remaining
        steps up to `config.steps`; returns the RL steps' log records."""
        try:
            if self.warm_start is not None and self.step == 0:
                self.run_warm_start()
            records = []
            while self.step < self.config.steps:
                records.append(self.train_step())
        finally:
            self.finish_tracking()
        return records

    def train_step(self) -> dict[str, Any]:
        """One rollout batch and its policy update; writes the JSONL record and any due checkpoint. Counts,
        rewards and losses in the record cover every process's samples; times are the slowest process's."""
        record: dict[str, Any] = {"step": self.step + 1, "lr": self.scheduler.get_last_lr()[0]}
        if len(self.optimizer.param_groups) > 1:
            record.update({f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups})
        record["world_size"] = self.accelerator.num_processes
        episodes, samples, sampling = self._collect()
        collected = time.perf_counter()
        failed = [e.error_kind for e in episodes if e.error]  # a request the engine refused, a team bug, ...
        by_kind = [failed.count(kind) for kind in FAILURE_KINDS]
        num_episodes, num_samples, num_failed, *num_by_kind = sum_over_ranks(
            self.accelerator, len(episodes), len(samples), len(failed), *by_kind
        )
        record.update(episodes=int(num_episodes), failed_episodes=int(num_failed), samples=int(num_samples))
        kinds = zip(FAILURE_KINDS, num_by_kind, strict=True)
        record.update({f"failed_episodes/{kind}": int(n) for kind, n in kinds})
        record.update(sampling)
        if num_samples:
            record.update(self.updater.rl_update(samples, self.step))
        else:
            record.update({"skipped_updates": 0, "updates": 0})
        record.update(mismatch_stats(gather_object([mismatch_sums(samples)])))
        everyone = gather_object([light(s) for s in samples])
        record.update(role_stats([s for s in everyone if not s.sft]))
        if num_samples:
            record.update(credit_stats(everyone))
        with warnings.catch_warnings():  # the schedule advances per training step, even a skipped one
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.step += 1
        record["time/update"] = slowest({"t": time.perf_counter() - collected})["t"]
        self.log.step(record)
        if checkpoint_due(self.step, self.config):
            self.save_checkpoint()
        return record

    def _collect(self) -> tuple[list[Episode], list[Sample], dict[str, float]]:
        """Roll out and reward one step's episodes and turn them into samples. With DAPO dynamic sampling,
        groups whose trajectories all scored the same are dropped, and up to `resample_rounds` further
        rounds (`rollout(step, attempt=k)`, fresh questions) refill the batch until it holds as many
        informative groups as the first round had groups; informative groups beyond that are cut. Under
        several processes each process refills its own share, and all run a round while any needs one."""
        cfg = self.config
        episodes: list[Episode] = []
        stats = {"time/rollout": 0.0, "time/reward": 0.0}
        rounds = cfg.resample_rounds + 1 if cfg.dynamic_sampling else 1
        target = 0
        for attempt in range(rounds):
            t0 = time.perf_counter()
            new = self.rollout(self.step) if attempt == 0 else self.rollout(self.step, attempt=attempt)
            t1 = time.perf_counter()
            inner = getattr(self.rollout, "timings", {})  # parts the rollout timed itself: time/weight_sync
            for key, seconds in inner.items():
                stats[key] = stats.get(key, 0.0) + seconds
            self.reward(new)
            stats["time/rollout"] += t1 - t0 - sum(inner.values())
            stats["time/reward"] += time.perf_counter() - t1
            if cfg.save_rollouts:
                self.log.rollouts(new, self.step + 1, whole=cfg.save_rollout_prompts)
            episodes += new
            samples = samples_from_episodes(
                episodes,
                self.policy.tokenizer,
                self.render,
                roles=cfg.roles or None,
                merge_continuations=cfg.merge_continuations,
                sft_targets=cfg.sft_coef > 0,
            )
            if not cfg.dynamic_sampling:
                return episodes, samples, slowest(stats)
            keep = informative_mask(samples, cfg)
            groups = list(dict.fromkeys(s.group_id for s in samples if not s.sft))
            informative = list(dict.fromkeys(s.group_id for s, k in zip(samples, keep, strict=True) if k))
            target = target or len(groups)
            if sum_over_ranks(self.accelerator, len(informative) < target)[0] == 0:
                break
        chosen = set(informative[:target])
        kept = [s for s, k in zip(samples, keep, strict=True) if k and s.group_id in chosen]
        num_groups, num_informative, filtered = sum_over_ranks(
            self.accelerator, len(groups), len(informative), len(samples) - len(kept)
        )
        stats = slowest(stats) | {
            "filtered_samples": filtered,
            "informative_share": num_informative / num_groups if num_groups else 0.0,
            "sampling_rounds": float(attempt + 1),
        }
        return episodes, kept, stats

    # ---- warm start, checkpoints, log ---------------------------------------------------------------

    def run_warm_start(self) -> list[dict[str, Any]]:
        """The warm start's rounds after the last finished one (`WarmStartLoop`); returns their records."""
        assert self.warm_start is not None
        return WarmStartLoop(self.warm_start, self.updater, self.log, self.config, self.run_dir).run()

    @property
    def log_path(self) -> Path:
        return self.log.path

    def finish_tracking(self) -> None:
        """Close the trackers this trainer started (`train` does at its end); the next record reopens them."""
        self.log.finish()

    def save_checkpoint(self) -> Path:
        """Write `checkpoints/step-NNNNNN` atomically (`rl.checkpoints`) from the main process, and keep
        the newest `keep_checkpoints`."""
        final = checkpoint_dir(self.run_dir, self.step)
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            policy = self.accelerator.unwrap_model(self.model)
            save_checkpoint(final, policy, self.optimizer, self.scheduler, self.step, self.config)
            prune_checkpoints(self.run_dir, self.config.keep_checkpoints)
        self.accelerator.wait_for_everyone()
        return final

    def resume(self, checkpoint: Path | None = None) -> int:
        """Restore a checkpoint (default: the newest in this run) and return its step. The log of this run
        directory is cut back to that step, so a resumed run's log reads as one uninterrupted run. A run
        with no checkpoint yet (new, or killed before its first) resumes at step 0; one killed during its
        warm start continues it after its last finished round (from the round's saved samples when it had
        them)."""
        if checkpoint is None:
            found = list_checkpoints(self.run_dir)
            if not found:
                self.log.cut_back(0)  # RL steps logged before any checkpoint are run again
                return 0
            checkpoint = found[-1]
        policy = self.accelerator.unwrap_model(self.model)
        self.step = load_checkpoint(Path(checkpoint), policy, self.optimizer, self.scheduler)
        self.log.cut_back(self.step)
        return self.step


def _warn_half_precision_weights(policy: Policy) -> None:
    """Pure bf16/fp16 trained weights lose most AdamW updates to rounding (`model_setup.weight_dtype`)."""
    half = sorted({str(p.dtype) for p in policy.parameters() if p.requires_grad and p.dtype != torch.float32})
    if half:
        warnings.warn(
            f"trained weights are {', '.join(half)}: most small AdamW updates round away; load them in "
            "float32 (load_policy does) and set mixed_precision to compute in half precision",
            stacklevel=3,
        )


def _check_policy(policy: Policy, config: TrainConfig) -> None:
    """Fail before the first rollout when the policy lacks what the config asks for."""
    if config.uses_critic and policy.value_head is None:
        raise ValueError(
            "estimator 'gae' needs a critic: build the policy with value_head=True (build_policy does)"
        )
    if config.kl_coef > 0 and policy.mode == "full" and policy.ref_model is None:
        raise ValueError(
            "kl_coef > 0 with full fine-tuning needs a frozen reference: Policy(..., reference=True)"
        )
    if config.lora_per_role and policy.mode != "role_lora":
        raise ValueError(
            "lora_per_role is set but the policy has one shared model; build it with build_policy"
        )
