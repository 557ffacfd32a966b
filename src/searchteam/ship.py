"""`searchteam ship-adapter`: copy the LoRA adapters of a `searchteam train` checkpoint into the package as a
named trained adapter (`methods/METHOD/adapters/NAME/`, which `--model NAME` selects), with fp16 weights:
half the size, and LoRA's low-rank factors lose nothing that matters to int8 or bf16 inference. Its card
(`adapter.yaml`: base, recipe, description; for a composed team's part, its team) comes from the run's config.

    searchteam ship-adapter runs/i10/jade-ws/warm_start/round-01 qwen2.5-coder-0.5b-jade
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import load_file, save_file

from searchteam.config import read_yaml
from searchteam.errors import ShipError
from searchteam.llm.models import ADAPTER_CARD
from searchteam.methods import get_method


def ship(checkpoint: Path, name: str, into: Path | None = None) -> Path:
    """Write every role adapter of `checkpoint` (`policy/adapters/ROLE`) to `into/name` in fp16 (by default
    under the adapters folder of the method that trained it), replacing an earlier adapter of that name, with
    its card when the run's config is found; returns the folder written."""
    if not name or Path(name).name != name or name in (".", ".."):
        raise ShipError(f"adapter name {name!r}: use a plain folder name such as qwen2.5-coder-0.5b-jade")
    configs = sorted((checkpoint / "policy" / "adapters").glob("*/adapter_config.json"))
    if not configs:
        raise ShipError(f"{checkpoint} holds no LoRA adapters (policy/adapters/ROLE/adapter_config.json)")
    unweighted = [c.parent for c in configs if not (c.parent / "adapter_model.safetensors").is_file()]
    if unweighted:
        raise ShipError(f"{unweighted[0]} has an adapter_config.json but no adapter_model.safetensors")
    run = run_config(checkpoint)
    if into is None:
        if run is None:
            raise ShipError(
                f"{checkpoint} is not in a run folder (no config.yaml two levels up): name the folder to "
                "write to with --into"
            )
        into = adapters_folder(run)
    target = into / name  # by default the source tree under the editable install
    shutil.rmtree(target, ignore_errors=True)
    for config in configs:
        role = target / "policy" / "adapters" / config.parent.name
        role.mkdir(parents=True)
        shutil.copy(config, role / "adapter_config.json")
        weights = load_file(config.parent / "adapter_model.safetensors")
        save_file({k: v.to(torch.float16) for k, v in weights.items()}, role / "adapter_model.safetensors")
    if run is not None:
        card = {"base": run.get("model"), "recipe": run.get("recipe") or "", "description": ""}
        method = get_method(str(run.get("method")))
        if getattr(method.team, "spec", None) is not None:  # its runs of that team take the card's settings
            card["team"] = method.name
        (target / ADAPTER_CARD).write_text(yaml.safe_dump(card, sort_keys=False), encoding="utf-8")
    return target


def adapters_folder(run: dict[str, Any]) -> Path:
    """Where a run's adapter ships, so `--model NAME` finds it: its method's adapters folder; for a composed
    team, that of the method of the part it trained (`reward.train`)."""
    method = get_method(str(run.get("method")))
    spec = getattr(method.team, "spec", None)
    if spec is None:
        return method.folder / "adapters"
    from searchteam.methods.composed import trained_parts

    train = (run.get("reward") or {}).get("train", "")
    trained = sorted({part.method for part in trained_parts(spec, train)[1]})
    if len(trained) != 1:
        raise ShipError(
            f"{method.name} trained {' and '.join(trained) or 'no part'}: say where the adapter goes with "
            "--into (e.g. src/searchteam/methods/METHOD/adapters)"
        )
    return get_method(trained[0]).folder / "adapters"


def run_config(checkpoint: Path) -> dict[str, Any] | None:
    """The config of the run a checkpoint belongs to (`RUN/checkpoints/step-N` or `RUN/warm_start/round-NN`),
    or None outside a run folder."""
    path = checkpoint.resolve().parent.parent / "config.yaml"
    if not path.is_file():
        return None
    config = read_yaml(path)
    return config if isinstance(config, dict) else None
