"""verl's v1 sync trainer with the papers' credit assignment: each row of searchteam's agent loop (one per
trained turn) gets the advantage searchteam's own estimators give it (`integrations.credit`: turn-level GAE
for M-ASK and DAC's searcher, GRPO over trajectories with DAC's hard-positive sub-groups, DECOR's per-role
GRPO), as `searchteam train` computes it, instead of verl's one advantage per episode.

Run it as verl's entry point, with the trainer named (registered as `searchteam`):

    python3 -m searchteam.integrations.verl_trainer trainer.use_v1=True trainer.v1.trainer_mode=searchteam \
        algorithm.adv_estimator=grpo ...  # the rest as for verl.trainer.main_ppo (examples/verl/train.sh)

The estimators and their options come from the searchteam run config the agent loop config names; verl's
`algorithm.adv_estimator` must be `grpo`, or `gae`, which also makes verl build its critic (GAE roles read
its value of each turn's prompt). Everything else (rollout correction, KL loss, the update) is verl's sync
trainer's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from searchteam.errors import ConfigError
from searchteam.extras import require
from searchteam.integrations.credit import CreditRow, prompt_values, token_credit
from searchteam.integrations.environment import load_train_config
from searchteam.integrations.questions import AGENT_NAME
from searchteam.integrations.verl import SEARCHTEAM_TRAINER
from searchteam.rl.config import TrainConfig

v1 = require("verl.trainer.ppo.v1", "verl", "the searchteam verl trainer")
main_ppo = require("verl.trainer.main_ppo", "verl", "the searchteam verl trainer")
ray = require("ray", "verl", "the searchteam verl trainer")

VERL_ESTIMATORS = ("grpo", "gae")  # what verl computes first, for its own bookkeeping; then replaced


def credit_tensors(
    keys: Sequence[str],
    fields: Sequence[dict[str, Any]],
    response_mask: torch.Tensor,
    values: torch.Tensor | None,
    config: TrainConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level advantages and returns (shaped like the padded `response_mask`) of verl's rows: the row
    keyed `{uid}_{session}_{index}` belongs to rollout `{uid}_{session}` of question `uid`; its extra
    `fields` are `environment.credit_fields`; `values` (the critic's, per response token) give each turn
    the value of its prompt, read at its first response token."""
    rows = []
    for key, row_fields, value in zip(keys, fields, prompt_values(values, response_mask), strict=True):
        uid, session, _ = key.rsplit("_", 2)
        rows.append(CreditRow.of(uid, f"{uid}_{session}", row_fields, value))
    return token_credit(rows, config, response_mask)


def searchteam_train_config(config: Any) -> TrainConfig:
    """The `train` section of the searchteam run config that the agent loop config names."""
    from omegaconf import OmegaConf

    path = config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_config_path")
    entries = OmegaConf.to_container(OmegaConf.load(Path(path))) if path else []
    entry = next((e for e in entries if e.get("name") == AGENT_NAME), None)
    if entry is None:
        raise ConfigError(
            f"trainer.v1.trainer_mode={SEARCHTEAM_TRAINER} needs searchteam's agent loop: name an agent loop "
            f"config with a '{AGENT_NAME}' entry in actor_rollout_ref.rollout.agent.agent_loop_config_path"
        )
    return load_train_config(entry["run_config"], entry.get("settings")).train


@v1.register_trainer(SEARCHTEAM_TRAINER)
class SearchTeamTrainer(v1.PPOTrainerSync):
    """verl's sync trainer whose advantages are searchteam's (see the module's docstring)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.credit_config = searchteam_train_config(config)
        refuse_unservable(config, self.credit_config, self.use_critic)

    def _build_replay_buffer(self) -> Any:
        self.trainer_mode = "sync"  # verl's sync trainer in all but the advantages
        return super()._build_replay_buffer()

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        import transfer_queue as tq
        from tensordict import TensorDict
        from verl.workers.utils.padding import response_to_nested

        batch = super()._compute_advantage(batch, metrics)  # KL metrics, rollout correction: verl's own
        fields = ["response_mask", "extra_fields", *(["values"] if self.use_critic else [])]
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]
        extra = data["extra_fields"]  # a NonTensorStack (or a list of the rows' dicts)
        extra = extra.tolist() if hasattr(extra, "tolist") else list(extra)
        padded = data.select(*[f for f in fields if f != "extra_fields"]).to_padded_tensor()
        advantages, returns = credit_tensors(
            batch.keys, extra, padded["response_mask"], padded.get("values", None), self.credit_config
        )
        output = {
            "advantages": response_to_nested(advantages, nested_mask),
            "returns": response_to_nested(returns, nested_mask),
        }
        return tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict(output, batch_size=len(batch)),
        )


def refuse_unservable(config: Any, credit: TrainConfig, verl_critic: bool) -> None:
    """One line for a verl setting with which searchteam's credit cannot be computed as configured."""
    estimator = config.algorithm.adv_estimator
    if estimator not in VERL_ESTIMATORS:
        raise ConfigError(
            f"algorithm.adv_estimator={estimator}: with trainer.v1.trainer_mode={SEARCHTEAM_TRAINER} the "
            "searchteam run config's estimators assign credit; set algorithm.adv_estimator=grpo, or gae for "
            "a run whose config uses GAE (it makes verl build the critic)"
        )
    if config.algorithm.get("use_kl_in_reward"):
        raise ConfigError(
            "algorithm.use_kl_in_reward: searchteam's estimators read the method's rewards, not a KL-shaped "
            "reward; use actor_rollout_ref.actor.use_kl_loss=True for the KL term"
        )
    if credit.uses_critic and not verl_critic:
        raise ConfigError(
            "the searchteam run config estimates some role with GAE, which needs verl's critic: set "
            "algorithm.adv_estimator=gae (or critic.enable=True)"
        )


@ray.remote
class SearchTeamTaskRunner(main_ppo.TaskRunnerV1.__ray_actor_class__):
    """verl's v1 task runner, in whose process searchteam's trainer is registered before it is looked up."""

    def run(self, config: Any) -> None:
        import searchteam.integrations.verl_trainer  # noqa: F401  (registers the trainer in this process)

        super().run(config)


def main(config: Any) -> None:
    """verl's `main_ppo.main`, with the task runner that knows searchteam's trainer."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    if not config.trainer.get("use_v1", False):
        raise ConfigError("searchteam's verl trainer is a v1 trainer: set trainer.use_v1=True")
    auto_set_device(config)
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    main_ppo.run_ppo(config, task_runner_class=SearchTeamTaskRunner)


if __name__ == "__main__":
    import hydra

    config_dir = str(Path(main_ppo.__file__).parent / "config")
    hydra.main(config_path=config_dir, config_name="ppo_trainer", version_base=None)(main)()
