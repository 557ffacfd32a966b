"""In-process vLLM for GPUs (optional extra `searchteam[gpu]`; vllm is imported only when an engine starts).

One engine per base model per process (`ENGINES`): every backend of that model (the policy, a frozen
generator, another role's model) shares it. A `searchteam train` checkpoint or a shipped adapter runs on its
base model's engine with LoRA enabled, each request naming its role's adapter (`LoRARequest`). Prompts are
rendered once with the same `render_chat` as the `hf` backend and sent as token ids, so no special token
is added twice, and every sampling parameter is set explicitly (no top-k, no penalties, no min-p), so the
engine samples the plain temperature softmax the trainer scores.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchteam.errors import LLMError
from searchteam.extras import require
from searchteam.llm.base import (
    Completion,
    GenerationRequest,
    SamplingParams,
    render_prompt_ids,
    truncate_at_stop,
)
from searchteam.llm.models import resolve_model
from searchteam.llm.settings import LORA_RANKS, EngineSettings


@dataclass(frozen=True)
class Checkpoint:
    """What an engine loads for a model name: the base weights, and LoRA adapter folders by role."""

    base: str
    adapters: dict[str, Path] = field(default_factory=dict)


def read_checkpoint(name: str) -> Checkpoint:
    """A `searchteam train` checkpoint (or a shipped adapter's folder) as the `hf` backend reads it: full
    weights under `policy/model`, else the adapters under `policy/adapters/ROLE` on the base model their
    peft config names; any other name is a preset, hub id or model folder."""
    policy = Path(name) / "policy"
    full = policy / "model"
    if (full / "config.json").exists():
        return Checkpoint(str(full))
    folders = sorted(p.parent for p in (policy / "adapters").glob("*/adapter_config.json"))
    if not folders:
        return Checkpoint(resolve_model(name))
    named = json.loads((folders[0] / "adapter_config.json").read_text())["base_model_name_or_path"]
    return Checkpoint(resolve_model(named), {p.name: p.absolute() for p in folders})


def adapter_rank(folder: Path) -> int:
    """A peft LoRA adapter's rank `r`, from its `adapter_config.json`."""
    return int(json.loads((Path(folder) / "adapter_config.json").read_text())["r"])


def lora_rank(folders: list[Path]) -> int:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds every adapter's `r`."""
    largest = max(adapter_rank(p) for p in folders)
    fitting = [r for r in LORA_RANKS if r >= largest]
    if not fitting:
        raise LLMError(f"LoRA rank {largest} is above vLLM's largest max_lora_rank ({LORA_RANKS[-1]})")
    return fitting[0]


def engine_kwargs(
    checkpoint: Checkpoint, settings: EngineSettings, *, dtype: str | None, seed: int
) -> dict[str, Any]:
    """The keyword arguments of `vllm.LLM` for this checkpoint: the run's engine settings, and LoRA with one
    slot per role when the checkpoint has adapters. `logprobs_mode`: the logprobs of the distribution
    sampled from (after temperature), as the trainer computes them, not the raw logits'."""
    kwargs: dict[str, Any] = {
        "model": checkpoint.base,
        "tokenizer": checkpoint.base,
        "dtype": dtype or "auto",
        "seed": seed,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enforce_eager": settings.enforce_eager,
        "logprobs_mode": "processed_logprobs",
    }
    if settings.max_model_len is not None:
        kwargs["max_model_len"] = settings.max_model_len
    if settings.max_num_seqs is not None:
        kwargs["max_num_seqs"] = settings.max_num_seqs
    if checkpoint.adapters:
        kwargs["enable_lora"] = True
        kwargs["max_loras"] = len(checkpoint.adapters)
        kwargs["max_lora_rank"] = settings.max_lora_rank or lora_rank(list(checkpoint.adapters.values()))
    return kwargs


# Off values of vLLM's sampling knobs that the trainer's plain temperature softmax does not have (top-k's
# off value differs between its APIs). vLLM fills what a request leaves unset from the model's
# generation_config (`--generation-config auto`, the default), so every request sets them.
NEUTRAL_SAMPLING: dict[str, float] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


def sampling_kwargs(sampling: SamplingParams, logprobs: bool) -> dict[str, Any]:
    """The keyword arguments of `vllm.SamplingParams` for one request: every parameter that changes the
    distribution set explicitly (top-k off, no penalties, min-p 0), so nothing from the model's
    generation_config applies. Greedy is temperature 0 with top-p 1."""
    return {
        "n": 1,
        "max_tokens": sampling.max_new_tokens,
        "temperature": max(sampling.temperature, 0.0),
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
        "top_k": -1,  # off: -1 (or 0) in vLLM's API
        **NEUTRAL_SAMPLING,
        "stop": list(sampling.stop) or None,
        "include_stop_str_in_output": True,
        "skip_special_tokens": True,
        "logprobs": 0 if logprobs else None,
    }


def lora_kwargs(role: str, folder: Path, lora_id: int) -> dict[str, Any]:
    """The keyword arguments of `vllm.lora.request.LoRARequest` for a role's adapter (ids start at 1)."""
    return {"lora_name": role or "shared", "lora_int_id": lora_id, "lora_path": str(folder)}


def adapter_for(role: str, adapters: dict[str, Path]) -> tuple[str, Path] | None:
    """The adapter a request of `role` runs with, routed as the `hf` backend routes it: one adapter serves
    every role; of several, the role's own, else the first by name. None: the base model."""
    if not adapters:
        return None
    names = sorted(adapters)
    name = role if role in adapters and len(names) > 1 else names[0]
    return name, adapters[name]


class Engine:
    """One `vllm.LLM` and what its backends share: the LoRA ids handed out and a lock (`LLM.generate`
    is not meant to be called from two threads at once)."""

    def __init__(self, llm: Any, kwargs: dict[str, Any]) -> None:
        self.llm = llm
        self.kwargs = kwargs
        self.lora_ids: dict[Path, int] = {}
        self.lock = threading.Lock()
        self._ids_lock = threading.Lock()

    def lora_id(self, folder: Path) -> int:
        """The engine-wide id of an adapter folder (vLLM caches adapters by id, so one folder, one id)."""
        with self._ids_lock:
            return self.lora_ids.setdefault(folder, len(self.lora_ids) + 1)


ENGINES: dict[str, Engine] = {}  # base model -> its engine in this process
_ENGINES_LOCK = threading.Lock()


def _start_vllm(kwargs: dict[str, Any]) -> Any:
    return require("vllm", "gpu", "the vLLM engine (--backend vllm)").LLM(**kwargs)


def get_engine(
    checkpoint: Checkpoint,
    settings: EngineSettings,
    *,
    dtype: str | None = None,
    seed: int = 0,
    start: Callable[[dict[str, Any]], Any] = _start_vllm,
) -> Engine:
    """The process's engine for `checkpoint.base`, started on first use. A later model with adapters on an
    engine started without LoRA (or with a smaller rank) is refused: it would need a second engine."""
    with _ENGINES_LOCK:
        engine = ENGINES.get(checkpoint.base)
        if engine is None:
            kwargs = engine_kwargs(checkpoint, settings, dtype=dtype, seed=seed)
            engine = ENGINES[checkpoint.base] = Engine(start(kwargs), kwargs)
            return engine
    if checkpoint.adapters:
        need = settings.max_lora_rank or lora_rank(list(checkpoint.adapters.values()))
        if not engine.kwargs.get("enable_lora") or engine.kwargs["max_lora_rank"] < need:
            raise LLMError(
                f"the vLLM engine of {checkpoint.base} in this process was started without LoRA rank {need}; "
                "load the model with adapters first, or run it on another backend"
            )
    return engine


def has_engine(name: str) -> bool:
    """Whether this process already runs an engine that serves `name` (its base model)."""
    try:
        return read_checkpoint(name).base in ENGINES
    except (OSError, ValueError, KeyError, LLMError):
        return False


class VLLMBackend:
    """A model on the process's vLLM engine of its base model; with adapters, each request runs its role's
    adapter. `engine` and `tokenizer` may be given (tests; a caller that holds them)."""

    def __init__(
        self,
        name: str,
        *,
        dtype: str | None = None,
        settings: EngineSettings | None = None,
        logprobs: bool = False,
        seed: int = 0,
        engine: Engine | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.name = name
        self.want_logprobs = logprobs
        self.checkpoint = read_checkpoint(name)
        self.engine = engine or get_engine(
            self.checkpoint, settings or EngineSettings(), dtype=dtype, seed=seed
        )
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.checkpoint.base)
        self.tokenizer = tokenizer

    def lora_request(self, role: str) -> dict[str, Any] | None:
        """The `LoRARequest` arguments of a request of `role`, or None for the base model."""
        chosen = adapter_for(role, self.checkpoint.adapters)
        if chosen is None:
            return None
        name, folder = chosen
        return lora_kwargs(name, folder, self.engine.lora_id(folder))

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        from vllm import SamplingParams as VSampling

        # a vllm TokensPrompt: the ids exactly as the `hf` backend feeds them
        prompts = [{"prompt_token_ids": render_prompt_ids(self.tokenizer, r)} for r in requests]
        params = [VSampling(**sampling_kwargs(r.sampling, self.want_logprobs)) for r in requests]
        loras = [self._lora(r.role) for r in requests]
        with self.engine.lock:
            outputs = self.engine.llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        return [self._completion(req, out) for req, out in zip(requests, outputs, strict=True)]

    def _lora(self, role: str) -> Any:
        kwargs = self.lora_request(role)
        if kwargs is None:
            return None
        from vllm.lora.request import LoRARequest

        return LoRARequest(**kwargs)

    def _completion(self, req: GenerationRequest, out: Any) -> Completion:
        gen = out.outputs[0]
        text, _ = truncate_at_stop(gen.text, req.sampling.stop)
        logprobs = None
        if self.want_logprobs and gen.logprobs is not None:
            logprobs = [step[tid].logprob for step, tid in zip(gen.logprobs, gen.token_ids, strict=True)]
        return Completion(
            text=text,
            prompt_token_ids=list(out.prompt_token_ids),
            token_ids=list(gen.token_ids),
            logprobs=logprobs,
            prompt_tokens=len(out.prompt_token_ids),
            completion_tokens=len(gen.token_ids),
            finish_reason=gen.finish_reason or "stop",
        )
