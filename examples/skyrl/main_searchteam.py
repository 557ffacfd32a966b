"""SkyRL's training entry point with a searchteam team as its generator, step-wise (skyrl 0.3.0 with its
skyrl-train extra: Ray, vLLM, flash-attn; GPUs). Never run by this project: scripts/check_integrations.sh
checks the generator itself against SkyRL's validator on a CPU.

    DATA=~/data/searchteam-jade
    searchteam export-questions --format skyrl --method jade --split train --out $DATA
    searchteam export-questions --format skyrl --method jade --split dev --limit 500 --out $DATA
    SEARCHTEAM_RUN_CONFIG=examples/teams/jade-qwen2.5-7b.yaml python examples/skyrl/main_searchteam.py \\
        data.train_data="['$DATA/train.parquet']" data.val_data="['$DATA/dev.parquet']" \\
        trainer.policy.model.path=Qwen/Qwen2.5-7B-Instruct \\
        trainer.algorithm.advantage_estimator=grpo \\
        generator.step_wise_trajectories=true generator.n_samples_per_prompt=5
"""

# ruff: noqa: I001  (searchteam's module comes first: on Python 3.11 it makes SkyRL's generator importable)
import os
import sys

import ray

from searchteam.integrations.skyrl import SearchTeamGenerator
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.utils import validate_cfg
from skyrl.train.utils.utils import initialize_ray


class SearchTeamExp(BasePPOExp):
    def __init__(self, cfg: SkyRLTrainConfig, run_config: str) -> None:
        super().__init__(cfg)
        self.run_config = run_config

    def get_generator(self, cfg, tokenizer, inference_engine_client):
        return SearchTeamGenerator(self.run_config, inference_engine_client, tokenizer)


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
