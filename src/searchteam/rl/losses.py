"""Policy and value losses: PPO's clipped surrogate (M-ASK Eq. 4) at the token level, GSPO's length-normalized
sequence ratio (DECOR Eq. 5) with DAPO's asymmetric clip-higher (DECOR Eq. 4), an optional KL penalty to a
frozen reference (QAgent Eq. 1), and the clipped critic loss (M-ASK Eq. 5).

Shapes: per-token tensors are [B, T] (right-padded completions), `mask` is the loss mask (1 on tokens the
model generated, 0 on environment tokens and padding), per-sequence tensors are [B]."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from searchteam.rl.config import KLEstimator, LossAgg, RatioLevel


@dataclass
class LossOutput:
    """A differentiable loss plus detached diagnostics (python floats) for the training log."""

    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAgg,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> torch.Tensor:
    """Reduce a [B, T] loss. `token_mean` weighs every trained token equally (GRPO / DAPO); `seq_mean`
    averages each sequence's token mean, so every sequence counts once (GSPO). Pass the totals of the whole
    optimizer mini-batch as `num_tokens` / `num_seqs` so that gradient accumulation over micro-batches sums
    exactly to the full-batch loss."""
    if mode == "token_mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1)
        return (values * mask).sum() / denom
    if mode == "seq_mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        denom = num_seqs if num_seqs is not None else values.shape[0]
        return per_seq.sum() / denom
    raise ValueError(f"unknown loss aggregation '{mode}'; choose token_mean or seq_mean")


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log ρ_i of DECOR Eq. 5 (GSPO): (1/|o_i|) Σ_t log π_θ(o_{i,t}) / π_old(o_{i,t}) over trained tokens."""
    return ((logprobs - old_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman's estimators):
    k1 = log π_θ/π_ref (unbiased, can be negative); k3 = π_ref/π_θ − log(π_ref/π_θ) − 1 (unbiased, ≥ 0)."""
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        log_ratio = log_ratio.clamp(-20.0, 20.0)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator '{estimator}'; choose k1 or k3")


def truncated_is_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """min(π_old / π_rollout, `cap`) per token: the correction for tokens drawn from the rollout engine's
    distribution rather than π_old (truncated importance sampling, as verl's rollout correction); 1 where
    the engine gave no logprob (nan)."""
    known = torch.isfinite(rollout_logprobs)
    log_ratio = old_logprobs - torch.where(known, rollout_logprobs, old_logprobs)
    weights = torch.exp(log_ratio.clamp(max=20.0)).clamp(max=cap)
    return torch.where(known, weights, torch.ones_like(weights)).detach()


def clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Negated PPO objective max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high)) and where the clipped branch won.
    With ε_high > ε_low (clip-higher) positive-advantage tokens may move further than negative ones."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    level: RatioLevel = "token",
    agg: LossAgg = "token_mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
) -> LossOutput:
    """Clipped policy-gradient loss (to minimize).

    level="token": ρ_{i,t} = π_θ(o_{i,t}) / π_old(o_{i,t}) per token (PPO, M-ASK Eq. 4; GRPO, QAgent Eq. 1).
    level="sequence": ρ_i = exp(mean_t log-ratio) shared by all tokens of sequence i (GSPO, DECOR Eq. 5).
    `advantages` is [B] (one per sequence, broadcast over its tokens) or [B, T]. With `ref_logprobs` and
    `kl_coef` > 0 the loss adds β · KL(π_θ ‖ π_ref), aggregated the same way. With the per-token `entropy`
    [B, T] of π_θ the stats report its mean over trained tokens, and `entropy_coef` > 0 subtracts
    c · entropy (an exploration bonus), aggregated like the policy loss. `is_weights` [B, T] (detached)
    weights each token's surrogate: truncated importance sampling for tokens the rollout engine sampled
    from a distribution other than π_old (`truncated_is_weights`)."""
    mask = mask.to(logprobs.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    adv = adv.expand_as(logprobs)
    if level == "token":
        log_ratio = logprobs - old_logprobs
    elif level == "sequence":
        log_ratio = sequence_log_ratio(logprobs, old_logprobs, mask)[:, None].expand_as(logprobs)
    else:
        raise ValueError(f"unknown ratio level '{level}'; choose token or sequence")
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    per_token, was_clipped = clipped_surrogate(ratio, adv, clip_low, clip_high)
    if is_weights is not None:
        per_token = per_token * is_weights
    pg_loss = aggregate(per_token, mask, agg, num_tokens, num_seqs)
    loss = pg_loss
    with torch.no_grad():
        if level == "token":
            unit_mask, unit_clipped, unit_ratio, unit_adv = mask, was_clipped, ratio, adv
        else:  # one unit per sequence: every token carries the same ratio and advantage
            unit_mask = (mask.sum(-1) > 0).to(mask.dtype)
            unit_clipped, unit_ratio, unit_adv = was_clipped[:, 0], ratio[:, 0], adv[:, 0]
        stats = {
            "pg_loss": pg_loss.item(),
            "clip_frac": masked_mean(unit_clipped.to(mask.dtype), unit_mask).item(),
            "clip_frac_high": masked_mean((unit_clipped & (unit_adv > 0)).to(mask.dtype), unit_mask).item(),
            "clip_frac_low": masked_mean((unit_clipped & (unit_adv < 0)).to(mask.dtype), unit_mask).item(),
            "ratio_mean": masked_mean(unit_ratio, unit_mask).item(),
            "approx_kl": masked_mean(old_logprobs - logprobs, mask).item(),
        }
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        kl_loss = aggregate(kl, mask, agg, num_tokens, num_seqs)
        stats["kl_ref"] = masked_mean(kl.detach(), mask).item()
        if kl_coef > 0:
            loss = loss + kl_coef * kl_loss
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), mask).item()
        if entropy_coef > 0:
            loss = loss - entropy_coef * aggregate(entropy, mask, agg, num_tokens, num_seqs)
    stats["policy_loss"] = loss.item()
    return LossOutput(loss, stats)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_eps: float | None = 0.2,
    num_seqs: float | None = None,
) -> LossOutput:
    """Critic regression to the returns R_t (M-ASK Eq. 5), PPO2-style clipped:
    ½ max((V − R)², (V_old + clip(V − V_old, −ε, ε) − R)²), averaged over turns. One value per turn ([B])."""
    loss_plain = (values - returns) ** 2
    if clip_eps is None:
        per_turn, clipped = loss_plain, torch.zeros_like(loss_plain, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        loss_clip = (v_clip - returns) ** 2
        per_turn, clipped = torch.maximum(loss_plain, loss_clip), loss_clip > loss_plain
    denom = num_seqs if num_seqs is not None else values.shape[0]
    loss = 0.5 * per_turn.sum() / denom
    stats = {
        "value_loss": loss.item(),
        "value_clip_frac": clipped.float().mean().item(),
        "value_mean": values.detach().mean().item(),
    }
    return LossOutput(loss, stats)


def sft_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, coef: float, num_tokens: float | None = None
) -> LossOutput:
    """DAC's auxiliary SFT term (Appendix D, Eq. 8): β_SFT · (−log π(A | Q, E′)) on pseudo-target tokens,
    averaged over the mini-batch's SFT tokens (`num_tokens`) so the term's scale does not grow with the
    number of hard-positive samples. The `sft_loss` stat is the unweighted mean token NLL."""
    mask = mask.to(logprobs.dtype)
    nll = aggregate(-logprobs, mask, "token_mean", num_tokens)
    return LossOutput(coef * nll, {"sft_loss": masked_mean(-logprobs.detach(), mask).item()})
