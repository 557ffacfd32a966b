"""Every shipped training recipe loads, builds its team, names a backend that exists and samples rollouts
from the distribution the trainer scores; the GPU recipes state the memory they need and fit one card."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from searchteam.config import RunConfig
from searchteam.factory import build_team
from searchteam.methods import shipped_recipes
from searchteam.train.config import load_train_run_config
from searchteam.train.memory_estimate import QWEN25, estimate_memory

RECIPES = [path for path, _ in shipped_recipes().values()]
GPU_RECIPES = [p for p in RECIPES if p.stem.endswith("-gpu")]
GPU_NAMES = [name for name in shipped_recipes() if name.endswith("-gpu")]
BACKENDS = get_args(RunConfig.model_fields["backend"].annotation)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_recipe_loads_with_a_backend_and_the_trained_sampling(path: Path):
    cfg = load_train_run_config(path, {})
    build_team(cfg)  # method, roles, options all known
    assert cfg.backend in BACKENDS and cfg.judge_backend in BACKENDS
    if cfg.backend == "openai":
        assert cfg.base_url, "an openai backend needs the server's base_url"
    # rollouts sample the untruncated softmax at the temperature the trainer scores
    assert cfg.temperature > 0
    assert cfg.top_p == 1.0


def test_gpu_recipes_exist():
    assert set(GPU_NAMES) >= {"mask/qwen7b-gpu", "search_r1/qwen3b-gpu"}


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_gpu_recipe_states_a_memory_that_fits_one_card(path: Path):
    """The header's `memory per process: N GiB` is the estimate for the recipe's model and settings at the
    micro-batch length it states, and fits an 80 GB card."""
    text = path.read_text()
    found = re.search(
        r"memory per process: ≈ ?([\d.]+) GiB .*?micro-batch of (\d+) tokens", text, re.S | re.I
    )
    assert found, "a GPU recipe's header states its memory per process"
    stated, tokens = float(found[1]), int(found[2])
    cfg = load_train_run_config(path, {})
    assert not cfg.train.full_ft and cfg.dtype == "bfloat16"
    shape = next(s for name, s in QWEN25.items() if name in cfg.model)
    rollout = re.search(r"hf rollouts of (\d+) tokens", text)
    est = estimate_memory(
        shape,
        tokens=tokens,
        lora_r=cfg.train.lora_r,
        lora_targets=cfg.train.lora_targets,
        critic=cfg.train.critic if cfg.train.uses_critic else "none",
        kl=cfg.train.kl_coef > 0,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
        rollout_tokens=int(rollout[1]) if rollout else 0,
    )
    assert est.gib()["total"] == pytest.approx(stated, abs=0.05)
    assert stated < 70  # an 80 GB card, with room for the CUDA context and fragmentation


def test_reading_a_training_config_does_not_load_torch():
    code = "import sys, searchteam.train.config, searchteam.rl.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
