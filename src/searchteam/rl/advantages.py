"""Advantage estimators: the tensor math (turn-level GAE for PPO with a critic, M-ASK §3.3; group-relative
normalization for GRPO, QAgent Eq. 1; DAPO's dynamic-sampling filter), and a registry of the estimators
a config names (`estimator`, `role_estimators`), each filling the advantages of its roles' samples.

An estimator registers with `register_adv_est(name, critic=..., by_role=...)` on a function
`(samples, options, config) -> None` that sets every sample's `advantage` and `returns`; the trainer finds
it with `get_adv_estimator(name)` and reads the two flags: `critic` (it needs value estimates, the critic
learns its turns, and `whiten_advantages` applies) and `by_role` (set for group-relative estimators: DAPO
filters their groups, compared per question, or per role within it)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from searchteam.rl.experience import Sample


class EstimatorOptions(Hashable, Protocol):
    """What an estimator reads of a role's resolved options (`rl.config.RoleEstimator`)."""

    estimator: str
    gamma: float | None
    lam: float | None
    adv_scale_by_std: bool | None
    whiten_advantages: bool | None


class EstimatorConfig(Protocol):
    """What the estimators read of a run's training config (`rl.config.TrainConfig`, which validates its
    estimator names against this module's registry)."""

    adv_eps: float

    def estimator_of(self, role: str) -> EstimatorOptions: ...


def gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over one episode's turns, in order (Schulman et al., 2016).

    Each turn t is one action u_t taken on observation o_t, with reward r_t credited at its last token
    and critic value V_t = V_φ(o_t). After the final turn the value is 0 (the episode ends):

        δ_t = r_t + γ V_{t+1} − V_t,   Â_t = Σ_l (γλ)^l δ_{t+l},   R_t = Â_t + V_t.

    R_t is the target of the critic (M-ASK Eq. 5). With γ = λ = 1 and V ≡ 0, Â_t = R_t = Σ_{k≥t} r_k,
    the reward-to-go. Returns (advantages, returns), both shaped like `rewards`."""
    if rewards.shape != values.shape or rewards.dim() != 1:
        raise ValueError(f"gae needs two 1-D tensors of equal length, got {rewards.shape} and {values.shape}")
    advantages = torch.zeros_like(rewards)
    running = rewards.new_zeros(())
    next_value = rewards.new_zeros(())
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
        next_value = values[t]
    return advantages, advantages + values


def group_ids_to_index(keys: Sequence[Hashable]) -> torch.Tensor:
    """Dense integer ids (0..K-1, in first-seen order) for arbitrary hashable group keys."""
    index: dict[Hashable, int] = {}
    return torch.tensor([index.setdefault(k, len(index)) for k in keys], dtype=torch.long)


def group_normalize(
    rewards: torch.Tensor, keys: Sequence[Hashable], eps: float = 1e-6, scale: bool = True
) -> torch.Tensor:
    """GRPO's group-relative advantage (QAgent Eq. 1): Â_i = (R_i − μ_g) / (σ_g + ε) over the G rollouts
    g of one question. σ is the sample standard deviation (Bessel-corrected, as in the GRPO reference
    implementations). `scale=False` keeps only the baseline, Â_i = R_i − μ_g (Dr. GRPO). A group with a
    single member has no peer to compare against, and one whose rewards are all equal carries no signal:
    their advantages are 0 (even with ε = 0)."""
    if rewards.dim() != 1 or rewards.shape[0] != len(keys):
        raise ValueError(f"one key per reward needed: {rewards.shape[0]} rewards, {len(keys)} keys")
    idx = group_ids_to_index(keys).to(rewards.device)
    n_groups = int(idx.max()) + 1 if len(keys) else 0
    count = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, idx, torch.ones_like(rewards)
    )
    mean = torch.zeros_like(count).index_add_(0, idx, rewards) / count
    centered = rewards - mean[idx]
    if not scale:
        return torch.where(count[idx] > 1, centered, torch.zeros_like(centered))
    sq = torch.zeros_like(count).index_add_(0, idx, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    denom = std[idx] + eps
    defined = (count[idx] > 1) & (denom != 0)  # NaN rewards stay NaN, for the trainer's guard to see
    return torch.where(defined, centered / torch.where(defined, denom, 1.0), torch.zeros_like(centered))


def informative_groups(rewards: Sequence[float], keys: Sequence[Hashable], tol: float = 1e-8) -> list[bool]:
    """DAPO dynamic sampling: a keep-mask that drops every group whose rewards are all equal (all right or
    all wrong), since their group-normalized advantages are all zero and only add noise to the batch."""
    if len(rewards) != len(keys):
        raise ValueError(f"one key per reward needed: {len(rewards)} rewards, {len(keys)} keys")
    members: dict[Hashable, list[float]] = defaultdict(list)
    for r, k in zip(rewards, keys, strict=True):
        members[k].append(float(r))
    # a group holding a NaN is kept so that the trainer's non-finite-loss guard sees it
    varied = {k: any(math.isnan(r) for r in v) or max(v) - min(v) > tol for k, v in members.items()}
    return [varied[k] for k in keys]


def whiten(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Batch-normalize advantages to zero mean and unit variance (common for PPO with GAE)."""
    if x.numel() < 2:
        return x - x.mean()
    return (x - x.mean()) / (x.std() + eps)


# ---- the registry -----------------------------------------------------------------------------------

EstimatorFn = Callable[[list[Sample], EstimatorOptions, EstimatorConfig], None]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: `compute(samples, options, config)` fills `advantage` and `returns` of the
    samples of every role it estimates (`options`: those roles' resolved `RoleEstimator`)."""

    name: str
    compute: EstimatorFn
    critic: bool  # reads critic values; the critic learns its turns; `whiten_advantages` applies
    by_role: bool | None  # group-relative: per question (False) or per role within it (True); else None


_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_adv_est(
    name: str, *, critic: bool = False, by_role: bool | None = None
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Register the decorated function as the advantage estimator `name` (see the module's docstring)."""

    def register(compute: EstimatorFn) -> EstimatorFn:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ESTIMATORS[name] = AdvantageEstimator(name, compute, critic, by_role)
        return compute

    return register


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`."""
    try:
        return _ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {known}") from None


def adv_estimator_names() -> list[str]:
    return sorted(_ESTIMATORS)


def trains_critic(options: EstimatorOptions) -> bool:
    """Whether the turns of roles with these options are estimated with (and train) the critic."""
    return get_adv_estimator(options.estimator).critic


def whitens(options: EstimatorOptions) -> bool:
    """Whether the advantages of roles with these options are whitened (a critic estimator's option)."""
    return trains_critic(options) and bool(options.whiten_advantages)


@register_adv_est("gae", critic=True)
def gae_advantages(samples: list[Sample], options: EstimatorOptions, config: EstimatorConfig) -> None:
    """Turn-level GAE over each episode's turns of the estimated roles, in order (M-ASK §3.3)."""
    by_episode: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_episode[s.episode_id].append(s)
    for turns in by_episode.values():
        turns.sort(key=lambda s: s.turn_index)
        rewards = torch.tensor([s.reward for s in turns], dtype=torch.float64)
        values = torch.tensor([s.old_value for s in turns], dtype=torch.float64)
        adv, ret = gae(rewards, values, options.gamma, options.lam)
        for s, a, r in zip(turns, adv.tolist(), ret.tolist(), strict=True):
            s.advantage, s.returns = a, r


@register_adv_est("grpo", by_role=False)
def grpo_advantages(samples: list[Sample], options: EstimatorOptions, config: EstimatorConfig) -> None:
    """GRPO over the trajectories of each question (QAgent Eq. 1), see `group_advantages`."""
    group_advantages(samples, False, config.adv_eps, bool(options.adv_scale_by_std))


@register_adv_est("role_grpo", by_role=True)
def role_grpo_advantages(samples: list[Sample], options: EstimatorOptions, config: EstimatorConfig) -> None:
    """GRPO per role within each question (DECOR Eq. 6: each role is compared only with itself)."""
    group_advantages(samples, True, config.adv_eps, bool(options.adv_scale_by_std))


# ---- advantages of samples --------------------------------------------------------------------------


def assign_advantages(samples: list[Sample], config: EstimatorConfig, whitening: bool = True) -> None:
    """Fill `advantage` (and `returns`) on every RL sample with its role's estimator (`estimator`, or the
    role's entry in `role_estimators`); SFT samples carry no advantage. Roles that share an estimator are
    estimated together: GAE runs over each episode's turns of those roles in order. `whitening=False`
    leaves GAE's `whiten_advantages` to the caller (the trainer whitens over every process's samples)."""
    for options, part in by_estimator(samples, config).items():
        get_adv_estimator(options.estimator).compute(part, options, config)
        if whitening and whitens(options):
            whiten_samples(part, [s.advantage for s in part])


def by_estimator(samples: list[Sample], config: EstimatorConfig) -> dict[EstimatorOptions, list[Sample]]:
    """The RL samples grouped by the estimator (and options) of their role."""
    groups: dict[EstimatorOptions, list[Sample]] = defaultdict(list)
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


def group_advantages(samples: list[Sample], by_role: bool, eps: float, scale: bool) -> None:
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


def informative_mask(samples: list[Sample], config: EstimatorConfig) -> list[bool]:
    """DAPO dynamic sampling at the trajectory level: False for the samples of a group whose trajectory
    rewards are all equal (zero advantage). Samples of other estimators (GAE) and SFT samples are kept."""
    dropped: set[int] = set()
    for est in _ESTIMATORS.values():
        if est.by_role is None:
            continue
        picked = [s for s in samples if not s.sft and config.estimator_of(s.role).estimator == est.name]
        members = trajectories(picked, est.by_role)
        rewards = [trajectory_reward(m) for m in members]
        varied = informative_groups(rewards, [group_of(m[0], est.by_role) for m in members])
        dropped |= {id(s) for m, v in zip(members, varied, strict=True) if not v for s in m}
    return [id(s) not in dropped for s in samples]
