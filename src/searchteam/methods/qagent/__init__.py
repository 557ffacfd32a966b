"""QAgent: a search agent trained end to end (stage 1), then for a frozen generator (stage 2)."""

from __future__ import annotations

from typing import Any

from searchteam.errors import ConfigError
from searchteam.methods import register_method
from searchteam.methods.qagent.reward import REWARD
from searchteam.methods.qagent.team import QAgent


def frozen_generator(cfg: Any) -> dict[str, str]:
    """A training run's frozen role models. QAgent stage 2 (§3.4) trains the agent for a FROZEN generator:
    unless the run gives it a model (`role_models.generator`), a separate copy of the base model serves it,
    never the trained policy."""
    stage2 = int(cfg.reward.get("stage", 1)) == 2
    if not stage2 or "generator" in cfg.role_models:
        return dict(cfg.role_models)
    if cfg.options.get("mode") != "submodule":
        raise ConfigError("qagent stage 2 rewards a frozen generator's answer: set options.mode: submodule")
    return {**cfg.role_models, "generator": cfg.model}


register_method(
    QAgent, position=6, reward=REWARD, recipes={"cpu": "smollm135m-cpu"}, training_models=frozen_generator
)
