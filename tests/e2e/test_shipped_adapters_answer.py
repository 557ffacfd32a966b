"""Each shipped adapter, run by name as a user runs it (`searchteam eval --model NAME`), answers fixed
questions of benchmark v1 greedily with its card's run settings, and its answers equal the recorded ones: a
change that moves an adapter's answers (a prompt, a parser, the runtime, the engine, v1's questions or
corpus) shows here.

After a deliberate change, record the new answers (and say why in the commit):

    SEARCHTEAM_RECORD_ADAPTERS=1 python -m pytest tests/e2e/test_shipped_adapters_answer.py
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from searchteam.cli import app
from searchteam.llm.models import PRESETS, TRAINED
from searchteam.methods import METHODS  # noqa: F401  (registers the shipped adapters)

RECORDED = Path(__file__).resolve().parents[1] / "support" / "data" / "adapter_answers.json"
# the answers were recorded on benchmark v1, which the adapters were trained on: v1 reruns them exactly
QUESTIONS = ["--benchmark", "v1", "--dataset", "hotpotqa,2wikimultihopqa", "--split", "dev", "--limit", "1"]
RECORD = os.environ.get("SEARCHTEAM_RECORD_ADAPTERS") == "1"


def installed(preset: str) -> bool:
    return all(importlib.util.find_spec(package) for package in PRESETS[preset].packages)


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_shipped_adapter_answers_as_recorded_with_its_run_settings(name: str, tmp_path: Path) -> None:
    trained = TRAINED[name]
    for model in [trained.base, *trained.run_settings.get("role_models", {}).values()]:
        if not installed(model):
            pytest.skip(f"{model}, which {name} runs with, is not installed: {PRESETS[model].install}")
    out = tmp_path / "eval"
    method = trained.team or trained.method  # a composed team's part runs in its team
    args = ["eval", "--method", method, "--model", name, *QUESTIONS, "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["temperature"] == 0.0  # greedy
    for key, value in trained.run_settings.items():
        assert config[key] == value if not isinstance(value, dict) else value.items() <= config[key].items()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and not any(row["error"] for row in rows)
    answers = {row["id"]: row["prediction"] for row in rows}

    recorded = json.loads(RECORDED.read_text()) if RECORDED.exists() else {}
    if RECORD:
        recorded[name] = answers
        RECORDED.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    assert answers == recorded.get(name), f"{name}'s answers moved; if that was meant, record them again"
