"""The RL loop on PyTorch + accelerate (runs as is under `accelerate launch`): rollout → reward → samples →
advantages → `ppo_epochs` passes of clipped-surrogate updates → log → checkpoint.

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
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedDataParallelKwargs

from searchteam.rl.advantages import gae, group_normalize, informative_groups, role_group_normalize, whiten
from searchteam.rl.config import CHECKPOINTS, LOG_NAME, ROLLOUTS_NAME, TrainConfig
from searchteam.rl.experience import Render, Sample, collate, samples_from_episodes
from searchteam.rl.losses import policy_loss, value_loss
from searchteam.rl.policy import Policy
from searchteam.types import Episode

Rollout = Callable[[int], list[Episode]]
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


def assign_advantages(samples: list[Sample], config: TrainConfig) -> None:
    """Fill `advantage` (and `returns`) on every sample with the configured estimator."""
    if not samples:
        return
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    if config.estimator == "gae":
        _assign_gae(samples, config)
        if config.whiten_advantages:
            adv = whiten(torch.tensor([s.advantage for s in samples], dtype=torch.float64))
            for s, a in zip(samples, adv.tolist(), strict=True):
                s.advantage = a
        return
    groups = [s.group_id for s in samples]
    if config.estimator == "grpo":
        adv = group_normalize(rewards, groups, config.adv_eps, config.adv_scale_by_std)
    else:
        roles = [s.role for s in samples]
        adv = role_group_normalize(rewards, groups, roles, config.adv_eps, config.adv_scale_by_std)
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
        s.returns = s.reward


def _assign_gae(samples: list[Sample], config: TrainConfig) -> None:
    by_episode: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_episode[s.episode_id].append(s)
    for turns in by_episode.values():
        turns.sort(key=lambda s: s.turn_index)
        rewards = torch.tensor([s.reward for s in turns], dtype=torch.float64)
        values = torch.tensor([s.old_value for s in turns], dtype=torch.float64)
        adv, ret = gae(rewards, values, config.gamma, config.lam)
        for s, a, r in zip(turns, adv.tolist(), ret.tolist(), strict=True):
            s.advantage, s.returns = a, r


def group_keys(samples: list[Sample], config: TrainConfig) -> list:
    """The keys advantages are normalized over: (group, role) for role_grpo, else the question group."""
    if config.estimator == "role_grpo":
        return [(s.group_id, s.role) for s in samples]
    return [s.group_id for s in samples]


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


class Trainer:
    """PPO / GRPO / GSPO trainer for one Policy. `train()` runs until `config.steps`; `resume()` first
    restores the newest (or a given) checkpoint so that the run continues exactly where it stopped.
    Construction seeds python, numpy and torch from `config.seed` (after the policy's LoRA init)."""

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
    ) -> None:
        _check_policy(policy, config)
        self.config = config
        self.rollout = rollout
        self.reward = reward
        self.render = render
        self.on_step = on_step
        self.run_dir = Path(run_dir)
        self.step = 0
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed)
        self.accelerator = accelerator or Accelerator(
            mixed_precision=config.mixed_precision,
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=config.lora_per_role)],
        )
        self.policy = policy
        groups = policy.param_groups(config.lr, config.role_lr, config.value_lr)
        optimizer = torch.optim.AdamW(
            groups, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay
        )
        self.model, self.optimizer = self.accelerator.prepare(policy, optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer.optimizer if hasattr(self.optimizer, "optimizer") else self.optimizer,
            lambda s: lr_multiplier(s, config),
        )
        self.pad_id = policy.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = policy.tokenizer.eos_token_id
        self.policy.eval()
        self._writer = self._tensorboard() if config.tensorboard else None

    # ---- the loop -------------------------------------------------------------------------------------

    def train(self) -> list[dict[str, Any]]:
        """Run the remaining steps up to `config.steps`; returns their log records."""
        records = []
        while self.step < self.config.steps:
            records.append(self.train_step())
        return records

    def train_step(self) -> dict[str, Any]:
        """One rollout batch and its policy update; writes the JSONL record and any due checkpoint."""
        started = time.perf_counter()
        episodes = self.rollout(self.step)
        rolled = time.perf_counter()
        self.reward(episodes)
        rewarded = time.perf_counter()
        if self.config.save_rollouts:
            self._save_rollouts(episodes)
        samples = samples_from_episodes(
            episodes,
            self.policy.tokenizer,
            self.render,
            roles=self.config.roles or None,
            merge_continuations=self.config.merge_continuations,
        )
        record: dict[str, Any] = {"step": self.step + 1, "lr": self.scheduler.get_last_lr()[0]}
        if len(self.optimizer.param_groups) > 1:
            record.update({f"lr/{g['name']}": g["lr"] for g in self.optimizer.param_groups})
        record.update(role_stats(samples))
        record["episodes"] = len(episodes)
        samples, record["filtered_samples"] = self._dynamic_sampling(samples)
        record["samples"] = len(samples)
        record.update(self._update(samples) if samples else {"skipped_updates": 0, "updates": 0})
        with warnings.catch_warnings():  # the schedule advances per training step, even a skipped one
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
            self.scheduler.step()
        self.step += 1
        record["time/rollout"] = rolled - started
        record["time/reward"] = rewarded - rolled
        record["time/update"] = time.perf_counter() - rewarded
        self._log(record)
        if self._checkpoint_due():
            self.save_checkpoint()
        return record

    def _dynamic_sampling(self, samples: list[Sample]) -> tuple[list[Sample], int]:
        if not self.config.dynamic_sampling:
            return samples, 0
        keep = informative_groups([s.reward for s in samples], group_keys(samples, self.config))
        kept = [s for s, k in zip(samples, keep, strict=True) if k]
        return kept, len(samples) - len(kept)

    # ---- update -------------------------------------------------------------------------------------

    def _micro_batches(self, samples: list[Sample], generator: torch.Generator | None) -> list[list[Sample]]:
        """Chunks of `micro_batch_size`, shuffled when a generator is given; role-pure for per-role LoRA."""
        order = list(range(len(samples)))
        if generator is not None:
            order = torch.randperm(len(samples), generator=generator).tolist()
        if self.policy.mode == "role_lora":
            pools: dict[str, list[int]] = defaultdict(list)
            for i in order:
                pools[samples[i].role].append(i)
            pools_list = [pools[r] for r in sorted(pools)]
        else:
            pools_list = [order]
        size = self.config.micro_batch_size
        chunks = [
            [samples[i] for i in pool[j : j + size]] for pool in pools_list for j in range(0, len(pool), size)
        ]
        if generator is not None and len(pools_list) > 1:
            chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=generator).tolist()]
        return chunks

    @torch.no_grad()
    def _score(self, samples: list[Sample]) -> None:
        """Old logprobs (π_θold), reference logprobs (when penalized) and critic values, before updating."""
        self.policy.eval()
        need_old = self.config.old_logprobs == "recompute" or any(s.old_logprobs is None for s in samples)
        if not need_old and self.config.kl_coef == 0 and self.policy.value_head is None:
            return
        for chunk in self._micro_batches(samples, None):
            self.policy.activate(chunk[0].role)
            batch = collate(chunk, self.pad_id).to(self.accelerator.device)
            logprobs, values = self.model(
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
        assign_advantages(samples, self.config)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        self.policy.train()
        for epoch in range(self.config.ppo_epochs):
            generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + self.step * 1009 + epoch)
            chunks = self._micro_batches(samples, generator)
            for start in range(0, len(chunks), self.config.grad_accum):
                ok, step_stats = self._optimizer_step(chunks[start : start + self.config.grad_accum])
                updates += 1
                skipped += not ok
                for k, v in step_stats.items():
                    stats[k].append(v)
        self.policy.eval()
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out.update(updates=updates, skipped_updates=skipped)
        return out

    def _optimizer_step(self, chunks: list[list[Sample]]) -> tuple[bool, dict[str, float]]:
        """Accumulate gradients over micro-batches, normalized by the whole mini-batch's token and sequence
        counts, then clip and step — unless any loss or the gradient norm is not finite, in which case the
        gradients are dropped and the weights and optimizer state stay untouched."""
        cfg = self.config
        num_tokens = float(sum(s.num_trained_tokens for c in chunks for s in c))
        num_seqs = float(sum(len(c) for c in chunks))
        stats: dict[str, list[float]] = defaultdict(list)
        finite = True
        for i, chunk in enumerate(chunks):
            self.policy.activate(chunk[0].role)
            batch = collate(chunk, self.pad_id).to(self.accelerator.device)
            sync = self.accelerator.no_sync(self.model) if i < len(chunks) - 1 else nullcontext()
            with sync:
                logprobs, values = self.model(
                    batch.input_ids, batch.attention_mask, batch.target_index, batch.value_index
                )
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
                )
                loss = out.loss
                if values is not None:
                    vout = value_loss(values, batch.old_values, batch.returns, cfg.value_clip, num_seqs)
                    loss = loss + cfg.value_coef * vout.loss
                    out.stats.update(vout.stats)
                finite = finite and bool(torch.isfinite(loss))
                self.accelerator.backward(loss)
            out.stats["loss"] = loss.item()
            for k, v in out.stats.items():
                stats[k].append(v)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = self.accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
        bad = torch.tensor(0.0 if finite else 1.0, device=self.accelerator.device)
        bad = self.accelerator.reduce(bad, reduction="sum")
        ok = bool(bad.item() == 0) and bool(torch.isfinite(torch.as_tensor(grad_norm)))
        if ok:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        summary = {k: float(np.mean(v)) for k, v in stats.items()}
        summary["grad_norm"] = float(grad_norm)
        return ok, summary

    # ---- logging ------------------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    def _log(self, record: dict[str, Any]) -> None:
        if self.on_step is not None:
            self.on_step(record)
        if not self.accelerator.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(_jsonable(record)) + "\n")
        if self._writer is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step" and math.isfinite(value):
                    self._writer.add_scalar(key, value, record["step"])
            self._writer.flush()

    def _save_rollouts(self, episodes: list[Episode]) -> None:
        """Traces for reading what the policy did: each episode's turns with completion, format flag and
        reward (prompts and token ids left out; `searchteam eval` keeps them in full)."""
        if not self.accelerator.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / ROLLOUTS_NAME).open("a", encoding="utf-8") as fh:
            for episode in episodes:
                trace = episode.model_dump(
                    mode="json",
                    include={"question", "answer", "error", "meta", "turns"},
                    exclude={
                        "turns": {
                            "__all__": {"messages", "prompt_token_ids", "completion_token_ids", "logprobs"}
                        }
                    },
                )
                fh.write(json.dumps({"step": self.step + 1, **trace}) + "\n")

    def _tensorboard(self):
        if not self.accelerator.is_main_process:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            return None
        return SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))

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
        directory is cut back to that step, so a resumed run's log reads as one uninterrupted run."""
        if checkpoint is None:
            found = list_checkpoints(self.run_dir)
            if not found:
                raise FileNotFoundError(f"no checkpoint to resume from under {self.checkpoint_root}")
            checkpoint = found[-1]
        checkpoint = Path(checkpoint)
        state = json.loads((checkpoint / "trainer_state.json").read_text(encoding="utf-8"))
        self.accelerator.unwrap_model(self.model).load(checkpoint / "policy")
        self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
        self.scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=True))
        _set_rng_state(torch.load(checkpoint / "rng.pt", weights_only=False))
        self.step = int(state["step"])
        self._truncate_log(self.step)
        return self.step

    def _truncate_log(self, step: int) -> None:
        if not self.accelerator.is_main_process:
            return
        for path in (self.log_path, self.run_dir / ROLLOUTS_NAME):
            if path.exists():
                lines = path.read_text(encoding="utf-8").splitlines()
                kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= step]
                path.write_text("".join(ln + "\n" for ln in kept), encoding="utf-8")


def _check_policy(policy: Policy, config: TrainConfig) -> None:
    """Fail before the first rollout when the policy lacks what the config asks for."""
    if config.estimator == "gae" and policy.value_head is None:
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


def _jsonable(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf become null so the log stays valid JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
