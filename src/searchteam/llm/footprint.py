"""Whether a run's in-process engines fit this machine's memory, checked before any of them loads: the policy
and each distinct role model (`role_models`) is one engine. An engine's share is its weights at the
precision its backend runs (OpenVINO: `ov_precision`; transformers on the CPU: fp32, or the run's `dtype`)
plus its KV cache; a served model (`openai`) and GPU engines cost nothing here. Models whose size is not
known (not a preset or an adapter of one) are not counted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GIB = 1 << 30
BYTES_PER_WEIGHT = {"int8": 1, "fp16": 2, "float16": 2, "bfloat16": 2, "fp32": 4, "float32": 4}
KV_CACHE_BYTES = 1 * GIB  # the ov backend's KV cache (`cache_gb`), about as much as hf's at these lengths
RESERVED_BYTES = 3 * GIB  # the interpreter, torch, tokenizers, the retriever's index and the OS


@dataclass(frozen=True)
class Engine:
    model: str
    backend: str  # resolved: ov, hf, openai or vllm
    params: int | None
    bytes_per_weight: int

    @property
    def bytes(self) -> int:
        if self.backend not in ("ov", "hf") or not self.params:
            return 0
        return self.params * self.bytes_per_weight + KV_CACHE_BYTES


def engine(model: str, backend: str, params: int | None, ov_precision: str, dtype: str | None) -> Engine:
    precision = ov_precision if backend == "ov" else (dtype if dtype not in (None, "auto") else "fp32")
    return Engine(model, backend, params, BYTES_PER_WEIGHT.get(str(precision), 4))


def memory_problem(engines: Iterable[Engine], total_bytes: int) -> str | None:
    """None when the engines and what else a run holds fit `total_bytes`, else one line saying what does
    not fit and what would."""
    engines = [e for e in engines if e.bytes]
    need = sum(e.bytes for e in engines) + RESERVED_BYTES
    if need <= total_bytes:
        return None
    parts = " + ".join(f"{e.model} on {e.backend} {e.bytes / GIB:.1f} GiB" for e in engines)
    return (
        f"the run's engines need about {need / GIB:.1f} GiB ({parts} + {RESERVED_BYTES / GIB:.0f} GiB for "
        f"the rest) and this machine has {total_bytes / GIB:.1f} GiB: run a role on a smaller model, use "
        "ov_precision: int8, or serve a model (backend: openai)"
    )
