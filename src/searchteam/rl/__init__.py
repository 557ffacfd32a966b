"""Reinforcement learning for search teams: samples from episodes (`experience`), a registry of advantage
estimators (`advantages`), PPO/GRPO/GSPO losses (`losses`), a shared or per-role-LoRA policy (`policy`), and
an accelerate-based trainer (`trainer`) made of the update (`update`), the warm start
(`warm_start`), checkpoints (`checkpoints`), the run's records (`run_log`) and its
processes (`distributed`)."""
