"""The OpenVINO GenAI backend against the transformers one, on the real default model: the same prompt
tokens, the same greedy tokens in fp32, runtime LoRA adapters equal to peft's merged model, per-role
routing, stop strings, seeded sampling, the conversion cache, the `auto` choice, a stalled engine and the
one-thread sampler."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import torch

from searchteam.errors import EngineStalled
from searchteam.llm import build_llm, resolve_backend
from searchteam.llm.base import SHARED, GenerationRequest, SamplingParams
from searchteam.llm.ov import OVBackend, ov_supports

pytest.importorskip("openvino_genai")

QUESTIONS = [
    "Who wrote the novel War and Peace?",
    "What is the capital of Australia?",
    "Name the largest planet in the solar system.",
    "When did World War II end?",
]
GREEDY = SamplingParams(max_new_tokens=24)


def _requests(sampling: SamplingParams = GREEDY, role: str = "") -> list[GenerationRequest]:
    return [GenerationRequest([{"role": "user", "content": q}], sampling, role=role) for q in QUESTIONS]


@pytest.fixture(scope="module")
def ov_fp32() -> OVBackend:
    return OVBackend("smollm2-135m", precision="fp32", seed=0)


def _checkpoint(tmp: Path, roles: list[str], nonzero: set[str]) -> Path:
    """A `searchteam train` checkpoint whose LoRA adapters (shared, or one per role) have random B
    matrices for the adapters in `nonzero` (others stay peft's zero init: the base model)."""
    from searchteam.rl.config import TrainConfig
    from searchteam.rl.policy import load_policy

    config = TrainConfig(lora_per_role=bool(roles), roles=roles)
    policy = load_policy("smollm2-135m", config, device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            adapter = name.split(".")[-2]
            if "lora_B" in name and adapter in nonzero:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    policy.save(tmp / "policy")
    return tmp


def test_prompt_tokens_are_the_hf_backends(default_llm, ov_fp32):
    requests = _requests(SamplingParams(max_new_tokens=2))
    requests.append(
        GenerationRequest([{"role": "user", "content": "Hi"}], SamplingParams(2), continuation="<answer>")
    )
    hf = default_llm.generate(requests)
    ov = ov_fp32.generate(requests)
    assert [c.prompt_token_ids for c in ov] == [c.prompt_token_ids for c in hf]


def test_fp32_greedy_tokens_equal_transformers(default_llm, ov_fp32):
    hf = default_llm.generate(_requests())
    ov = ov_fp32.generate(_requests())
    assert [c.token_ids for c in ov] == [c.token_ids for c in hf]
    assert [c.text for c in ov] == [c.text for c in hf]


def test_runtime_lora_equals_the_peft_merged_model(tmp_path):
    """A nonzero LoRA applied by the engine at runtime gives peft's merged-model greedy tokens, and the
    engine's log-probability of each sequence is within 1e-3 per token of transformers' (fp32 weights)."""
    import numpy as np
    import openvino as ov

    checkpoint = _checkpoint(tmp_path, [], {"policy"})
    hf = build_llm(str(checkpoint), backend="hf", device="cpu", logprobs=True)
    engine = OVBackend(str(checkpoint), precision="fp32")
    base = build_llm("smollm2-135m", backend="hf", device="cpu").generate(_requests())
    merged = hf.generate(_requests())
    ours = engine.generate(_requests())
    assert [c.token_ids for c in merged] != [c.token_ids for c in base], "the adapter must change outputs"
    assert [c.token_ids for c in ours] == [c.token_ids for c in merged]
    pipeline, adapter = engine._pipelines[""]
    for request, completion in zip(_requests(), merged, strict=True):
        config = engine._config(request, adapter)
        config.logprobs = 1
        ids = ov.Tensor(np.asarray([completion.prompt_token_ids], dtype=np.int64))
        score = pipeline.generate([ids], [config])[0].m_scores[0]
        assert math.isclose(score, sum(completion.logprobs), abs_tol=1e-3 * len(completion.token_ids))


def test_each_role_generates_with_its_own_adapter(tmp_path):
    checkpoint = _checkpoint(tmp_path, ["searcher", "generator"], {"generator"})
    engine = OVBackend(str(checkpoint), precision="fp32")
    hf = build_llm(str(checkpoint), backend="hf", device="cpu")
    mixed = _requests(role="searcher")[:2] + _requests(role="generator")[2:]
    assert [c.token_ids for c in engine.generate(mixed)] == [c.token_ids for c in hf.generate(mixed)]
    base = build_llm("smollm2-135m", backend="hf", device="cpu").generate(_requests()[:2])
    assert [c.token_ids for c in engine.generate(mixed)[:2]] == [c.token_ids for c in base]


def test_stop_strings_and_finish_reasons(ov_fp32):
    stop = SamplingParams(max_new_tokens=40, stop=("</answer>",))
    ask = [{"role": "user", "content": "What is the capital of France? Reply inside <answer></answer>."}]
    done = ov_fp32.generate([GenerationRequest(ask, stop, continuation="<answer>")])[0]
    assert done.text.endswith("</answer>") and done.finish_reason == "stop"
    assert ov_fp32.tokenizer.decode(done.token_ids).endswith("</answer>")  # no tokens after the stop
    cut = ov_fp32.generate([GenerationRequest(ask, SamplingParams(max_new_tokens=3))])[0]
    assert cut.finish_reason == "length" and cut.completion_tokens == 3


def test_sampling_is_reproducible_by_seed(ov_fp32):
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0)
    runs = []
    for seed in (1, 1, 2):
        ov_fp32.reseed(seed)
        runs.append([c.token_ids for c in ov_fp32.generate(_requests(sampled))])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_conversion_is_cached_and_leaves_no_partial_folder(monkeypatch, ov_fp32):
    from searchteam.llm import ov_export

    folder = ov_fp32.model_dir
    assert (folder / ov_export.MODEL_XML).exists() and (folder / "openvino_tokenizer.xml").exists()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(ov_export, "_convert", lambda *a: pytest.fail("converted twice"))
    assert ov_export.openvino_model_dir("smollm2-135m", "fp32") == folder


def test_auto_picks_openvino_on_the_cpu_for_what_it_runs():
    assert ov_supports("smollm2-135m")
    assert resolve_backend("auto", "smollm2-135m", "cpu") == "ov"
    assert resolve_backend("auto", "smollm2-135m", "cpu", logprobs=True) == "hf"
    assert resolve_backend("auto", "HuggingFaceTB/SmolLM2-360M-Instruct", "cpu") == "hf"
    assert resolve_backend("hf", "smollm2-135m", "cpu") == "hf"


def test_engine_refuses_what_it_cannot_run(tmp_path):
    from searchteam.errors import LLMError

    with pytest.raises(LLMError, match="presets"):
        OVBackend(str(tmp_path))
    with pytest.raises(LLMError, match="gives no logprobs"):
        build_llm("smollm2-135m", backend="ov", logprobs=True)


def test_a_stalled_engine_fails_its_call_and_every_later_one():
    class IdlePipeline:
        def generate(self, inputs, configs):
            time.sleep(30)

    backend = OVBackend("smollm2-135m", stall_seconds=0.5)
    real = backend._pipelines[SHARED]
    backend._pipelines[SHARED] = (IdlePipeline(), None)
    with pytest.raises(EngineStalled, match="no progress"):
        backend.generate(_requests())
    backend._pipelines[SHARED] = real  # the stuck thread may hold the engine: never reuse it
    started = time.monotonic()
    with pytest.raises(EngineStalled):
        backend.generate(_requests())
    assert time.monotonic() - started < 1


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="GenAI's default sampler pool is one thread here")
def test_pipelines_sample_on_one_thread(ov_fp32):
    """GenAI's sampler pool (one thread per core by default) can deadlock on its shared detokenizer
    queue while matching stop strings; a backend's pipeline gets a pool of one."""
    import openvino_genai as ov_genai

    def threads_added(build) -> int:
        before = len(os.listdir("/proc/self/task"))
        pipeline = build()
        added = len(os.listdir("/proc/self/task")) - before
        del pipeline
        return added

    default = threads_added(
        lambda: ov_genai.ContinuousBatchingPipeline(str(ov_fp32.model_dir), ov_genai.SchedulerConfig(), "CPU")
    )
    ours = threads_added(lambda: ov_fp32._pipeline(None))
    assert default - ours == os.cpu_count() - 1
