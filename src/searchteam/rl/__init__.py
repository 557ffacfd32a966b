"""Reinforcement learning for search teams: samples from episodes (`experience`), a registry of advantage
estimators (`advantages`), PPO/GRPO/GSPO losses (`losses`), a shared or per-role-LoRA policy (`policy`), and
an accelerate-based trainer (`trainer`) made of the update (`update`), the warm start
(`warm_start`), checkpoints (`checkpoints`), the run's records (`run_log`) and its
processes (`distributed`)."""

from searchteam.rl.advantages import (
    gae,
    get_adv_estimator,
    group_normalize,
    informative_groups,
    register_adv_est,
    whiten,
)
from searchteam.rl.checkpoints import list_checkpoints
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Batch, Sample, chat_render, collate, samples_from_episodes
from searchteam.rl.losses import kl_penalty, policy_loss, sequence_log_ratio, value_loss
from searchteam.rl.policy import Policy, build_policy, load_policy
from searchteam.rl.trainer import Trainer

__all__ = [
    "Batch",
    "Policy",
    "Sample",
    "TrainConfig",
    "Trainer",
    "build_policy",
    "chat_render",
    "collate",
    "gae",
    "get_adv_estimator",
    "group_normalize",
    "informative_groups",
    "kl_penalty",
    "list_checkpoints",
    "load_policy",
    "policy_loss",
    "register_adv_est",
    "samples_from_episodes",
    "sequence_log_ratio",
    "value_loss",
    "whiten",
]
