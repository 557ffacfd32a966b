"""SkyRL's training entry point with a searchteam team as its generator and the papers' credit in its trainer,
step-wise (skyrl 0.3.0 with its skyrl-train extra: Ray, vLLM, flash-attn; GPUs). Never run at this size by
this project: scripts/check_integrations.sh runs the generator and the trainer's post-rollout code on a CPU.

    DATA=~/data/searchteam-jade
    searchteam export-questions --format skyrl --method jade --split train --out $DATA
    searchteam export-questions --format skyrl --method jade --split dev --limit 500 --out $DATA
    SEARCHTEAM_RUN_CONFIG=examples/teams/jade-qwen2.5-7b.yaml python examples/skyrl/main_searchteam.py \\
        data.train_data="['$DATA/train.parquet']" data.val_data="['$DATA/dev.parquet']" \\
        trainer.policy.model.path=Qwen/Qwen2.5-7B-Instruct \\
        trainer.algorithm.advantage_estimator=searchteam \\
        generator.step_wise_trajectories=true generator.n_samples_per_prompt=5

For a config whose credit uses GAE (M-ASK, DAC's searcher) also give SkyRL a critic:
trainer.critic.model.path=Qwen/Qwen2.5-7B-Instruct.
"""

# ruff: noqa: I001  (searchteam's module comes first: on Python 3.11 it makes SkyRL's modules importable)
import os
import sys

import ray

from searchteam.integrations.skyrl_trainer import SearchTeamExp
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray


@ray.remote(num_cpus=1)
def entrypoint(cfg: SkyRLTrainConfig, run_config: str) -> None:
    SearchTeamExp(cfg, run_config).run()


def main() -> None:
    cfg = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(
        entrypoint.remote(cfg, os.environ.get("SEARCHTEAM_RUN_CONFIG", "examples/teams/jade-qwen2.5-7b.yaml"))
    )


if __name__ == "__main__":
    main()
