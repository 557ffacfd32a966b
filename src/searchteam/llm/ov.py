"""OpenVINO GenAI backend: continuous batching with prefix caching on the CPU, LoRA adapters at runtime.

Prompts are rendered and tokenized by the transformers tokenizer (the same token ids as the `hf` backend)
and completions decoded by it, so only the forward passes run in OpenVINO. Each distinct LoRA adapter gets
its own pipeline with the adapter fixed at construction: GenAI's prefix cache is keyed by tokens alone, so a
pipeline whose adapter changed could reuse KV computed with other weights. `load_adapters` rebuilds them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from itertools import groupby
from pathlib import Path
from typing import TypeVar

import numpy as np

from searchteam.cache import cache_dir
from searchteam.errors import EngineStalled, LLMError
from searchteam.extras import has, require
from searchteam.llm.base import (
    SHARED,
    Completion,
    GenerationRequest,
    SamplingParams,
    cut_completion,
    render_chat,
    text_decoder,
)
from searchteam.llm.models import PRESETS, resolve_model
from searchteam.llm.ov_export import OV_EXTRA, OV_WHAT, openvino_model_dir

T = TypeVar("T")

# GenAI's sampler matches stop strings on a pool of threads that share the detokenizer through a queue
# (CircularBufferQueue) with a lost-wakeup race: a thread can wait forever for an element given back at the
# wrong moment, and `generate` then sits idle for good. One sampler thread never contends for it.
SAMPLER_THREADS = 1
# A generate call during which the process uses less than IDLE_CPU_SECONDS of CPU for this long has hung.
STALL_SECONDS = 600.0
IDLE_CPU_SECONDS = 1.0


def ov_supports(model: str) -> bool:
    """Whether OpenVINO GenAI is installed and `model` is one the ov backend runs."""
    if not has("openvino_genai"):
        return False
    try:
        ov_base_and_adapters(model)
    except LLMError:
        return False
    return True


class OVBackend:
    """Generates with an OpenVINO GenAI continuous-batching pipeline over a converted preset.

    `name` is a preset or a `searchteam train` checkpoint of one with LoRA adapters (one shared, or one per
    role, routed by `request.role`). `precision` is the converted weights' (int8 by default; fp32 computes
    exactly what the `hf` backend computes, KV cache included). `cache_gb` sizes the KV cache. A generate
    call during which the process stays idle for `stall_seconds` raises EngineStalled (see `watch_stall`)."""

    def __init__(
        self,
        name: str,
        *,
        precision: str = "int8",
        seed: int | None = None,
        cache_gb: int = 1,
        prefix_caching: bool = True,
        stall_seconds: float = STALL_SECONDS,
    ) -> None:
        from transformers import AutoTokenizer

        require("openvino_genai", OV_EXTRA, OV_WHAT)
        self.name = name
        preset, adapters = ov_base_and_adapters(name)
        self.model_dir = openvino_model_dir(preset, precision)
        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(preset))
        self.precision = precision
        self._cache_gb = cache_gb
        self._prefix_caching = prefix_caching
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._pipelines: dict[str, tuple[object, object | None]] = {}
        self._stall_seconds = stall_seconds
        self._stalled: EngineStalled | None = None
        self.load_adapters(adapters)

    def reseed(self, seed: int) -> None:
        """Restart the stream of per-request sampling seeds (reproducible rollouts per training step)."""
        self._rng = np.random.default_rng(seed)

    def load_adapters(self, adapters: Mapping[str, Path]) -> None:
        """Use these peft LoRA adapter folders from now on: `{role: folder}`, or `{SHARED: folder}` for one
        adapter on every role; `{}` for the base model. Builds one pipeline per adapter."""
        with self._lock:
            self._pipelines = {}
            for key, folder in adapters.items() or [(SHARED, None)]:
                self._pipelines[key] = self._pipeline(folder)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One pipeline call per adapter; within it the engine batches requests of any sampling params."""
        results: dict[int, Completion] = {}
        order = sorted(range(len(requests)), key=lambda i: self._adapter_key(requests[i].role))
        with self._lock:
            if self._stalled is not None:
                raise self._stalled
            for key, group in groupby(order, key=lambda i: self._adapter_key(requests[i].role)):
                idx = list(group)
                outs = self._generate_group([requests[i] for i in idx], *self._pipelines[key])
                results.update(zip(idx, outs, strict=True))
        return [results[i] for i in range(len(requests))]

    def _adapter_key(self, role: str) -> str:
        return role if role in self._pipelines else next(iter(self._pipelines))

    def _pipeline(self, adapter_folder: Path | None) -> tuple[object, object | None]:
        import openvino_genai as ov_genai

        scheduler = ov_genai.SchedulerConfig()
        scheduler.cache_size = self._cache_gb
        scheduler.enable_prefix_caching = self._prefix_caching
        properties: dict[str, object] = {"sampler_num_threads": SAMPLER_THREADS}
        if self.precision == "fp32":
            properties.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
        adapter_config = None
        if adapter_folder is not None:
            adapter_config = ov_genai.AdapterConfig(*_engine_adapter(Path(adapter_folder)))
            properties["adapters"] = adapter_config
        pipeline = ov_genai.ContinuousBatchingPipeline(str(self.model_dir), scheduler, "CPU", properties)
        return pipeline, adapter_config

    def _generate_group(
        self, requests: list[GenerationRequest], pipeline, adapter_config
    ) -> list[Completion]:
        import openvino as ov

        prompt_ids = [
            self.tokenizer(render_chat(self.tokenizer, r), add_special_tokens=False)["input_ids"]
            for r in requests
        ]
        configs = [self._config(r, adapter_config) for r in requests]
        inputs = [ov.Tensor(np.asarray([ids], dtype=np.int64)) for ids in prompt_ids]
        try:
            outputs = watch_stall(lambda: pipeline.generate(inputs, configs), self._stall_seconds)
        except EngineStalled as exc:
            self._stalled = exc
            raise
        eos = self._eos_ids()
        completions = []
        for ids, request, out in zip(prompt_ids, requests, outputs, strict=True):
            new_ids, text, stopped = cut_completion(
                list(out.m_generation_ids[0]), eos, request.sampling.stop, text_decoder(self.tokenizer)
            )
            completions.append(
                Completion(
                    text=text,
                    prompt_token_ids=list(ids),
                    token_ids=new_ids,
                    prompt_tokens=len(ids),
                    completion_tokens=len(new_ids),
                    finish_reason="stop" if stopped else "length",
                )
            )
        return completions

    def _config(self, request: GenerationRequest, adapter_config):
        seed = None if request.sampling.greedy else int(self._rng.integers(2**31 - 1))
        config = generation_config(request.sampling, self.tokenizer.eos_token_id, self._eos_ids(), seed)
        if adapter_config is not None:
            config.adapters = adapter_config
        return config

    def _eos_ids(self) -> set[int]:
        return {self.tokenizer.eos_token_id}


def watch_stall(
    call: Callable[[], T], stall_seconds: float, poll_seconds: float = 5.0, idle_cpu: float = IDLE_CPU_SECONDS
) -> T:
    """`call()` in a daemon thread, watched: its result or exception, or EngineStalled once the process has
    used less than `idle_cpu` seconds of CPU (all threads) over the last `stall_seconds` of the call. A
    native engine call cannot be interrupted, so a stalled call's thread is left behind."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="ov-generate", daemon=True)
    worker.start()
    samples = deque([(time.monotonic(), time.process_time())])
    while True:
        worker.join(min(poll_seconds, stall_seconds / 4))
        if not worker.is_alive():
            break
        now = (time.monotonic(), time.process_time())
        samples.append(now)
        while len(samples) > 2 and now[0] - samples[1][0] >= stall_seconds:  # the newest sample that old
            samples.popleft()
        wall, cpu = now[0] - samples[0][0], now[1] - samples[0][1]
        if wall >= stall_seconds and cpu < idle_cpu:
            raise EngineStalled(
                f"the OpenVINO engine made no progress for {wall:.0f} s (idle inside generate, "
                f"{cpu:.1f} s of CPU): a GenAI hang; rerun the command, runs resume where they stopped"
            )
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


def generation_config(
    sampling: SamplingParams, eos_token_id: int, stop_token_ids: set[int], seed: int | None
):
    """A GenAI GenerationConfig that samples exactly the temperature softmax (nucleus-truncated when
    top_p < 1), or takes its argmax at temperature 0: top-k, min-p and the repetition, presence and
    frequency penalties set off explicitly, as the trainer scores it."""
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = sampling.max_new_tokens
    config.set_eos_token_id(eos_token_id)
    config.stop_token_ids = stop_token_ids
    if sampling.stop:
        config.stop_strings = set(sampling.stop)
        config.include_stop_str_in_output = True
    config.top_k = 0  # GenAI filters only for 0 < top_k < SIZE_MAX
    config.min_p = 0.0
    config.repetition_penalty = 1.0
    config.presence_penalty = 0.0
    config.frequency_penalty = 0.0
    config.min_new_tokens = 0
    config.do_sample = not sampling.greedy
    config.top_p = 1.0 if sampling.greedy else sampling.top_p
    if not sampling.greedy:
        config.temperature = sampling.temperature
    if seed is not None:
        config.rng_seed = seed
    return config


def ov_base_and_adapters(name: str) -> tuple[str, dict[str, Path]]:
    """The preset under `name` and its LoRA adapters: a preset has none; a `searchteam train` checkpoint
    has one shared adapter or one per role (`policy/adapters/ROLE`)."""
    if name in PRESETS:
        return name, {}
    adapters = sorted(p.parent for p in (Path(name) / "policy" / "adapters").glob("*/adapter_config.json"))
    if not adapters:
        raise LLMError(
            f"the ov backend runs the presets ({', '.join(PRESETS)}) and LoRA checkpoints of them; "
            f"'{name}' is neither (full fine-tuned weights need --backend hf)"
        )
    base = json.loads((adapters[0] / "adapter_config.json").read_text())["base_model_name_or_path"]
    preset = next((p for p in PRESETS if base in (p, str(cache_dir("models") / p))), None)
    if preset is None:
        raise LLMError(f"{name}: its adapters were trained on '{base}', not on a preset the ov backend runs")
    if len(adapters) == 1:
        return preset, {SHARED: adapters[0]}
    return preset, {path.name: path for path in adapters}


def _engine_adapter(folder: Path) -> tuple[object, float]:
    """A peft adapter as GenAI applies it: the safetensors file and peft's scale (lora_alpha / r, or over
    √r with rsLoRA), since GenAI ignores the file's own alpha and scales by the configured one."""
    import openvino_genai as ov_genai

    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise LLMError(f"{folder}: per-module ranks or alphas are not supported by the ov backend")
    rank = config["r"]
    scale = config["lora_alpha"] / (rank**0.5 if config.get("use_rslora") else rank)
    return ov_genai.Adapter(str(folder / "adapter_model.safetensors")), scale
