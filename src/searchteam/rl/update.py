"""The RL step's update of the policy: score the step's samples (old, reference and critic values), fill
their advantages with the registered estimators, then `ppo_epochs` passes of clipped-surrogate updates,
one optimizer step per mini-batch (`searchteam.rl.batching`), each parameter group's gradient clipped on
its own and applied only when finite. The first optimizer step needs no scoring pass for π_old: its
weights are still π_old's. The warm start's likelihood fine-tuning takes the same optimizer steps on SFT
samples.

Under several processes each process updates on its own samples and all stay in lockstep: they plan the
same mini-batches over every process's samples, take as many micro-batches per optimizer step (padding with
zero-weight ones) and normalize the loss by the counts of all processes, so that W processes compute the
single-process loss on the union of their data (`searchteam.rl.distributed`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from contextlib import nullcontext

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from searchteam.rl.advantages import assign_advantages, trains_critic
from searchteam.rl.batching import Slot, deal, lockstep, micro_batches, mini_batches, slots_of
from searchteam.rl.config import TrainConfig
from searchteam.rl.distributed import mean_over_ranks, sum_over_ranks, whiten_over_ranks
from searchteam.rl.experience import Batch, Sample, collate
from searchteam.rl.losses import policy_loss, sft_loss, truncated_is_weights, value_loss
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
        seed: int = 0,
    ) -> None:
        self.policy = policy
        self.model = model
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.config = config
        self.seed = seed  # orders the mini-batches
        pad_id = policy.tokenizer.pad_token_id
        self.pad_id = policy.tokenizer.eos_token_id if pad_id is None else pad_id

    def rl_update(self, samples: list[Sample], step: int) -> dict[str, float]:
        """The policy update of RL step `step` (0-based) on this process's `samples`; returns the mean
        statistics of every process's micro-batches and the number of (skipped) optimizer steps. The
        optimizer steps are planned first (`searchteam.rl.batching`): the samples of the very first one are
        scored by its own forward pass, where the weights still are π_old's, and only the others before."""
        cfg = self.config
        everyone = self.gather_slots(samples)
        schedules = [
            self.schedule(samples, everyone, self.generator(step, epoch), cfg.mini_batch_size)
            for epoch in range(cfg.ppo_epochs)
        ]
        reuse = self.first_step_gives_old()
        first = schedules[0][0] if reuse and schedules[0] else []
        self.score(samples, fresh={id(s) for chunk in first if chunk for s in chunk})
        assign_advantages(samples, cfg, whitening=False)
        whiten_over_ranks(self.accelerator, samples, cfg)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        self.policy.train()
        for schedule in schedules:
            for minibatch in schedule:
                ok, step_stats = self.optimizer_step(minibatch, fresh=reuse and updates == 0)
                updates += 1
                skipped += not ok
                for k, v in step_stats.items():
                    stats[k].append(v)
        self.policy.eval()
        return mean_over_ranks(stats) | {"updates": updates, "skipped_updates": skipped}

    def first_step_gives_old(self) -> bool:
        """Whether the first optimizer step's own forward pass gives π_old: its weights are the rollouts'
        (`old_logprobs: recompute`) and a training pass computes what an evaluation pass does (no dropout).
        TRL and verl reuse it the same way when a batch gets one optimizer step."""
        return self.config.old_logprobs == "recompute" and self.policy.deterministic

    def generator(self, step: int, epoch: int, offset: int = 0) -> torch.Generator:
        """The shuffle of `epoch` of RL step `step` (`offset`: another stage's, e.g. the warm start's)."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + step * 1009 + epoch + offset)

    def slots(self, samples: list[Sample], rank: int = 0) -> list[Slot]:
        """`samples` of process `rank` as the schedule sees them; with per-role LoRA a forward pass holds
        one role."""
        return slots_of(
            samples, rank, per_role=self.policy.mode == "role_lora", share_prefixes=self.config.share_prefixes
        )

    def gather_slots(self, samples: list[Sample]) -> list[Slot]:
        """Every process's samples, as the schedule sees them (one all-gather of small tuples; with shared
        prefixes they carry their token ids)."""
        mine = self.slots(samples, self.accelerator.process_index)
        return gather_object(mine) if self.accelerator.num_processes > 1 else mine

    def schedule(
        self,
        samples: list[Sample],
        everyone: list[Slot],
        generator: torch.Generator,
        mini_batch_size: int | None,
        micro_batch_size: int | None = None,
        replicated: bool = False,
    ) -> list[list[list[Sample] | None]]:
        """This process's optimizer steps: per mini-batch of `everyone`'s samples (`batching`), its own
        micro-batches, padded with zero-weight ones (None) to as many as the busiest process has.
        `replicated`: every process holds all of `samples` and takes a share of each mini-batch."""
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        size = micro_batch_size or self.config.micro_batch_size
        steps = []
        for minibatch in mini_batches(everyone, mini_batch_size, generator):
            slots = deal(minibatch, world) if replicated else minibatch
            mine = lockstep(slots, world, size, self.config.micro_batch_tokens)[rank]
            steps.append([[samples[s.index] for s in chunk] or None for chunk in mine])
        return steps

    @torch.no_grad()
    def score(self, samples: list[Sample], fresh: Collection[int] = ()) -> None:
        """Before updating: old logprobs (π_θold) of the samples that need them, reference logprobs (when
        penalized) and critic values (of the turns a critic estimates). Samples in `fresh` (ids) are in the
        first optimizer step, whose own forward pass gives their π_old. Scored by the policy itself, not its
        DDP wrapper: no collective, so processes need not agree on how many micro-batches they score."""
        cfg = self.config
        recompute = cfg.old_logprobs == "recompute"
        critic = self.policy.value_head is not None

        def needs_old(s: Sample) -> bool:
            return not s.sft and (id(s) not in fresh if recompute else s.old_logprobs is None)

        old = {id(s) for s in samples if needs_old(s)}
        valued = [s for s in samples if critic and not s.sft and trains_critic(cfg.estimator_of(s.role))]
        scored = [s for s in samples if id(s) in old] + [s for s in valued if id(s) not in old]
        if recompute:
            for s in samples:
                s.old_logprobs = None
        self.policy.eval()
        for chunk in self.forward_passes(scored):
            self.policy.activate(chunk[0].role)
            batch = self.collate(chunk)
            with self.accelerator.autocast():  # as the prepared model computes in training
                logprobs, values, _ = self.policy(
                    batch.input_ids,
                    batch.attention_mask,
                    batch.target_index,
                    batch.value_index,
                    mask=batch.loss_mask,
                    tree=batch.tree,
                    target_ids=batch.target_ids,
                )
            for i, s in enumerate(chunk):
                if id(s) in old:
                    s.old_logprobs = logprobs[i, : len(s.completion_ids)].float().cpu().tolist()
                if values is not None:
                    s.old_value = float(values[i])
        if cfg.kl_coef == 0:
            return
        for chunk in self.forward_passes([s for s in samples if not s.sft]):
            self.policy.activate(chunk[0].role)
            batch = self.collate(chunk)
            with self.accelerator.autocast():
                ref = self.policy.reference_logprobs(batch)
            for i, s in enumerate(chunk):
                s.ref_logprobs = ref[i, : len(s.completion_ids)].float().cpu().tolist()

    def collate(self, chunk: list[Sample]) -> Batch:
        """A micro-batch's tensors on this process's device: padded rows, or one packed row."""
        return collate(chunk, self.pad_id, self.config.share_prefixes).to(self.accelerator.device)

    def forward_passes(self, samples: list[Sample]) -> list[list[Sample]]:
        """`samples` in micro-batches of similar length (no shuffle, no collective: for scoring)."""
        chunks = micro_batches(
            self.slots(samples), self.config.micro_batch_size, self.config.micro_batch_tokens
        )
        return [[samples[s.index] for s in chunk] for chunk in chunks]

    def optimizer_step(
        self,
        chunks: list[list[Sample] | None],
        optimizer: Optimizer | None = None,
        sft_coef: float | None = None,
        fresh: bool = False,
    ) -> tuple[bool, dict[str, float]]:
        """Accumulate gradients over micro-batches (None: a zero-weight padding one), normalized by the whole
        mini-batch's token and sequence counts over all processes, then clip each parameter group (`clip`)
        and step — unless any loss or gradient norm is not finite, in which case the gradients are dropped
        and the weights and optimizer state stay untouched (see `step_if_finite`). Also measures the
        policy's token entropy on the trained tokens, per role. `optimizer` and `sft_coef` default to the RL
        run's (the warm start passes its own). `fresh`: no optimizer step since the rollouts, so the
        forward pass's own detached logprobs are π_old (recorded for the samples' later epochs)."""
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
                batch = self.collate(chunk)
                sft = chunk[0].sft  # a micro-batch is all SFT or all RL samples (`micro_batches`)
                logprobs, values, entropy = self.model(
                    batch.input_ids,
                    batch.attention_mask,
                    batch.target_index,
                    batch.value_index,
                    entropy="none" if sft else entropy_mode,
                    critic=not sft,
                    mask=batch.loss_mask,
                    tree=batch.tree,
                    target_ids=batch.target_ids,
                )
                if sft:
                    out = sft_loss(logprobs, batch.loss_mask, sft_coef, num_sft_tokens)
                    finite = finite and bool(torch.isfinite(out.loss))
                    self.accelerator.backward(out.loss)
                    for k, v in out.stats.items():
                        stats[k].append(v)
                    continue
                if fresh:
                    batch.old_logprobs = keep_old_logprobs(chunk, logprobs)
                elif batch.old_logprobs is None:
                    raise RuntimeError("a sample has no π_old after the first optimizer step")
                loss, out_stats = self.rl_loss(
                    batch, chunk, logprobs, values, entropy, num_tokens, num_seqs, num_critic
                )
                finite = finite and bool(torch.isfinite(loss))
                self.accelerator.backward(loss)
            for k, v in out_stats.items():
                stats[k].append(v)
            add_entropy(entropy_sums, batch.roles, entropy, batch.loss_mask)
        norms = self.clip(optimizer, cfg.max_grad_norm)
        grad_norm = float(np.sqrt(sum(n**2 for n in norms.values())))
        ok = self.step_if_finite(finite, grad_norm, optimizer)
        optimizer.zero_grad(set_to_none=True)
        summary = {k: float(np.mean(v)) for k, v in stats.items()}
        summary.update(entropy_means(entropy_sums))
        summary["grad_norm"] = grad_norm
        if len(norms) > 1:
            summary.update({f"grad_norm/{name}": norm for name, norm in norms.items()})
        return ok, summary

    def clip(self, optimizer: Optimizer, max_norm: float) -> dict[str, float]:
        """Clip each parameter group's gradient to `max_norm` on its own (each role's adapter, the critic),
        as verl clips actor and critic apart: one norm over all would let a fresh critic's large
        gradient shrink the policy's step. Returns each group's norm before clipping."""
        self.accelerator.unscale_gradients(optimizer)  # fp16: once, before any norm
        return {
            group.get("name", str(i)): float(torch.nn.utils.clip_grad_norm_(group["params"], max_norm))
            for i, group in enumerate(optimizer.param_groups)
        }

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
            is_weights=self.is_weights(batch),
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

    def is_weights(self, batch: Batch) -> torch.Tensor | None:
        """Truncated importance-sampling weights of the batch's tokens (`rollout_is_cap`), if on and known."""
        cap = self.config.rollout_is_cap
        if cap is None or batch.rollout_logprobs is None or batch.old_logprobs is None:
            return None
        return truncated_is_weights(batch.old_logprobs, batch.rollout_logprobs, cap)

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


def keep_old_logprobs(chunk: list[Sample], logprobs: torch.Tensor) -> torch.Tensor:
    """π_old of a micro-batch of the first optimizer step: its own logprobs, detached, also kept on its
    samples for later epochs."""
    old = logprobs.detach().float()
    for i, s in enumerate(chunk):
        s.old_logprobs = old[i, : len(s.completion_ids)].cpu().tolist()
    return old


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
