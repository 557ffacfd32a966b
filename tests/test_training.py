"""Training glue: shipped configs validate, deterministic per-step question batches, and two real steps."""

from pathlib import Path

import pytest

from searchteam.config import SHIPPED_CONFIGS
from searchteam.rewards.schemes import reward_methods
from searchteam.training import load_train_run_config, questions_for_step


@pytest.mark.parametrize("path", sorted(SHIPPED_CONFIGS.glob("train-*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_training_config_validates(path: Path):
    cfg = load_train_run_config(Path(path.stem), {})
    assert cfg.method in reward_methods() and cfg.train.steps >= 1


def test_questions_for_step_is_a_function_of_seed_and_step():
    qs = list(range(10))
    assert questions_for_step(qs, 3, 2, seed=1) == questions_for_step(qs, 3, 2, seed=1)
    epoch = [q for step in range(5) for q in questions_for_step(qs, step, 2, seed=1)]
    assert sorted(epoch) == qs


def test_two_training_steps_with_the_real_default_model(tmp_path):
    """`searchteam train` end to end on the embedded model, retriever and train split: two GRPO steps of
    the Search-R1 agent (short generations so CI stays fast), a log line per step and a loadable
    checkpoint holding the LoRA adapter."""
    import json

    import yaml
    from typer.testing import CliRunner

    from searchteam.cli import app
    from searchteam.llm import build_llm
    from searchteam.llm.base import GenerationRequest, SamplingParams

    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "method": "search_r1",
                "max_turns": 1,
                "top_k": 1,
                "max_new_tokens": 24,
                "group_size": 2,
                "questions_per_step": 1,
                "limit": 8,
                "train": {"estimator": "grpo", "micro_batch_size": 4, "gradient_checkpointing": True},
            }
        )
    )
    run = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["train", "--config", str(config), "--steps", "2", "--out", str(run), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["episodes"] == 2 and r["samples/agent"] >= 2 and r["skipped_updates"] == 0
        assert r["time/rollout"] > 0 and r["time/update"] > 0
    checkpoint = run / "checkpoints" / "step-000002"
    assert (checkpoint / "policy" / "adapters" / "policy").is_dir()
    trained = build_llm(str(checkpoint), device="cpu")
    request = GenerationRequest([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=4))
    assert trained.generate([request])[0].completion_tokens > 0
