"""`searchteam ship-adapter`: copy the LoRA adapters of a `searchteam train` checkpoint into the package as a
named trained adapter (`src/searchteam/adapters/NAME`, selected by `--model NAME` once registered in
`searchteam.llm.models.TRAINED`), with fp16 weights: half the size, and LoRA's low-rank factors lose nothing
that matters to int8 or bf16 inference.

    searchteam ship-adapter runs/i10/jade-ws/warm_start/round-01 qwen2.5-coder-0.5b-jade
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from searchteam.errors import ShipError
from searchteam.llm.models import TRAINED_DIR


def ship(checkpoint: Path, name: str, into: Path = TRAINED_DIR) -> Path:
    """Write every role adapter of `checkpoint` (`policy/adapters/ROLE`) to `into/name` in fp16, replacing
    an earlier adapter of that name; returns the folder written."""
    if not name or Path(name).name != name or name in (".", ".."):
        raise ShipError(f"adapter name {name!r}: use a plain folder name such as qwen2.5-coder-0.5b-jade")
    configs = sorted((checkpoint / "policy" / "adapters").glob("*/adapter_config.json"))
    if not configs:
        raise ShipError(f"{checkpoint} holds no LoRA adapters (policy/adapters/ROLE/adapter_config.json)")
    unweighted = [c.parent for c in configs if not (c.parent / "adapter_model.safetensors").is_file()]
    if unweighted:
        raise ShipError(f"{unweighted[0]} has an adapter_config.json but no adapter_model.safetensors")
    target = into / name  # by default the source tree under the editable install
    shutil.rmtree(target, ignore_errors=True)
    for config in configs:
        role = target / "policy" / "adapters" / config.parent.name
        role.mkdir(parents=True)
        shutil.copy(config, role / "adapter_config.json")
        weights = load_file(config.parent / "adapter_model.safetensors")
        save_file({k: v.to(torch.float16) for k, v in weights.items()}, role / "adapter_model.safetensors")
    return target
