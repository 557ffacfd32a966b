"""Settings of the engines a run generates with: the in-process vLLM engine and the client of an
OpenAI-compatible server. Sections of the run configuration (`RunConfig.engine`, `RunConfig.server`)."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

Backend = Literal["auto", "hf", "ov", "openai", "vllm"]  # how a run's models are served (`resolve_backend`)
BACKENDS: tuple[str, ...] = get_args(Backend)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts (MaxLoRARanks)


class EngineSettings(BaseModel):
    """The in-process vLLM engine (`backend: vllm`), as `vllm.LLM` takes them. One engine per model per
    process; a run's other models (judge, role models, teacher) go to `hf` unless they are that model."""

    model_config = ConfigDict(extra="forbid")

    gpu_memory_utilization: float = Field(
        0.85, gt=0.0, le=1.0, description="share of the GPU's memory the engine reserves (weights + KV cache)"
    )
    max_model_len: int | None = Field(None, ge=16, description="context length; unset: the model's")
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs the engine shards the model over")
    max_num_seqs: int | None = Field(None, ge=1, description="sequences per engine step; unset: vLLM's")
    enforce_eager: bool = Field(False, description="no CUDA graphs: less memory, slower decoding")
    max_lora_rank: int | None = Field(
        None, description="LoRA rank the engine reserves (1, 8, 16, ... 512); unset: the largest adapter's r"
    )

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_rank(cls, value: int | None) -> int | None:
        if value is not None and value not in LORA_RANKS:
            raise ValueError(f"vLLM takes a max_lora_rank of {', '.join(map(str, LORA_RANKS))}")
        return value


class ServerSettings(BaseModel):
    """The client of an OpenAI-compatible server (`backend: openai`)."""

    model_config = ConfigDict(extra="forbid")

    timeout: float = Field(120.0, gt=0.0, description="seconds per HTTP request")
    concurrency: int = Field(
        64,
        ge=1,
        le=100000,
        description="requests in flight at once per process, each sent the moment an episode makes it: what "
        "the server holds (vLLM's --max-num-seqs); reached when `concurrency` episodes make enough requests",
    )
    max_retries: int = Field(4, ge=0, le=100, description="retries of a request on 429, 5xx or no answer")
