"""The shipped composed teams (`examples/teams/composed/`) through the commands a user runs, with the 135M
model on two questions: eval and one train step of a gatherer for each, serve for one, by file path and by
name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from searchteam.cli import app
from searchteam.methods.composed import REPOSITORY_TEAMS

EXAMPLES = sorted(REPOSITORY_TEAMS.glob("*.yaml"))
# short replies (the QAgent example gives its agent 256 tokens); every example's gatherer is an `agent`
MODEL = ("--model", "smollm2-135m", "--max-new-tokens", "24", "--set", "max_new_tokens_per_role.agent=24")
READERS = {"qagent-search+dac-generator": "generator"}  # the others read with naive RAG's `answer`
QUESTIONS = ("--dataset", "hotpotqa", "--split", "dev", "--limit", "2")


def invoke(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"searchteam {' '.join(args)} failed:\n{result.output}"
    return result.output


def on_the_135m(example: Path) -> tuple[str, ...]:
    """Settings that run every role of `example` on the 135M model: the trained reader the Search-R1 example
    names is a 0.5B adapter."""
    from searchteam.methods import get_method

    roles = get_method(str(example)).run_settings["role_models"]
    return (*MODEL, *(arg for role in roles for arg in ("--set", f"role_models.{role}=smollm2-135m")))


def roles_of(example: Path) -> set[str]:
    from searchteam.methods import get_method

    return set(get_method(str(example)).team.roles)


def test_the_examples_ship_and_are_listed():
    assert [p.stem for p in EXAMPLES] == [
        "qagent-search+dac-generator",
        "search_r1+naive_rag-reader",
        "search_r1-from-top5",
        "top5+search_r1-new",
    ]
    listing = invoke("methods", "--json")
    assert {p.stem for p in EXAMPLES} <= {row["method"] for row in json.loads(listing)}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_eval_runs_a_composed_team(tmp_path: Path, example: Path) -> None:
    out = tmp_path / "eval"
    invoke("eval", "--method", example.stem, *on_the_135m(example), *QUESTIONS, "--out", str(out))
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["error"] is None for row in rows)
    assert {t["role"] for row in rows for t in row["turns"]} <= roles_of(example)
    merged = [row["states"][-1]["evidence"] for row in rows]  # the composed record closes each trace
    assert all(len(ids) <= 10 for ids in merged)


def test_serve_answers_with_a_composed_team(monkeypatch: pytest.MonkeyPatch) -> None:
    """One example: serving goes through the same team as eval, named by the file's stem."""
    import httpx

    import searchteam.serve as serving
    from tests.support.helpers import serve_on_loopback

    example = REPOSITORY_TEAMS / "qagent-search+dac-generator.yaml"  # a reader other than naive RAG's
    replies: list[httpx.Response] = []

    def serve_one_request(service, **_: object) -> None:
        with serve_on_loopback(serving.create_app(service)) as url:
            chat = {"model": example.stem, "messages": [{"role": "user", "content": "Where is Lyon?"}]}
            replies.append(httpx.post(f"{url}/chat/completions", json=chat, timeout=300))

    monkeypatch.setattr(serving, "serve", serve_one_request)
    invoke("serve", "--method", str(example), *on_the_135m(example))
    (reply,) = replies
    assert reply.status_code == 200, reply.text
    assert {t["role"] for t in reply.json()["trace"]["turns"]} <= roles_of(example)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_a_train_step_trains_the_gatherer_and_not_the_reader(tmp_path: Path, example: Path) -> None:
    out = tmp_path / "train"
    invoke("train", "--method", str(example), *on_the_135m(example), "--dataset", "hotpotqa", "--limit", "1",
           "--steps", "1", "--set", "questions_per_step=1", "--set", "group_size=2",
           "--set", "reward.train=gatherers", "--set", "train.save_every=0",
           "--set", "train.dynamic_sampling=false", "--set", "train.gradient_checkpointing=false",
           "--out", str(out))  # fmt: skip
    (record,) = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert record["episodes"] == 2 and record["failed_episodes"] == 0
    reader = READERS.get(example.stem, "answer")
    assert record["samples/agent"] >= 2 and f"samples/{reader}" not in record


@pytest.mark.parametrize("team", ["top5+search_r1-new", "search_r1-from-top5"])
def test_the_gatherer_recipes_plan_on_unsampled_train_lines(team: str) -> None:
    from searchteam.train.config import load_train_run_config, plan_training, training_questions

    recipe = REPOSITORY_TEAMS / "recipes" / f"{team}-gatherer-qwen0.5b-cpu.yaml"
    cfg = load_train_run_config(recipe, {})
    plan = plan_training(cfg)  # everything that can fail before a model loads
    assert plan.team.name == team and cfg.role_models == {"answer": "qwen2.5-coder-0.5b-naive_rag"}
    questions = training_questions(cfg)
    assert len(questions) == 454 and {q.dataset for q in questions} == {"hotpotqa", "2wikimultihopqa"}
    hinted = plan.warm[1].privileged_options() if plan.warm else []
    assert hinted == (["search_r1.bridge_hint"] if team == "search_r1-from-top5" else [])
