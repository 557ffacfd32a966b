"""Kill tests: a process killed with SIGKILL part-way through `searchteam eval`, through RL training, or
through a cache build, and a rerun that ends where an uninterrupted run ends.

The model is never the point here: eval talks to a fake OpenAI-compatible server (deterministic replies, a
delay per call so the kill lands mid-run); training runs a tiny Llama on scripted rollouts; cache builds use
the fake converters of tests/test_caches.py."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from typer.testing import CliRunner

from searchteam.cache import MISSING, require_files
from searchteam.cli import app
from tests.support.helpers import serve_on_loopback
from tests.test_caches import (
    hidden_leftovers,
    write_corpus,
    write_fake_checkpoint,
    write_fake_ir,
)

REPO = Path(__file__).resolve().parents[2]
N_QUESTIONS = 20
TIMING_KEYS = {"seconds", "seconds_total"}


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    """Poll until `condition()`, failing if the process ends first or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the process ended (rc {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def sigkill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: no handler, no cleanup, no flush
    proc.wait(30)
    assert proc.returncode == -9


def complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


# --- searchteam eval -------------------------------------------------------------------------------------


@pytest.fixture
def chat_server() -> Iterator[tuple[str, dict[str, Any]]]:
    """A fake OpenAI-compatible server: answer N for question N unless N is a multiple of 3, after `delay`.
    Calls are served one at a time, so a client that sends several at once still gets one reply per delay."""
    fastapi_app = FastAPI()
    state: dict[str, Any] = {"delay": 0.0, "calls": 0}
    one_at_a_time = asyncio.Lock()

    @fastapi_app.post("/v1/chat/completions")
    async def complete(request: Request) -> dict[str, Any]:
        body = await request.json()
        state["calls"] += 1
        async with one_at_a_time:
            await asyncio.sleep(state["delay"])
        asked = " ".join(m["content"] for m in body["messages"] if m["role"] == "user")
        n = int(re.findall(r"answer number (\d+)", asked)[-1])
        reply = f"answer {n}</answer>" if n % 3 else "no idea</answer>"
        return {
            "choices": [{"message": {"content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10 + n, "completion_tokens": 3},
        }

    with serve_on_loopback(fastapi_app) as url:
        yield url, state


def eval_args(url: str, questions: Path, out: Path) -> list[str]:
    return [
        "eval",
        "--method",
        "direct",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--model",
        "fake-chat",
        "--questions",
        str(questions),
        "--out",
        str(out),
        "--batch-size",
        "1",
    ]


def write_questions(path: Path) -> Path:
    rows = [
        {"id": f"k{i:02d}", "question": f"What is answer number {i}?", "golden_answers": [f"answer {i}"]}
        for i in range(N_QUESTIONS)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def result_rows(out: Path) -> dict[str, dict[str, Any]]:
    """results.jsonl by id, checking that every line is whole and no id repeats."""
    text = (out / "results.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n"), "torn last line"
    rows = [json.loads(line) for line in text.splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    return {r["id"]: without_timings(r) for r in rows}


def test_eval_killed_mid_run_resumes_to_the_uninterrupted_results(
    chat_server: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, server = chat_server
    questions = write_questions(tmp_path / "questions.jsonl")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    result = CliRunner().invoke(app, eval_args(url, questions, straight))
    assert result.exit_code == 0, result.output

    server["delay"] = 0.1  # one question per 0.1 s: the kill lands with some, not all, rows written
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchteam.cli", *eval_args(url, questions, killed)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "killed.err").open("w"),
    )
    results = killed / "results.jsonl"
    wait_for(lambda: complete_lines(results) >= 3, proc, "three result lines")
    sigkill(proc)
    assert 3 <= complete_lines(results) < N_QUESTIONS
    # a kill can land in the middle of a write: leave the last line torn, as such a kill would
    lines = results.read_bytes().splitlines(keepends=True)
    results.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    kept = len(lines) - 1

    server["delay"], server["calls"] = 0.0, 0
    resumed = CliRunner().invoke(app, [*eval_args(url, questions, killed), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert server["calls"] == N_QUESTIONS - kept  # finished questions are not asked again
    want, got = result_rows(straight), result_rows(killed)
    assert sorted(got) == sorted(want) == [f"k{i:02d}" for i in range(N_QUESTIONS)]
    assert got == want
    summaries = [json.loads((d / "summary.json").read_text()) for d in (straight, killed)]
    assert without_timings(summaries[0]) == without_timings(summaries[1])


# --- RL training -----------------------------------------------------------------------------------------

COMPLETIONS = {"plan": "<plan>find the city</plan>", "answer": "<answer>Paris</answer>"}


def tiny_trainer(run_dir: Path, block_at_step: int | None = None):
    """A tiny randomly initialised Llama (the real SmolLM2 tokenizer) with PPO + critic, a cosine schedule
    and rewards from python's RNG, on scripted rollouts; the rollout of `block_at_step` (0-based) hangs."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from searchteam.llm.models import resolve_model
    from searchteam.rl.config import TrainConfig
    from searchteam.rl.policy import build_policy
    from searchteam.rl.trainer import Trainer
    from searchteam.types import Episode, Question, Turn

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    cfg = TrainConfig(
        steps=4,
        save_every=2,
        estimator="gae",
        gamma=0.9,
        lam=0.95,
        warmup_steps=1,
        schedule="cosine",
        ppo_epochs=2,
        lr=5e-2,
        micro_batch_size=2,
        mini_batch_size=4,
        lora_r=4,
        lora_alpha=8,
        lora_targets=["q_proj", "v_proj"],
    )
    torch.manual_seed(0)
    tiny = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
    )
    random.seed(123)
    policy = build_policy(tiny, tokenizer, cfg)

    def turn(role: str, step: int, text: str, qid: str) -> Turn:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        messages = [{"role": "user", "content": f"{role}: capital of France? ({qid})"}]
        return Turn(role=role, step=step, messages=messages, completion=text, completion_token_ids=ids)

    def rollout(step: int) -> list[Episode]:
        if step == block_at_step:
            time.sleep(600)
        return [
            Episode(
                question=Question(id=f"q{step % 3}-{j}", question="capital of France?"),
                method="scripted",
                turns=[
                    turn(role, i, text, f"q{step % 3}-{j}")
                    for i, (role, text) in enumerate(COMPLETIONS.items())
                ],
            )
            for j in range(2)
            for _ in range(2)
        ]

    def reward(episodes: list[Episode]) -> None:
        for episode in episodes:
            for t in episode.turns:
                t.reward = round(random.random(), 3)

    return Trainer(policy, rollout, reward, cfg, run_dir)


def train_until_blocked(run_dir: str) -> None:
    """The killed process: trains steps 1-3 (checkpoint at 2) and hangs in the rollout of step 4."""
    tiny_trainer(Path(run_dir), block_at_step=3).train()


def test_training_killed_after_a_checkpoint_resumes_exactly(tmp_path: Path) -> None:
    import torch

    from searchteam.rl.checkpoints import list_checkpoints

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from tests.e2e.test_kill_resume import train_until_blocked as t; t({str(killed)!r})",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "train.err").open("w"),
    )
    log = killed / "train_log.jsonl"
    wait_for(lambda: complete_lines(log) >= 3, proc, "three logged steps", timeout=300)
    sigkill(proc)
    assert [p.name for p in list_checkpoints(killed)] == ["step-000002"]

    straight_trainer = tiny_trainer(tmp_path / "straight")
    straight = straight_trainer.train()
    trainer = tiny_trainer(killed)
    assert trainer.resume() == 2
    assert complete_lines(log) == 2  # step 3, logged after the checkpoint, is cut and redone
    resumed = trainer.train()

    assert [r["step"] for r in resumed] == [3, 4]
    for got, want in zip(resumed, straight[2:], strict=True):
        for key in ("loss", "pg_loss", "value_loss", "grad_norm", "reward/mean", "lr"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    final, restarted = straight_trainer.policy.trainable_state_dict(), trainer.policy.trainable_state_dict()
    for name in final:
        torch.testing.assert_close(restarted[name], final[name], rtol=1e-5, atol=1e-6)
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3, 4]
    assert [p.name for p in list_checkpoints(killed)] == ["step-000002", "step-000004"]
    assert not [p for p in (killed / "checkpoints").iterdir() if p.name.startswith(".")]


# --- cache builds ----------------------------------------------------------------------------------------

KILLED_BUILD = """
import sys, time
from pathlib import Path

kind, ready = sys.argv[1], Path(sys.argv[2])

def stall():
    ready.touch()
    time.sleep(600)

if kind == "model":
    import searchteam.llm.models as models
    from tests.test_caches import truncate, write_fake_checkpoint

    def half(preset, workdir, out):
        write_fake_checkpoint(preset, workdir, out)
        truncate(out / "model.safetensors")
        stall()

    models._write_checkpoint = half
    models.resolve_model("smollm2-135m")
elif kind == "openvino":
    import searchteam.llm.ov_export as ov_export
    from tests.test_caches import truncate, write_fake_ir

    def half(name, precision, tmp):
        truncate(write_fake_ir(name, precision, tmp) / "openvino_model.bin")
        stall()

    ov_export._export_ir = half
    ov_export.openvino_model_dir("smollm2-135m", "int8")
else:
    import searchteam.retrieval.bm25 as bm25

    save = bm25.PassageTable.save
    bm25.PassageTable.save = lambda table, path: [save(table, path), stall()]
    bm25.BM25Retriever(sys.argv[3])
"""


def rebuild(kind: str, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Build the entry again in this process, with the fast fakes; returns its folder."""
    import searchteam.llm.models as models
    import searchteam.llm.ov_export as ov_export
    from searchteam.retrieval.bm25 import BM25Retriever

    monkeypatch.setattr(models, "_write_checkpoint", write_fake_checkpoint)
    monkeypatch.setattr(ov_export, "_export_ir", write_fake_ir)
    if kind == "model":
        return Path(models.resolve_model("smollm2-135m"))
    if kind == "openvino":
        return ov_export.openvino_model_dir("smollm2-135m", "int8")
    return BM25Retriever(corpus).index_path


@pytest.mark.parametrize(
    ("kind", "folder"), [("model", "models"), ("openvino", "openvino"), ("bm25", "indexes")]
)
def test_a_killed_cache_build_leaves_nothing_a_later_run_trusts(
    kind: str, folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from searchteam.cache import entry_problem

    cache = tmp_path / "cache"
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(cache))
    corpus, ready = write_corpus(tmp_path / "corpus.jsonl"), tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_BUILD, kind, str(ready), str(corpus)],
        cwd=REPO,
        env={**os.environ, "SEARCHTEAM_CACHE": str(cache)},
        stderr=(tmp_path / "build.err").open("w"),
    )
    wait_for(ready.exists, proc, "the build to be half-way")
    sigkill(proc)
    parent = cache / folder
    assert [
        p.name for p in parent.iterdir() if not p.name.startswith(".")
    ] == []  # no entry, so nothing trusted
    assert hidden_leftovers(parent)  # only the killed build's temporary folder

    target = rebuild(kind, corpus, monkeypatch)
    assert entry_problem(target, require_files()) is None
    assert hidden_leftovers(parent) == []  # the rebuild swept the leftovers
    assert entry_problem(parent / "absent", require_files()) == MISSING
