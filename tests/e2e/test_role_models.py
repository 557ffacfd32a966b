"""A role on its own model (`role_models`), through the commands a user runs: eval, ask and serve run the
roles on two presets and record on each turn the model it ran on; a training step trains the policy's roles
and keeps the frozen role out of the update; what cannot work is refused in one line before any model
loads."""

from __future__ import annotations

import json
from collections import namedtuple
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchteam.cli import app
from tests.support.helpers import error_line

POLICY = "smollm2-135m"
READER = "qwen2.5-coder-0.5b"  # the static pipeline's generator (`ag`) on a second preset
ON_ITS_OWN = ("--method", "static_pipeline", "--model", POLICY, "--set", f"role_models.ag={READER}")
SMALL = ("--top-k", "1", "--dataset", "hotpotqa,nq", "--limit", "1")


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"searchteam {' '.join(args)} failed:\n{result.output}"
    return result.output


def test_eval_records_the_model_each_turn_ran_on(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    invoke("eval", *ON_ITS_OWN, *SMALL, "--split", "dev", "--out", str(out))
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    models = {(turn["role"], turn["model"]) for row in rows for turn in row["turns"]}
    assert models == {("qr", "policy"), ("ds", "policy"), ("ag", READER)}
    assert json.loads((out / "summary.json").read_text())["episode_errors"] == 0


def test_ask_runs_the_role_on_its_model() -> None:
    episode = json.loads(invoke("ask", "Which country is Lyon in?", *ON_ITS_OWN, "--top-k", "1", "--json"))
    assert {(t["role"], t["model"]) for t in episode["turns"]} == {
        ("qr", "policy"),
        ("ds", "policy"),
        ("ag", READER),
    }


def test_serve_answers_with_the_role_on_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    import searchteam.serve as serving
    from tests.support.helpers import serve_on_loopback

    replies: list[httpx.Response] = []

    def serve_one_request(service, **_: object) -> None:
        with serve_on_loopback(serving.create_app(service)) as url:
            chat = {"model": "static_pipeline", "messages": [{"role": "user", "content": "Where is Lyon?"}]}
            replies.append(httpx.post(f"{url}/chat/completions", json=chat, timeout=300))

    monkeypatch.setattr(serving, "serve", serve_one_request)
    invoke("serve", *ON_ITS_OWN, "--top-k", "1")
    (reply,) = replies
    assert reply.status_code == 200, reply.text
    turns = reply.json()["trace"]["turns"]
    assert {(t["role"], t["model"]) for t in turns} == {("qr", "policy"), ("ds", "policy"), ("ag", READER)}


def test_a_train_step_updates_the_policy_roles_and_not_the_frozen_one(tmp_path: Path) -> None:
    out = tmp_path / "train"
    invoke("train", *ON_ITS_OWN, "--top-k", "1", "--steps", "1", "--set", "questions_per_step=1",
           "--set", "group_size=2", "--set", "train.save_every=0", "--set", "train.dynamic_sampling=false",
           "--set", "train.gradient_checkpointing=false", "--out", str(out))  # fmt: skip
    (record,) = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert record["episodes"] == 2 and record["failed_episodes"] == 0 and record["updates"] >= 1
    assert record["samples/qr"] == record["samples/ds"] == 2 and "samples/ag" not in record
    assert record["samples"] == 4


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            ["--set", "train.roles=[qr, ag]"],
            f"error: role 'ag' runs on its own model ({READER}), which training keeps frozen: remove it from "
            f"train.roles, or from role_models to train it on {POLICY}",
        ),
        (
            ["--set", f"role_models.qr={READER}", "--set", f"role_models.ds={READER}"],
            "error: every role of static_pipeline runs on its own model (role_models), so nothing is left "
            f"to train: leave at least one role on {POLICY}",
        ),
    ],
    ids=["trained-role-on-another-model", "nothing-left-to-train"],
)
def test_training_refuses_what_cannot_train(settings: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, ["train", *ON_ITS_OWN, "--steps", "1", *settings])
    assert error_line(result) == expected


def test_engines_that_cannot_fit_the_machine_are_refused_before_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    memory = namedtuple("memory", "total")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(4 << 30))  # a 4 GiB machine
    args = ["eval", *ON_ITS_OWN, "--set", "role_models.qr=qwen2.5-coder-1.5b", *SMALL]
    line = error_line(CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r")]))
    assert line == (
        "error: the run's engines need about 8.0 GiB (smollm2-135m on ov 1.1 GiB + qwen2.5-coder-0.5b on ov "
        "1.5 GiB + qwen2.5-coder-1.5b on ov 2.4 GiB + 3 GiB for the rest) and this machine has 4.0 GiB: "
        "run a role on a smaller model, use ov_precision: int8, or serve a model (backend: openai)"
    )
