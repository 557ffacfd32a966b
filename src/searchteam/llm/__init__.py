"""LLM backends behind one protocol (`generate(requests) -> completions`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from searchteam.errors import LLMError
from searchteam.llm.base import LLM, Completion, GenerationRequest, SamplingParams
from searchteam.llm.models import DEFAULT_MODEL, PRESETS, TRAINED, checkpoint_of
from searchteam.llm.settings import BACKENDS

if TYPE_CHECKING:
    from searchteam.llm.settings import EngineSettings, ServerSettings


def resolve_backend(backend: str, model: str, device: str | None = None, logprobs: bool = False) -> str:
    """`auto`: on CUDA vLLM where installed, else transformers; on the CPU OpenVINO GenAI when installed and
    the model is one it runs (a preset or a LoRA checkpoint of one) and no logprobs are asked for, else
    transformers. Any other name is kept."""
    if backend != "auto":
        return backend
    model = checkpoint_of(model)
    import importlib.util

    from searchteam.llm.hf import pick_device

    if pick_device(device).startswith("cuda"):
        return "vllm" if importlib.util.find_spec("vllm") else "hf"
    from searchteam.llm.ov import ov_supports

    return "ov" if not logprobs and ov_supports(model) else "hf"


def secondary_backend(backend: str, policy_model: str, model: str, device: str | None = None) -> str:
    """The backend of a run's other model (a judge, a role's own model, QAgent's frozen generator, a warm
    start's teacher) when the policy `policy_model` runs on `backend`: the same server with `openai`; with
    an in-process vLLM, that engine when it already serves `model`'s base model, else `hf` (a second engine
    would reserve its own share of a GPU that holds one); with `ov`, OpenVINO where it runs `model`, else
    `hf`; with `hf`, `hf`."""
    main = resolve_backend(backend, policy_model, device)
    if main == "vllm":
        from searchteam.llm.vllm import has_engine

        return "vllm" if has_engine(checkpoint_of(model)) else "hf"
    if main == "ov":
        from searchteam.llm.ov import ov_supports

        return "ov" if ov_supports(checkpoint_of(model)) else "hf"
    return main


def build_llm(
    model: str = DEFAULT_MODEL,
    *,
    backend: str = "auto",
    base_url: str | list[str] | None = None,
    device: str | None = None,
    dtype: str | None = None,
    logprobs: bool = False,
    seed: int | None = None,
    ov_precision: str = "int8",
    engine: EngineSettings | None = None,
    server: ServerSettings | None = None,
) -> LLM:
    """Construct a backend by name (`auto`: see `resolve_backend`). `openai` needs `base_url` (e.g.
    http://localhost:8000/v1) and takes its client settings from `server`; `vllm` runs on the process's
    engine of the model (started with `engine` on first use); `ov_precision` is the weight precision of
    the `ov` backend."""
    model = checkpoint_of(model)  # a shipped trained adapter loads as the checkpoint it is
    backend = resolve_backend(backend, model, device, logprobs)
    if backend == "ov":
        if logprobs:
            raise LLMError("the ov backend gives no logprobs; use --backend hf (the trainer recomputes them)")
        from searchteam.llm.ov import OVBackend

        return OVBackend(model, precision=ov_precision, seed=seed)
    if backend == "hf":
        from searchteam.llm.hf import HFBackend

        return HFBackend(model, device=device, dtype=dtype, logprobs=logprobs, seed=seed)
    if backend == "openai":
        if not base_url:
            raise LLMError("backend 'openai' needs --base-url, e.g. http://localhost:8000/v1")
        from searchteam.llm.openai import OpenAIBackend

        if server is None:
            return OpenAIBackend(model, base_url)
        return OpenAIBackend(
            model,
            base_url,
            timeout=server.timeout,
            max_retries=server.max_retries,
            concurrency=server.concurrency,
        )
    if backend == "vllm":
        from searchteam.llm.vllm import VLLMBackend

        return VLLMBackend(model, dtype=dtype, settings=engine, logprobs=logprobs, seed=seed or 0)
    raise LLMError(f"unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}")


__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "LLM",
    "PRESETS",
    "TRAINED",
    "Completion",
    "GenerationRequest",
    "SamplingParams",
    "build_llm",
    "resolve_backend",
    "secondary_backend",
]
