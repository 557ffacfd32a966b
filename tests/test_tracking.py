"""Experiment tracking through accelerate's trackers, offline with TensorBoard: `report_to` validation, a
named tracker that is missing, the trainer's RL and warm-start records and eval's summary read back from
the event files."""

from __future__ import annotations

import importlib.util
import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from searchteam import tracking
from searchteam.config import RunConfig, load_config
from searchteam.errors import ConfigError
from searchteam.eval.runner import evaluate
from searchteam.factory import Components
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.rl.policy import build_policy
from searchteam.rl.trainer import Trainer
from searchteam.tracking import TrackingSetup
from tests.rl.test_trainer import config, random_reward, scripted_rollout, tiny_model, tokenizer  # noqa: F401
from tests.rl.test_warm_start import scripted_stage
from tests.support.helpers import PASSAGES, TinyRetriever

needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None,
    reason="tensorboard is not installed (pip install tensorboard)",
)


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under `folder`, by tag: (step, value) pairs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for events in sorted(folder.rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            found[tag] += [(e.step, e.value) for e in accumulator.Scalars(tag)]
    return dict(found)


def test_report_to_takes_a_comma_list_and_refuses_all_unknown_and_none_with_others():
    assert load_config(None, {"report_to": "TensorBoard, wandb"}).report_to == ["tensorboard", "wandb"]
    assert RunConfig(report_to=["none"]).report_to == ["none"] and RunConfig().report_to is None
    with pytest.raises(ConfigError, match="'all' is not allowed"):
        load_config(None, {"report_to": "all"})
    with pytest.raises(ConfigError, match=r"unknown tracker\(s\) \['tensorbored'\]"):
        load_config(None, {"report_to": "tensorbored"})
    with pytest.raises(ConfigError, match="'none' cannot be combined"):
        load_config(None, {"report_to": "none,tensorboard"})


def test_a_named_tracker_that_is_not_installed_is_a_clear_error():
    if tracking.is_installed("wandb"):
        pytest.skip("wandb is installed here")
    with pytest.raises(ConfigError, match="report_to names wandb, which is not installed: pip install wandb"):
        tracking.check_installed(["wandb"])
    tracking.check_installed([])


def test_trackers_default_to_tensorboard_for_training_and_none_turns_it_off():
    assert tracking.trackers_for(None, ["tensorboard"]) == ["tensorboard"]
    assert tracking.trackers_for(["none"], ["tensorboard"]) == []
    assert tracking.trackers_for(["mlflow"], ["tensorboard"]) == ["mlflow"]
    assert tracking.trackers_for(None) == []


def test_scalars_and_flat_config_keep_what_trackers_take():
    record = {"step": 3, "loss": 0.5, "nan": float("nan"), "name": "x", "per": {"nq": {"em": 1}}}
    assert tracking.scalars(record, "p/", skip=("step",)) == {"p/loss": 0.5, "p/per/nq/em": 1.0}
    flat = tracking.flat_config({"a": None, "b": [1, 2], "c": {"d": True}, "e": Path("x")})
    assert flat == {"b": "[1, 2]", "c/d": True, "e": '"x"'}


@needs_tensorboard
def test_trainer_sends_rl_steps_and_warm_start_rounds_to_tensorboard(tokenizer, tmp_path: Path):  # noqa: F811
    torch.set_num_threads(1)
    cfg = config()
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    stage = scripted_stage(tokenizer, 1, [])
    setup = TrackingSetup()  # report_to unset: training's default tracker, under RUN/tensorboard
    rollout = scripted_rollout(tokenizer)
    trainer = Trainer(policy, rollout, random_reward, cfg, tmp_path, warm_start=stage, tracking_setup=setup)
    records = trainer.train()

    scalars = read_scalars(tmp_path / "tensorboard")
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [r["step"] for r in records] == [1, 2]
    for key in ("loss", "reward/mean", "grad_norm", "format_error_rate/plan", "time/rollout"):
        assert scalars[key] == [(r["step"], pytest.approx(r[key], rel=1e-5)) for r in log]
    assert "step" not in scalars
    warm = json.loads((tmp_path / "warm_start" / "log.jsonl").read_text())
    assert scalars["warm_start/kept"] == [(1, warm["kept"])]
    assert scalars["warm_start/sft_loss"] == [(1, pytest.approx(warm["sft_loss"], rel=1e-5))]
    assert "warm_start/round" not in scalars
    assert trainer.accelerator.trackers == []  # closed at the end of train()


def test_report_to_none_starts_no_tracker(tokenizer, tmp_path: Path):  # noqa: F811
    cfg = config()
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    setup = TrackingSetup(report_to=["none"])
    trainer = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path, tracking_setup=setup)
    assert trainer.accelerator.log_with == []


def eval_parts() -> Components:
    llm = ScriptedLLM(lambda req: "<answer>Frankie Valli</answer>")
    return Components(team=get_team("naive_rag"), llms={"policy": llm}, retriever=TinyRetriever(PASSAGES))


@needs_tensorboard
def test_eval_reports_its_summary_once_when_report_to_is_set(tmp_path: Path):
    cfg = RunConfig(method="naive_rag", split="smoke", datasets=["nq", "hotpotqa"], limit=2, out=tmp_path)
    summary = evaluate(cfg.model_copy(update={"report_to": ["tensorboard"]}), eval_parts(), progress=False)
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["em"] == [(0, pytest.approx(summary["em"]))]
    assert scalars["per_dataset/nq/f1"] == [(0, pytest.approx(summary["per_dataset"]["nq"]["f1"]))]
    assert scalars["recall@1"] == [(0, pytest.approx(summary["recall@1"]))]
    assert scalars["seconds_total"] == [(0, pytest.approx(summary["seconds_total"]))]

    quiet = tmp_path / "quiet"
    evaluate(cfg.model_copy(update={"out": quiet}), eval_parts(), progress=False)
    assert not (quiet / "tensorboard").exists()  # eval reports nowhere unless asked
