"""Reinforcement learning for search teams: samples from episodes, advantage estimators, PPO/GRPO/GSPO losses,
a shared or per-role-LoRA policy, and an accelerate-based trainer."""

from searchteam.rl.advantages import gae, group_normalize, informative_groups, role_group_normalize, whiten
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Batch, Sample, chat_render, collate, samples_from_episodes
from searchteam.rl.losses import kl_penalty, policy_loss, sequence_log_ratio, value_loss
from searchteam.rl.policy import Policy, build_policy, load_policy
from searchteam.rl.trainer import Trainer, list_checkpoints

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
    "group_normalize",
    "informative_groups",
    "kl_penalty",
    "list_checkpoints",
    "load_policy",
    "policy_loss",
    "role_group_normalize",
    "samples_from_episodes",
    "sequence_log_ratio",
    "value_loss",
    "whiten",
]
