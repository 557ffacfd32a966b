"""The RL step's update of the policy: score the step's samples (old, reference and critic values), fill
their advantages with the registered estimators, then `ppo_epochs` passes of clipped-surrogate updates
over shuffled micro-batches, with gradients accumulated over `grad_accum` of them, clipped, and applied
only when finite. The warm start's likelihood fine-tuning takes the same optimizer steps on SFT samples.

Under several processes each process updates on its own samples and all stay in lockstep: they agree on
the number of micro-batches of every optimizer step (padding with zero-weight ones) and normalize the loss
by the counts of all processes, so that W processes compute the single-process loss on the union of their
data (`searchteam.rl.distributed`)."""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext

import numpy as np
import torch
from accelerate import Accelerator

from searchteam.rl.advantages import assign_advantages, trains_critic
from searchteam.rl.config import TrainConfig
from searchteam.rl.distributed import in_lockstep, mean_over_ranks, sum_over_ranks, whiten_over_ranks
from searchteam.rl.experience import Batch, Sample, collate
from searchteam.rl.losses import policy_loss, sft_loss, value_loss
from searchteam.rl.policy import Policy

Optimizer = torch.optim.Optimizer


class PolicyUpdater:
    """Gradient steps on `policy` (`model`: the policy as `accelerator.prepare` wrapped it) with the RL
    run's `optimizer` and options, or with another optimizer (the warm start's)."""

    def __init__(
        self,
        policy: Policy,
        model: torch.nn.Module,
        optimizer: Optimizer,
        accelerator: Accelerator,
        config: TrainConfig,
    ) -> None:
        self.policy = policy
        self.model = model
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.config = config
        pad_id = policy.tokenizer.pad_token_id
        self.pad_id = policy.tokenizer.eos_token_id if pad_id is None else pad_id

    def rl_update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """The policy update of RL step `step` (0-based) on this process's `samples`; returns the mean
        statistics of every process's micro-batches and the number of (skipped) optimizer steps."""
        self.score(samples)
        assign_advantages(samples, self.config, whitening=False)
        whiten_over_ranks(self.accelerator, samples, self.config)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        self.policy.train()
        for epoch in range(self.config.ppo_epochs):
            generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + step * 1009 + epoch)
            chunks = self.micro_batches(samples, generator)
            for minibatch in in_lockstep(self.accelerator, chunks, self.config.grad_accum):
                ok, step_stats = self.optimizer_step(minibatch)
                updates += 1
                skipped += not ok
                for k, v in step_stats.items():
                    stats[k].append(v)
        self.policy.eval()
        return mean_over_ranks(stats) | {"updates": updates, "skipped_updates": skipped}

    def micro_batches(
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
    def score(self, samples: list[Sample]) -> None:
        """Old logprobs (π_θold), reference logprobs (when penalized) and critic values, before updating.
        Scored by the policy itself, not its DDP wrapper: no collective, so processes need not agree on
        how many micro-batches they score."""
        self.policy.eval()
        need_old = self.config.old_logprobs == "recompute" or any(s.old_logprobs is None for s in samples)
        if not need_old and self.config.kl_coef == 0 and self.policy.value_head is None:
            return
        for chunk in self.micro_batches(samples, None):
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

    def optimizer_step(
        self,
        chunks: list[list[Sample] | None],
        optimizer: Optimizer | None = None,
        sft_coef: float | None = None,
    ) -> tuple[bool, dict[str, float]]:
        """Accumulate gradients over micro-batches (None: a zero-weight padding one), normalized by the whole
        mini-batch's token and sequence counts over all processes, then clip and step — unless any loss or
        the gradient norm is not finite, in which case the gradients are dropped and the weights and
        optimizer state stay untouched (see `step_if_finite`). Also measures the policy's token entropy on
        the trained tokens, per role. `optimizer` and `sft_coef` default to the RL run's (the warm start
        passes its own)."""
        cfg = self.config
        optimizer = optimizer or self.optimizer
        sft_coef = cfg.sft_coef if sft_coef is None else sft_coef
        entropy_mode = "grad" if cfg.entropy_coef > 0 else "detached"
        entropy_sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        real = [s for c in chunks if c for s in c]
        counts = sum_over_ranks(
            self.accelerator,
            sum(s.num_trained_tokens for s in real if not s.sft),
            sum(not s.sft for s in real),
            sum(s.num_trained_tokens for s in real if s.sft),
            sum(not s.sft and trains_critic(cfg.estimator_of(s.role)) for s in real),
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
                    self.accelerator.backward(self.padding_loss())
                    continue
                self.policy.activate(chunk[0].role)
                batch = collate(chunk, self.pad_id).to(self.accelerator.device)
                sft = chunk[0].sft  # a micro-batch is all SFT or all RL samples (`micro_batches`)
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
                loss, out_stats = self.rl_loss(
                    batch, chunk, logprobs, values, entropy, num_tokens, num_seqs, num_critic
                )
                finite = finite and bool(torch.isfinite(loss))
                self.accelerator.backward(loss)
            for k, v in out_stats.items():
                stats[k].append(v)
            add_entropy(entropy_sums, batch.roles, entropy, batch.loss_mask)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        grad_norm = self.accelerator.clip_grad_norm_(params, cfg.max_grad_norm)
        ok = self.step_if_finite(finite, grad_norm, optimizer)
        optimizer.zero_grad(set_to_none=True)
        summary = {k: float(np.mean(v)) for k, v in stats.items()}
        summary.update(entropy_means(entropy_sums))
        summary["grad_norm"] = float(grad_norm)
        return ok, summary

    def rl_loss(
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
        """The clipped policy loss of an RL micro-batch plus, for the turns a critic estimator estimates,
        the critic's."""
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
        rows = [i for i, s in enumerate(chunk) if trains_critic(cfg.estimator_of(s.role))]
        if values is not None and rows:  # the critic learns only the turns it estimates
            idx = torch.tensor(rows, device=values.device)
            vout = value_loss(
                values[idx], batch.old_values[idx], batch.returns[idx], cfg.value_clip, num_critic
            )
            loss = loss + cfg.value_coef * vout.loss
            out.stats.update(vout.stats)
        out.stats["loss"] = loss.item()
        return loss, out.stats

    def step_if_finite(self, finite: bool, grad_norm: torch.Tensor | float, optimizer: Optimizer) -> bool:
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

    def padding_loss(self) -> torch.Tensor:
        """The loss of a zero-weight micro-batch: one pad token through the model, times zero."""
        filler = Sample([self.pad_id], [self.pad_id], [0], role="", episode_id=-1, group_id="", turn_index=0)
        batch = collate([filler], self.pad_id).to(self.accelerator.device)
        logprobs, values, _ = self.model(
            batch.input_ids, batch.attention_mask, batch.target_index, batch.value_index
        )
        loss = logprobs.sum() * 0.0
        return loss if values is None else loss + values.sum() * 0.0


def add_entropy(
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


def entropy_means(sums: dict[str, list[float]]) -> dict[str, float]:
    """`entropy/<role>` and `entropy`: mean token entropy over the trained tokens of the mini-batch."""
    out = {f"entropy/{role}": total / count for role, (total, count) in sorted(sums.items()) if count}
    count = sum(c for _, c in sums.values())
    if count:
        out["entropy"] = sum(t for t, _ in sums.values()) / count
    return out
