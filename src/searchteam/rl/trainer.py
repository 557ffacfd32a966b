"""The RL loop on PyTorch + accelerate (runs as is under `accelerate launch`): rollout → reward → samples →
advantages → `ppo_epochs` passes of clipped-surrogate updates → log → checkpoint; optionally preceded by a
warm-start stage of rejection-sampling fine-tuning (`run_warm_start`). Every log record goes to the run's
JSONL log and to accelerate's trackers (`searchteam.tracking`: TensorBoard by default).

The trainer never imports a team: the caller supplies `rollout(step) -> episodes` (e.g. the runtime driving a
team with the policy's model) and `reward(episodes)`, which writes `turn.reward` (a per-method scheme)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
import warnings
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from searchteam.config import ConfigError
from searchteam.progress import progress_bar
from searchteam.rl import warm_start as ws
from searchteam.rl.advantages import gae, group_normalize, informative_groups, whiten
from searchteam.rl.config import CHECKPOINTS, LOG_NAME, ROLLOUTS_NAME, WARM_START, RoleEstimator, TrainConfig
from searchteam.rl.experience import Batch, Render, Sample, collate, samples_from_episodes
from searchteam.rl.losses import policy_loss, sft_loss, value_loss
from searchteam.rl.policy import Policy
from searchteam.types import Episode

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


def assign_advantages(samples: list[Sample], config: TrainConfig, whitening: bool = True) -> None:
    """Fill `advantage` (and `returns`) on every RL sample with its role's estimator (`estimator`, or the
    role's entry in `role_estimators`); SFT samples carry no advantage. Roles that share an estimator are
    estimated together: GAE runs over each episode's turns of those roles in order. `whitening=False`
    leaves GAE's `whiten_advantages` to the caller (the trainer whitens over every process's samples)."""
    for est, part in by_estimator(samples, config).items():
        if est.estimator == "gae":
            _assign_gae(part, est.gamma, est.lam)
            if est.whiten_advantages and whitening:
                whiten_samples(part, [s.advantage for s in part])
        else:
            _assign_group(part, est.estimator == "role_grpo", config.adv_eps, bool(est.adv_scale_by_std))


def by_estimator(samples: list[Sample], config: TrainConfig) -> dict[RoleEstimator, list[Sample]]:
    """The RL samples grouped by the estimator (and options) of their role."""
    groups: dict[RoleEstimator, list[Sample]] = defaultdict(list)
    for s in samples:
        if not s.sft:
            groups[config.estimator_of(s.role)].append(s)
    return groups


def whiten_samples(part: list[Sample], population: list[float], offset: int = 0) -> None:
    """Set the advantages of `part` to their whitened values, the statistics taken over `population`
    (the advantages of `part` start at `offset` in it)."""
    whitened = whiten(torch.tensor(population, dtype=torch.float64))[offset : offset + len(part)]
    for s, a in zip(part, whitened.tolist(), strict=True):
        s.advantage = a


def _assign_gae(samples: list[Sample], gamma: float, lam: float) -> None:
    by_episode: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_episode[s.episode_id].append(s)
    for turns in by_episode.values():
        turns.sort(key=lambda s: s.turn_index)
        rewards = torch.tensor([s.reward for s in turns], dtype=torch.float64)
        values = torch.tensor([s.old_value for s in turns], dtype=torch.float64)
        adv, ret = gae(rewards, values, gamma, lam)
        for s, a, r in zip(turns, adv.tolist(), ret.tolist(), strict=True):
            s.advantage, s.returns = a, r


def trajectory_key(sample: Sample, by_role: bool) -> tuple:
    """The unit a group estimator scores: one trajectory (episode), per role for role_grpo, and per
    sub-group (`Sample.subgroup`, e.g. DAC's hard-positive inputs) within it."""
    return (sample.episode_id, sample.role if by_role else "", sample.subgroup)


def group_of(sample: Sample, by_role: bool) -> tuple:
    """The group a trajectory is compared within: the question, per role for role_grpo, per sub-group."""
    return (sample.group_id, sample.role if by_role else "", sample.subgroup)


def trajectories(samples: list[Sample], by_role: bool) -> list[list[Sample]]:
    """Samples bucketed by trajectory (see `trajectory_key`), in first-seen order."""
    units: dict[tuple, list[Sample]] = defaultdict(list)
    for s in samples:
        units[trajectory_key(s, by_role)].append(s)
    return list(units.values())


def trajectory_reward(members: list[Sample]) -> float:
    """R_i of a group estimator: the mean reward of the trajectory's samples."""
    return float(np.mean([s.reward for s in members]))


def _assign_group(samples: list[Sample], by_role: bool, eps: float, scale: bool) -> None:
    """GRPO over trajectories (QAgent Eq. 1; DECOR Eq. 6 with `by_role`): each trajectory of a group gets
    one reward R_i, the mean reward of its samples (the outcome itself when the scheme repeats it on every
    turn), Â_i = (R_i − μ_g) / (σ_g + ε) over the G trajectories of its group, broadcast to its turns. A
    trajectory with many turns thus counts once, as in the papers, not once per turn."""
    members = trajectories(samples, by_role)
    rewards = torch.tensor([trajectory_reward(m) for m in members], dtype=torch.float64)
    adv = group_normalize(rewards, [group_of(m[0], by_role) for m in members], eps, scale)
    for m, a, r in zip(members, adv.tolist(), rewards.tolist(), strict=True):
        for s in m:
            s.advantage, s.returns = a, r


def informative_mask(samples: list[Sample], config: TrainConfig) -> list[bool]:
    """DAPO dynamic sampling at the trajectory level: False for the samples of a group whose trajectory
    rewards are all equal (zero advantage). GAE-estimated and SFT samples are always kept."""
    dropped: set[int] = set()
    for by_role, kind in ((False, "grpo"), (True, "role_grpo")):
        picked = [s for s in samples if not s.sft and config.estimator_of(s.role).estimator == kind]
        members = trajectories(picked, by_role)
        rewards = [trajectory_reward(m) for m in members]
        varied = informative_groups(rewards, [group_of(m[0], by_role) for m in members])
        dropped |= {id(s) for m, v in zip(members, varied, strict=True) if not v for s in m}
    return [id(s) not in dropped for s in samples]


def role_stats(samples: list[Sample]) -> dict[str, float]:
    """Per-role reward mean, format-error rate and response length (tokens) for the log."""
    out: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    for role, group in sorted(by_role.items()):
        out[f"reward/{role}"] = float(np.mean([s.reward for s in group]))
        out[f"format_error_rate/{role}"] = float(np.mean([not s.parsed_ok for s in group]))
        out[f"response_length/{role}"] = float(np.mean([len(s.completion_ids) for s in group]))
        out[f"samples/{role}"] = float(len(group))
    if samples:
        out["reward/mean"] = float(np.mean([s.reward for s in samples]))
    return out


def credit_stats(samples: list[Sample]) -> dict[str, float]:
    """Per-role mean return (the critic's target, or the trajectory reward of a group estimator) and mean
    |advantage| after `assign_advantages`, to read the credit each role received from the log."""
    out: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if not s.sft:
            by_role[s.role].append(s)
    for role, group in sorted(by_role.items()):
        out[f"return/{role}"] = float(np.mean([s.returns for s in group]))
        out[f"abs_advantage/{role}"] = float(np.mean([abs(s.advantage) for s in group]))
    return out


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


def run_trackers(setup: tracking.TrackingSetup, config: TrainConfig) -> list[str]:
    """The trackers a run starts: `report_to`, else TensorBoard when `config.tensorboard`."""
    if setup.report_to is None:
        return tracking.default_trackers(config.tensorboard)
    names = tracking.trackers_for(setup.report_to)
    tracking.check_installed(names)
    return names


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
    setup = setup or tracking.TrackingSetup(config={"train": config.model_dump(mode="json")})
    unused = config.lora_per_role or config.uses_critic
    accelerator = Accelerator(
        cpu=device == "cpu" or not torch.cuda.is_available(),
        mixed_precision=config.mixed_precision,
        kwargs_handlers=[
            DistributedDataParallelKwargs(find_unused_parameters=unused, broadcast_buffers=False),
            InitProcessGroupKwargs(timeout=timedelta(seconds=config.dist_timeout_s)),
        ],
        log_with=tracking.log_with(run_trackers(setup, config), run_dir) or None,
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


class Trainer:
    """PPO / GRPO / GSPO trainer for one Policy. `train()` runs until `config.steps`; `resume()` first
    restores the newest (or a given) checkpoint so that the run continues exactly where it stopped.
    Construction seeds python, numpy and torch from `config.seed` (after the policy's LoRA init).
    `tracking_setup` names the trackers (`report_to`; default: TensorBoard when `config.tensorboard`), their
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
    ) -> None:
        _check_policy(policy, config)
        _warn_half_precision_weights(policy)
        self.config = config
        self.rollout = rollout
        self.reward = reward
        self.render = render
        self.on_step = on_step
        self.warm_start = warm_start
        self.run_dir = Path(run_dir)
        self.step = 0
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        own_config = {"train": config.model_dump(mode="json")}
        self.tracking = tracking_setup or tracking.TrackingSetup(config=own_config)
        self.accelerator = accelerator or make_accelerator(config, self.run_dir, self.tracking)
        check_distributed(self.accelerator.distributed_type)
        self._own_trackers = bool(self.accelerator.log_with) and not self.accelerator.trackers
        self._tracking = False
        self.policy = policy
        groups = policy.param_groups(config.lr, config.role_lr, config.value_lr)
        optimizer = torch.optim.AdamW(
            groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        # the schedule wraps `optimizer.step` before accelerate captures it (its fp16 step swaps it back)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_multiplier(s, config))
        self.model, self.optimizer = self.accelerator.prepare(policy, optimizer)
        self.pad_id = policy.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = policy.tokenizer.eos_token_id
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
        num_episodes, num_samples = self._sum_over_ranks(len(episodes), len(samples))
        record.update(episodes=int(num_episodes), samples=int(num_samples), **sampling)
        record.update(self._update(samples) if num_samples else {"skipped_updates": 0, "updates": 0})
        everyone = gather_object([_light(s) for s in samples])
        record.update(role_stats([s for s in everyone if not s.sft]))
        if num_samples:
            record.update(credit_stats(everyone))
        with warnings.catch_warnings():  # the schedule advances per training step, even a skipped one
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.step += 1
        record["time/update"] = self._slowest({"t": time.perf_counter() - collected})["t"]
        self._log(record)
        if self._checkpoint_due():
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
                self._save_rollouts(new)
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
                return episodes, samples, self._slowest(stats)
            keep = informative_mask(samples, cfg)
            groups = list(dict.fromkeys(s.group_id for s in samples if not s.sft))
            informative = list(dict.fromkeys(s.group_id for s, k in zip(samples, keep, strict=True) if k))
            target = target or len(groups)
            if self._sum_over_ranks(len(informative) < target)[0] == 0:
                break
        chosen = set(informative[:target])
        kept = [s for s, k in zip(samples, keep, strict=True) if k and s.group_id in chosen]
        num_groups, num_informative, filtered = self._sum_over_ranks(
            len(groups), len(informative), len(samples) - len(kept)
        )
        stats = self._slowest(stats) | {
            "filtered_samples": filtered,
            "informative_share": num_informative / num_groups if num_groups else 0.0,
            "sampling_rounds": float(attempt + 1),
        }
        return episodes, kept, stats

    # ---- processes in lockstep ----------------------------------------------------------------------

    def _sum_over_ranks(self, *values: float) -> list[float]:
        """The sums of `values` over all processes (one all-reduce; the values themselves in one process)."""
        if self.accelerator.num_processes == 1:
            return [float(v) for v in values]
        local = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(local, reduction="sum").tolist()

    def _slowest(self, seconds: dict[str, float]) -> dict[str, float]:
        """Per key, the largest of the processes' values (timings: a step waits for its slowest process)."""
        merged: dict[str, float] = {}
        for part in gather_object([seconds]):
            for key, value in part.items():
                merged[key] = max(merged.get(key, value), value)
        return merged

    def _mean_over_ranks(self, values: dict[str, list[float]]) -> dict[str, float]:
        """Per key, the mean of every process's values."""
        merged: dict[str, list[float]] = defaultdict(list)
        for part in gather_object([dict(values)]):
            for key, vals in part.items():
                merged[key] += vals
        return {key: float(np.mean(vals)) for key, vals in merged.items()}

    def _in_lockstep(self, chunks: list[list[Sample]], accum: int) -> list[list[list[Sample] | None]]:
        """Optimizer steps of `accum` micro-batches, as many steps of as many micro-batches on every
        process: every DDP backward is a collective that each process must join, so a process with fewer
        micro-batches than the longest pads with zero-weight ones (None)."""
        longest = len(chunks)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.gather(torch.tensor([len(chunks)], device=self.accelerator.device))
            longest = int(counts.max())
        padded: list[list[Sample] | None] = [*chunks, *[None] * (longest - len(chunks))]
        return [padded[i : i + accum] for i in range(0, longest, accum)]

    def _padding_loss(self) -> torch.Tensor:
        """The loss of a zero-weight micro-batch: one pad token through the model, times zero."""
        filler = Sample([self.pad_id], [self.pad_id], [0], role="", episode_id=-1, group_id="", turn_index=0)
        batch = collate([filler], self.pad_id).to(self.accelerator.device)
        logprobs, values, _ = self.model(
            batch.input_ids, batch.attention_mask, batch.target_index, batch.value_index
        )
        loss = logprobs.sum() * 0.0
        return loss if values is None else loss + values.sum() * 0.0

    def _whiten_over_ranks(self, samples: list[Sample]) -> None:
        """GAE's `whiten_advantages`, with the mean and deviation of every process's samples."""
        estimators = [self.config.estimator_of(r) for r in [*self.config.role_estimators, ""]]
        if not any(e.estimator == "gae" and e.whiten_advantages for e in estimators):
            return
        parts = {
            est: part
            for est, part in by_estimator(samples, self.config).items()
            if est.estimator == "gae" and est.whiten_advantages
        }
        everyone = gather_object([{est: [s.advantage for s in part] for est, part in parts.items()}])
        rank = self.accelerator.process_index
        for est, part in parts.items():
            lists = [d.get(est, []) for d in everyone]
            population = [a for advantages in lists for a in advantages]
            whiten_samples(part, population, offset=sum(len(a) for a in lists[:rank]))

    # ---- update -------------------------------------------------------------------------------------

    def _micro_batches(
        self, samples: list[Sample], generator: torch.Generator | None, size: int | None = None
    ) -> list[list[Sample]]:
        """Chunks of `size` (default `micro_batch_size`), shuffled when a generator is given; each chunk
        holds one kind of sample (RL or SFT) and, with per-role LoRA, one role."""
        order = list(range(len(samples)))
        if generator is not None:
            order = torch.randperm(len(samples), generator=generator).tolist()
        per_role = self.policy.mode == "role_lora"
        pools: dict[tuple[str, bool], list[int]] = defaultdict(list)
        for i in order:
            pools[(samples[i].role if per_role else "", samples[i].sft)].append(i)
        size = size or self.config.micro_batch_size
        chunks = [
            [samples[i] for i in pool[j : j + size]]
            for _, pool in sorted(pools.items())
            for j in range(0, len(pool), size)
        ]
        if generator is not None and len(pools) > 1:
            chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=generator).tolist()]
        return chunks

    @torch.no_grad()
    def _score(self, samples: list[Sample]) -> None:
        """Old logprobs (π_θold), reference logprobs (when penalized) and critic values, before updating.
        Scored by the policy itself, not its DDP wrapper: no collective, so processes need not agree on
        how many micro-batches they score."""
        self.policy.eval()
        need_old = self.config.old_logprobs == "recompute" or any(s.old_logprobs is None for s in samples)
        if not need_old and self.config.kl_coef == 0 and self.policy.value_head is None:
            return
        for chunk in self._micro_batches(samples, None):
            self.policy.activate(chunk[0].role)
            batch = collate(chunk, self.pad_id).to(self.accelerator.device)
            with self.accelerator.autocast():  # as the prepared model computes in training
                logprobs, values, _ = self.policy(
                    batch.input_ids, batch.attention_mask, batch.target_index, batch.value_index
                )
                ref = self.policy.reference_logprobs(batch) if self.config.kl_coef > 0 else None
            for i, s in enumerate(chunk):
                n = len(s.completion_ids)
                if need_old:
                    s.old_logprobs = logprobs[i, :n].float().cpu().tolist()
                if ref is not None:
                    s.ref_logprobs = ref[i, :n].float().cpu().tolist()
                if values is not None:
                    s.old_value = float(values[i])

    def _update(self, samples: list[Sample]) -> dict[str, float]:
        self._score(samples)
        assign_advantages(samples, self.config, whitening=False)
        self._whiten_over_ranks(samples)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        self.policy.train()
        for epoch in range(self.config.ppo_epochs):
            generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step * 1009 + epoch)
            chunks = self._micro_batches(samples, generator)
            for minibatch in self._in_lockstep(chunks, self.config.grad_accum):
                ok, step_stats = self._optimizer_step(minibatch)
                updates += 1
                skipped += not ok
                for k, v in step_stats.items():
                    stats[k].append(v)
        self.policy.eval()
        return self._mean_over_ranks(stats) | {"updates": updates, "skipped_updates": skipped}

    def _optimizer_step(
        self, chunks: list[list[Sample] | None], optimizer=None, sft_coef: float | None = None
    ) -> tuple[bool, dict[str, float]]:
        """Accumulate gradients over micro-batches (None: a zero-weight padding one), normalized by the whole
        mini-batch's token and sequence counts over all processes, then clip and step — unless any loss or
        the gradient norm is not finite, in which case the gradients are dropped and the weights and
        optimizer state stay untouched (see `_step_if_finite`). Also measures the policy's token entropy on
        the trained tokens, per role. `optimizer` and `sft_coef` default to the RL run's (the warm start
        passes its own)."""
        cfg = self.config
        optimizer = optimizer or self.optimizer
        sft_coef = cfg.sft_coef if sft_coef is None else sft_coef
        entropy_mode = "grad" if cfg.entropy_coef > 0 else "detached"
        entropy_sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        real = [s for c in chunks if c for s in c]
        counts = self._sum_over_ranks(
            sum(s.num_trained_tokens for s in real if not s.sft),
            sum(not s.sft for s in real),
            sum(s.num_trained_tokens for s in real if s.sft),
            sum(not s.sft and cfg.estimator_of(s.role).estimator == "gae" for s in real),
        )
        # DDP averages the processes' gradients: normalized by 1/W of the totals, that average is the
        # gradient of the single-process loss over the union of all processes' micro-batches
        num_tokens, num_seqs, num_sft_tokens, num_critic = (
            c / self.accelerator.num_processes for c in counts
        )
        stats: dict[str, list[float]] = defaultdict(list)
        finite = True
        for i, chunk in enumerate(chunks):
            sync = self.accelerator.no_sync(self.model) if i < len(chunks) - 1 else nullcontext()
            with sync:
                if chunk is None:
                    self.accelerator.backward(self._padding_loss())
                    continue
                self.policy.activate(chunk[0].role)
                batch = collate(chunk, self.pad_id).to(self.accelerator.device)
                sft = chunk[0].sft  # a micro-batch is all SFT or all RL samples (`_micro_batches`)
                logprobs, values, entropy = self.model(
                    batch.input_ids,
                    batch.attention_mask,
                    batch.target_index,
                    batch.value_index,
                    entropy="none" if sft else entropy_mode,
                    critic=not sft,
                )
                if sft:
                    out = sft_loss(logprobs, batch.loss_mask, sft_coef, num_sft_tokens)
                    finite = finite and bool(torch.isfinite(out.loss))
                    self.accelerator.backward(out.loss)
                    for k, v in out.stats.items():
                        stats[k].append(v)
                    continue
                loss, out_stats = self._rl_loss(
                    batch, chunk, logprobs, values, entropy, num_tokens, num_seqs, num_critic
                )
                finite = finite and bool(torch.isfinite(loss))
                self.accelerator.backward(loss)
            for k, v in out_stats.items():
                stats[k].append(v)
            _add_entropy(entropy_sums, batch.roles, entropy, batch.loss_mask)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        grad_norm = self.accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
        ok = self._step_if_finite(finite, grad_norm, optimizer)
        optimizer.zero_grad(set_to_none=True)
        summary = {k: float(np.mean(v)) for k, v in stats.items()}
        summary.update(_entropy_means(entropy_sums))
        summary["grad_norm"] = float(grad_norm)
        return ok, summary

    def _rl_loss(
        self,
        batch: Batch,
        chunk: list[Sample],
        logprobs: torch.Tensor,
        values: torch.Tensor | None,
        entropy: torch.Tensor | None,
        num_tokens: float,
        num_seqs: float,
        num_critic: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy loss of an RL micro-batch plus, for the turns GAE estimates, the critic's."""
        cfg = self.config
        out = policy_loss(
            logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.loss_mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            level=cfg.ratio_level,
            agg=cfg.loss_agg,
            ref_logprobs=batch.ref_logprobs,
            kl_coef=cfg.kl_coef,
            kl_estimator=cfg.kl_estimator,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            entropy=entropy,
            entropy_coef=cfg.entropy_coef,
        )
        loss = out.loss
        rows = [i for i, s in enumerate(chunk) if cfg.estimator_of(s.role).estimator == "gae"]
        if values is not None and rows:  # the critic learns only the turns GAE estimates
            idx = torch.tensor(rows, device=values.device)
            vout = value_loss(
                values[idx], batch.old_values[idx], batch.returns[idx], cfg.value_clip, num_critic
            )
            loss = loss + cfg.value_coef * vout.loss
            out.stats.update(vout.stats)
        out.stats["loss"] = loss.item()
        return loss, out.stats

    def _step_if_finite(self, finite: bool, grad_norm: torch.Tensor | float, optimizer) -> bool:
        """Apply the accumulated gradients unless a loss (on any process) or the gradient norm is not finite;
        returns whether the step was taken. With fp16's grad scaler the scaler decides: its `step` skips on
        inf/NaN gradients (which a non-finite loss also produces) and its `update` lowers the scale, and
        that update must follow every `unscale_`, so the optimizer step is always called there."""
        if self.accelerator.scaler is not None:
            optimizer.step()
            return not self.accelerator.optimizer_step_was_skipped
        bad = torch.tensor(0.0 if finite else 1.0, device=self.accelerator.device)
        bad = self.accelerator.reduce(bad, reduction="sum")
        ok = bool(bad.item() == 0) and bool(torch.isfinite(torch.as_tensor(grad_norm)))
        if ok:
            optimizer.step()
        return ok

    # ---- warm start ---------------------------------------------------------------------------------

    def run_warm_start(self) -> list[dict[str, Any]]:
        """Rejection-sampling fine-tuning (expert iteration) before RL. Each round collects episodes, keeps
        the correct ones whose turns parsed (`warm_start.keep`) and fine-tunes the policy by likelihood on
        every policy turn kept so far, with an AdamW of its own (RL then starts from fresh optimizer state).
        All processes gather every process's episodes and train on the same data. A finished round is saved
        to `warm_start/round-NN` (policy and adapters), so a killed stage resumes at the next round. Returns
        the rounds' log records, which also go to `warm_start/log.jsonl`."""
        assert self.warm_start is not None
        cfg, roles = self.warm_start.config, self.config.roles or None
        done = ws.finished_rounds(self.run_dir)
        if done:
            policy = self.accelerator.unwrap_model(self.model)  # the critic is not the warm start's to set
            policy.load(ws.round_dir(self.run_dir, done) / "policy", policy_only=True)
        if self.accelerator.is_main_process:  # what an unfinished round wrote goes, torn lines too
            for name in (ws.KEPT, ws.LOG):
                truncate_jsonl(ws.warm_dir(self.run_dir) / name, "round", done)
        self.accelerator.wait_for_everyone()
        dataset = ws.read_kept(self.run_dir)
        groups = [g for g in self.policy.param_groups(cfg.lr) if g["name"] != "value"]
        optimizer = self.accelerator.prepare(torch.optim.AdamW(groups, lr=cfg.lr, betas=self.config.betas))
        records = []
        for round_index in range(done + 1, cfg.rounds + 1):
            start = time.perf_counter()
            episodes, scores = self._warm_start_collection(round_index)
            kept = [ws.keep(e, score, cfg, roles) for e, score in zip(episodes, scores, strict=True)]
            new = [e for e, k in zip(episodes, kept, strict=True) if k]
            collected = time.perf_counter()
            record = {"round": round_index, **ws.round_stats(episodes, scores, kept, roles)}
            dataset += new
            record |= self._fine_tune(dataset, optimizer, round_index)
            record |= {"time/rollout": collected - start, "time/update": time.perf_counter() - collected}
            self._finish_round(round_index, new, record)
            records.append(record)
        return records

    def _warm_start_collection(self, round_index: int) -> tuple[list[Episode], list[float]]:
        """The round's episodes from every process and their scores: sampled and saved, or read back when
        an earlier run of this round finished sampling (`warm_start.save_collected`)."""
        saved = ws.read_collected(self.run_dir, round_index)
        if saved is not None:
            return saved
        episodes = gather_object(self.warm_start.collect(round_index))
        scores = [self.warm_start.score(e) for e in episodes]
        if self.accelerator.is_main_process:
            ws.save_collected(self.run_dir, round_index, episodes, scores)
        self.accelerator.wait_for_everyone()
        return episodes, scores

    def _fine_tune(self, episodes: list[Episode], optimizer, round_index: int) -> dict[str, float]:
        """`epochs` shuffled passes of likelihood training over every parsed policy turn of `episodes` (the
        same on every process; each process trains its share of the micro-batches)."""
        cfg = self.warm_start.config
        samples = ws.likelihood_samples(episodes, self.policy.tokenizer, self.config.roles or None)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        self.policy.train()
        with progress_bar(self.accelerator.is_main_process, "{task.description}: fine-tune") as bar:
            task = bar.add_task(f"warm-start round {round_index}", total=None)
            for epoch in range(cfg.epochs if samples else 0):
                seed = self.config.seed * 1_000_003 + round_index * 1009 + epoch + 500_009  # apart from RL's
                order = torch.Generator().manual_seed(seed)
                chunks = self._micro_batches(samples, order, cfg.micro_batch_size)
                mine = chunks[self.accelerator.process_index :: self.accelerator.num_processes]
                minibatches = self._in_lockstep(mine, cfg.grad_accum)
                bar.update(task, total=cfg.epochs * len(minibatches))  # same every epoch
                for minibatch in minibatches:
                    ok, step_stats = self._optimizer_step(minibatch, optimizer, 1.0)
                    updates, skipped = updates + 1, skipped + (not ok)
                    for k, v in step_stats.items():
                        stats[k].append(v)
                    bar.advance(task)
        self.policy.eval()
        out = self._mean_over_ranks(stats)
        return out | {"samples": float(len(samples)), "updates": float(updates), "skipped_updates": skipped}

    def _finish_round(self, round_index: int, kept: list[Episode], record: dict[str, Any]) -> None:
        """Append the round's kept episodes and log record, then save the policy to `round-NN` atomically:
        the folder's existence marks the round as finished."""
        if self.accelerator.is_main_process:
            ws.append_kept(self.run_dir, round_index, kept)
            with (ws.warm_dir(self.run_dir) / ws.LOG).open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(_jsonable(record)) + "\n")
            self._track(record, "round", prefix=f"{WARM_START}/")
            final = ws.round_dir(self.run_dir, round_index)
            tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            self.accelerator.unwrap_model(self.model).save(tmp / "policy")
            os.replace(tmp, final)
            if self.on_step is not None:
                self.on_step(record)
        self.accelerator.wait_for_everyone()

    # ---- logging ------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    def _log(self, record: dict[str, Any]) -> None:
        if not self.accelerator.is_main_process:
            return
        if self.on_step is not None:
            self.on_step(record)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(_jsonable(record)) + "\n")
        self._track(record, "step")

    def _track(self, record: dict[str, Any], step_key: str, prefix: str = "") -> None:
        """Send a log record's numbers to the trackers (main process; started at the first record), with
        `record[step_key]` as their step."""
        if self._own_trackers and not self._tracking:
            tracking.start(self.accelerator, self.tracking, self.run_dir.name)
            self._tracking = True
        values = tracking.scalars(record, prefix, skip=(step_key,))
        self.accelerator.log(values, step=int(record[step_key]))

    def finish_tracking(self) -> None:
        """Close the trackers this trainer started (`train` does at its end); the next record reopens them."""
        if self._tracking:
            tracking.finish(self.accelerator)
            self._tracking = False

    def _save_rollouts(self, episodes: list[Episode]) -> None:
        """Traces for reading what the policy did, every process's: each episode's turns with completion,
        format flag and reward (prompts and token ids left out; `searchteam eval` keeps them in full)."""
        lines = gather_object([json.dumps({"step": self.step + 1, **_trace(e)}) for e in episodes])
        if not self.accelerator.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / ROLLOUTS_NAME).open("a", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)

    # ---- checkpoints --------------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        every = self.config.save_every
        return self.step == self.config.steps or (every > 0 and self.step % every == 0)

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / CHECKPOINTS

    def save_checkpoint(self) -> Path:
        """Write `checkpoints/step-NNNNNN` atomically (temporary folder, then rename): the trained weights
        (and exported adapters/model), optimizer, scheduler, RNG states (python, numpy, torch) and step."""
        final = self.checkpoint_root / f"step-{self.step:06d}"
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            tmp = self.checkpoint_root / f".tmp-{final.name}-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.accelerator.unwrap_model(self.model).save(tmp / "policy")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(_rng_state(), tmp / "rng.pt")
            state = {"step": self.step, "config": self.config.model_dump(mode="json")}
            (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2), encoding="utf-8")
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._prune_checkpoints()
        self.accelerator.wait_for_everyone()
        return final

    def _prune_checkpoints(self) -> None:
        keep = self.config.keep_checkpoints
        if keep > 0:
            for old in list_checkpoints(self.run_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    def resume(self, checkpoint: Path | None = None) -> int:
        """Restore a checkpoint (default: the newest in this run) and return its step. The log of this run
        directory is cut back to that step, so a resumed run's log reads as one uninterrupted run. A run
        killed during its warm start has no checkpoint yet: it resumes at step 0, and `train` continues
        the warm start after its last finished round (from the round's saved samples when it had them)."""
        if checkpoint is None:
            found = list_checkpoints(self.run_dir)
            if not found and self.warm_start is not None and ws.has_progress(self.run_dir):
                return 0
            if not found:
                raise FileNotFoundError(f"no checkpoint to resume from under {self.checkpoint_root}")
            checkpoint = found[-1]
        checkpoint = Path(checkpoint)
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
        self.accelerator.unwrap_model(self.model).load(checkpoint / "policy")
        on_cpu = {"map_location": "cpu"}  # not onto the device of the process that saved it
        self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True, **on_cpu))
        self.scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=True, **on_cpu))
        _set_rng_state(torch.load(checkpoint / "rng.pt", weights_only=False, **on_cpu))
        self.step = int(state["step"])
        self._truncate_log(self.step)
        return self.step

    def _truncate_log(self, step: int) -> None:
        if self.accelerator.is_main_process:
            for path in (self.log_path, self.run_dir / ROLLOUTS_NAME):
                truncate_jsonl(path, "step", step)


def truncate_jsonl(path: Path, key: str, upto: int) -> None:
    """Keep the records of a JSONL log whose `key` is at most `upto` (a resumed run rewrites the rest); a
    torn line (the process died mid-write) and anything after it are dropped."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            break
        if record is not None and record.get(key, 0) <= upto:
            kept.append(line)
    path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")


def _add_entropy(
    sums: dict[str, list[float]], roles: list[str], entropy: torch.Tensor | None, mask: torch.Tensor
) -> None:
    """Accumulate each role's summed token entropy and trained-token count of one micro-batch."""
    if entropy is None:
        return
    mask = mask.to(entropy.dtype)
    totals = (entropy.detach() * mask).sum(-1).tolist()
    counts = mask.sum(-1).tolist()
    for role, total, count in zip(roles, totals, counts, strict=True):
        sums[role][0] += total
        sums[role][1] += count


def _entropy_means(sums: dict[str, list[float]]) -> dict[str, float]:
    """`entropy/<role>` and `entropy`: mean token entropy over the trained tokens of the mini-batch."""
    out = {f"entropy/{role}": total / count for role, (total, count) in sorted(sums.items()) if count}
    count = sum(c for _, c in sums.values())
    if count:
        out["entropy"] = sum(t for t, _ in sums.values()) / count
    return out


def _warn_half_precision_weights(policy: Policy) -> None:
    """Pure bf16/fp16 trained weights lose most AdamW updates to rounding (`policy.weight_dtype`)."""
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


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary folders of interrupted saves are ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _trace(episode: Episode) -> dict[str, Any]:
    """An episode for `rollouts.jsonl`: question, answer, meta and turns without prompts or token ids."""
    return episode.model_dump(
        mode="json",
        include={"question", "answer", "error", "meta", "turns"},
        exclude={"turns": {"__all__": {"messages", "prompt_token_ids", "completion_token_ids", "logprobs"}}},
    )


def _light(sample: Sample) -> Sample:
    """A sample without its prompt and per-token lists, for the log statistics of all processes."""
    return replace(sample, prompt_ids=[], loss_mask=[], old_logprobs=None, ref_logprobs=None)


def _jsonable(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf become null so the log stays valid JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
