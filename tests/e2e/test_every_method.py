"""Every registered method end to end, through the commands a user runs: `searchteam eval` on two questions,
one `searchteam train` step of its smallest recipe, and one `/v1/chat/completions` request to
`searchteam serve`, on the 135M preset with the real retriever and benchmark. A method added as a folder is
covered here without an edit. Each test fails when the team's code raises on every episode (a bug such as
a method that replaces `Team.solve`): eval and train stop on the repeated bug, the server answers 500."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from searchteam.cli import app
from searchteam.methods import METHODS, get_method

MODEL = "smollm2-135m"
EVAL_DATASETS = "hotpotqa,nq"  # a multi-hop and a single-hop question
# One search round of the top passage keeps each command to seconds on two cores; every role still runs.
SMALL = ("--max-turns", "1", "--top-k", "1")
# One step that updates whatever the rewards: no group is dropped for equal rewards, and no checkpointing
# of activations, which a 135M model on two episodes does not need.
ONE_UPDATE = ("--set", "train.dynamic_sampling=false", "--set", "train.gradient_checkpointing=false")


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"searchteam {' '.join(args)} failed:\n{result.output}"
    return result.output


def smallest_recipe(method: str) -> list[str]:
    """`--config` of the method's recipe on the 135M preset, else nothing (the generic defaults)."""
    recipes = get_method(method).folder / "recipes"
    small = [p for p in sorted(recipes.glob("*.yaml")) if yaml.safe_load(p.read_text()).get("model") == MODEL]
    return ["--config", str(small[0])] if small else []


@pytest.mark.parametrize("method", list(METHODS))
def test_eval_answers_two_questions_without_an_episode_error(method: str, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    invoke("eval", "--method", method, "--model", MODEL, *SMALL, "--dataset", EVAL_DATASETS,
           "--split", "dev", "--limit", "1", "--out", str(out))  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["episode_errors"] == 0, summary.get("episode_errors_by_kind")
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    roles = {turn["role"] for row in rows for turn in row["turns"]}
    assert all(row["llm_calls"] >= 1 for row in rows) and roles <= set(METHODS[method].roles)


@pytest.mark.parametrize("method", list(METHODS))
def test_train_runs_one_step_of_its_smallest_recipe(method: str, tmp_path: Path) -> None:
    out = tmp_path / "train"
    invoke("train", "--method", method, *smallest_recipe(method), "--model", MODEL, *SMALL, "--steps", "1",
           "--set", "questions_per_step=1", "--set", "group_size=2", "--set", "train.save_every=0",
           *ONE_UPDATE, "--out", str(out))  # fmt: skip
    (record,) = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert record["step"] == 1 and record["episodes"] == 2 and record["failed_episodes"] == 0
    assert record["samples"] > 0 and record["updates"] >= 1


@pytest.mark.parametrize("method", list(METHODS))
def test_serve_answers_a_chat_completion(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`searchteam serve` builds the service as a user's call does; the server runs on a loopback port
    here, for one request, instead of until interrupted."""
    import searchteam.serve as serving
    from tests.support.helpers import serve_on_loopback

    replies: list[httpx.Response] = []

    def serve_one_request(service, **_: object) -> None:
        with serve_on_loopback(serving.create_app(service)) as url:
            question = "Which country is the city of Lyon in?"
            chat = {"model": method, "messages": [{"role": "user", "content": question}]}
            replies.append(httpx.post(f"{url}/chat/completions", json=chat, timeout=300))

    monkeypatch.setattr(serving, "serve", serve_one_request)
    invoke("serve", "--method", method, "--model", MODEL, *SMALL)
    (reply,) = replies
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == method and isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["completion_tokens"] > 0 and body["trace"]["turns"]
