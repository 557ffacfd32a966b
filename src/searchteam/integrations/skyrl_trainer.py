"""SkyRL's PPO trainer with the papers' credit assignment, and the experiment that builds it with
searchteam's generator.

SkyRL's step-wise training gives every step of a trajectory the advantage of its last step and refuses GAE.
With `trainer.algorithm.advantage_estimator=searchteam` (registered here), `SearchTeamTrainer` instead gives
each row (one per trained turn) the advantage searchteam's own estimators compute (`integrations.credit`:
turn-level GAE for M-ASK and DAC's searcher, GRPO over trajectories with DAC's hard-positive sub-groups,
DECOR's per-role GRPO), as `searchteam train` computes it; any other estimator is SkyRL's own.

    exp = SearchTeamExp(cfg, "examples/teams/jade-qwen2.5-7b.yaml")  # examples/skyrl/main_searchteam.py
    exp.run()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from searchteam.errors import ConfigError
from searchteam.extras import require
from searchteam.integrations.credit import CreditRow, prompt_values, token_credit
from searchteam.integrations.skyrl import SearchTeamGenerator, _typeddict_for_pydantic
from searchteam.rl.config import TrainConfig

with _typeddict_for_pydantic():
    trainer_module = require("skyrl.train.trainer", "skyrl", "the searchteam SkyRL trainer")
    main_base = require("skyrl.train.entrypoints.main_base", "skyrl", "the searchteam SkyRL trainer")
    ppo_utils = require("skyrl.backends.skyrl_train.utils.ppo_utils", "skyrl", "the searchteam SkyRL trainer")

ESTIMATOR = "searchteam"  # trainer.algorithm.advantage_estimator
CREDIT_ROWS = "searchteam_credit"  # the batch metadata holding each row's `environment.credit_fields`


@ppo_utils.register_advantage_estimator(ESTIMATOR)
def _searchteam_estimator(**kwargs: Any) -> Any:
    """Registered so that SkyRL's config validation accepts the name; `SearchTeamTrainer` computes it."""
    raise ConfigError(
        f"advantage_estimator={ESTIMATOR} is computed by searchteam's trainer: build the experiment with "
        "searchteam.integrations.skyrl_trainer.SearchTeamExp"
    )


def credit_tensors(
    uids: Sequence[str],
    is_last_step: Sequence[bool],
    fields: Sequence[dict[str, Any]],
    response_mask: torch.Tensor,
    values: torch.Tensor | None,
    config: TrainConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level advantages and returns (shaped like `response_mask`) of SkyRL's step-wise rows: row i
    answers prompt `uids[i]`; a trajectory's rows run up to one with `is_last_step`; `fields` are the rows'
    `environment.credit_fields` (rows past them are SkyRL's padding, given no credit); `values` (the
    critic's, per response token) give each turn the value of its prompt, read at its first token (SkyRL
    right-aligns responses)."""
    rows, trajectory = [], 0
    for i, value in enumerate(prompt_values(values, response_mask)):
        if i < len(fields):
            rows.append(CreditRow.of(str(uids[i]), f"{uids[i]}#{trajectory}", fields[i], value))
            trajectory += bool(is_last_step[i])
        else:
            pad = f"pad{i}"
            rows.append(CreditRow(group=pad, episode=pad, role="", turn=-1, reward=0.0, trained=False))
    return token_credit(rows, config, response_mask)


def refuse_rows_without_credit(cfg: Any, credit_config: TrainConfig) -> None:
    """Refuse, before any rollout, a SkyRL config whose training rows searchteam's credit cannot follow: rows
    that are not one per turn (step-wise trajectories off, or merged by SkyRL after the rollout), or GAE
    without SkyRL's critic."""
    generator = cfg.generator
    if not generator.step_wise_trajectories:
        raise ConfigError(
            f"advantage_estimator={ESTIMATOR} gives each turn its own advantage: set "
            "generator.step_wise_trajectories=true"
        )
    if generator.merge_stepwise_output:
        raise ConfigError(
            f"generator.merge_stepwise_output merges the turns that advantage_estimator={ESTIMATOR} credits "
            "one by one: set it false (the run config's train.merge_continuations merges continued turns, "
            "as Search-R1 trains)"
        )
    if credit_config.uses_critic and cfg.trainer.critic.model.path is None:
        raise ConfigError(
            "the searchteam run config estimates some role with GAE, which needs SkyRL's critic: set "
            "trainer.critic.model.path"
        )


class SearchTeamTrainer(trainer_module.RayPPOTrainer):
    """SkyRL's trainer whose advantages, under `advantage_estimator=searchteam`, are searchteam's."""

    def __init__(self, *args: Any, credit_config: TrainConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.credit_config = credit_config
        if self.searchteam_credit:
            refuse_rows_without_credit(self.cfg, credit_config)

    @property
    def searchteam_credit(self) -> bool:
        return self.cfg.trainer.algorithm.advantage_estimator == ESTIMATOR

    def convert_to_training_input(self, generator_output: Any, uids: list[str]) -> Any:
        data = super().convert_to_training_input(generator_output, uids)
        data.metadata[CREDIT_ROWS] = list(generator_output.get("env_metrics") or [])
        return data

    @torch.no_grad()
    def compute_advantages_and_returns(self, data: Any) -> Any:
        if not self.searchteam_credit:
            return super().compute_advantages_and_returns(data)
        response_mask = data["response_mask"]
        advantages, returns = credit_tensors(
            data.metadata["uids"],
            data.metadata["is_last_step"],
            data.metadata[CREDIT_ROWS],
            response_mask,
            data["values"] if self.cfg.trainer.critic.model.path is not None else None,
            self.credit_config,
        )
        data["advantages"], data["returns"] = advantages, returns
        self._log_credit(data, advantages)
        return data

    def _log_credit(self, data: Any, advantages: torch.Tensor) -> None:
        """The statistics SkyRL's own `compute_advantages_and_returns` logs, over the unpadded rows."""
        rows = len(data.metadata[CREDIT_ROWS])
        last = torch.tensor(data.metadata["is_last_step"][:rows], dtype=torch.bool)
        final_rewards = data["rewards"][:rows].sum(dim=-1)[last].mean().item()
        valid = torch.masked_select(advantages[:rows], data["response_mask"][:rows].bool())
        stats = {
            "avg_final_rewards": final_rewards,
            "avg_response_length": data.metadata["avg_response_length"],
            "avg_advantages": valid.mean().item(),
            "avg_advantages_abs": valid.abs().mean().item(),
        }
        data.metadata.setdefault("metrics", {}).update(stats)
        self.all_metrics.update(
            {
                "loss/avg_final_rewards": stats["avg_final_rewards"],
                "loss/avg_raw_advantages": stats["avg_advantages"],
                "loss/avg_raw_advantages_abs": stats["avg_advantages_abs"],
            }
        )


class SearchTeamExp(main_base.BasePPOExp):
    """SkyRL's experiment with searchteam's generator (the team of `run_config`, a recipe name or a YAML
    path, with `settings` applied) and trainer."""

    def __init__(self, cfg: Any, run_config: str, settings: dict[str, Any] | None = None) -> None:
        super().__init__(cfg)
        self.run_config = run_config
        self.settings = settings

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> SearchTeamGenerator:
        from skyrl.backends.skyrl_train.inference_servers.utils import resolve_policy_model_name

        return SearchTeamGenerator(
            self.run_config,
            inference_engine_client,
            tokenizer,
            policy_model_name=resolve_policy_model_name(cfg),
            settings=self.settings,
        )

    def get_trainer(self, cfg: Any, **parts: Any) -> Any:
        """SkyRL's trainer of the parts `BasePPOExp` builds (passed by keyword), with searchteam's credit."""
        return SearchTeamTrainer(cfg=cfg, credit_config=parts["generator"].env.config.train, **parts)
