"""Copy the LoRA adapters of a `searchteam train` checkpoint into the package as a named trained adapter
(`src/searchteam/adapters/NAME`, registered in `searchteam.llm.models.TRAINED`), with fp16 weights: half
the size, and LoRA's low-rank factors lose nothing that matters to int8 or bf16 inference.

    python scripts/ship_adapter.py runs/i10/jade-ws/warm_start/round-01 qwen2.5-coder-0.5b-jade
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from searchteam.llm.models import TRAINED_DIR


def ship(checkpoint: Path, name: str) -> Path:
    configs = sorted((checkpoint / "policy" / "adapters").glob("*/adapter_config.json"))
    if not configs:
        raise SystemExit(f"{checkpoint} holds no LoRA adapters (policy/adapters/ROLE/adapter_config.json)")
    target = TRAINED_DIR / name  # the source tree under the editable install
    shutil.rmtree(target, ignore_errors=True)
    for config in configs:
        role = target / "policy" / "adapters" / config.parent.name
        role.mkdir(parents=True)
        shutil.copy(config, role / "adapter_config.json")
        weights = load_file(config.parent / "adapter_model.safetensors")
        save_file({k: v.to(torch.float16) for k, v in weights.items()}, role / "adapter_model.safetensors")
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint or warm-start round folder")
    parser.add_argument("name", help="the name it is selected by (--model NAME)")
    args = parser.parse_args()
    print(ship(args.checkpoint, args.name))


if __name__ == "__main__":
    main()
