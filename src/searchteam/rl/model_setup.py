"""The transformers model a `Policy` wraps, prepared: the device and weight dtype of a model being trained,
frozen and trainable copies, LoRA adapters, activation checkpointing, and a saved adapter's base named by
its preset."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from searchteam.rl.config import TrainConfig

Mode = Literal["full", "lora", "role_lora"]  # what a Policy trains: all weights, one LoRA, one LoRA per role


def mode_of(config: TrainConfig) -> Mode:
    if config.full_ft:
        return "full"
    return "role_lora" if config.lora_per_role else "lora"


def name_preset_base(adapter_config: Path) -> None:
    """Name a preset base model by its preset name, not by this machine's cache path, so the adapter loads
    anywhere the preset does."""
    from searchteam.llm.models import preset_of

    config = json.loads(adapter_config.read_text())
    preset = preset_of(config.get("base_model_name_or_path") or "")
    if preset is not None:
        adapter_config.write_text(json.dumps({**config, "base_model_name_or_path": preset}, indent=2))


def trainable_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)


def frozen_copy(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def with_lora(
    model: nn.Module, names: Sequence[str], r: int, alpha: int, dropout: float, targets: Sequence[str]
) -> nn.Module:
    """The model with one LoRA adapter per name; the first one is active."""
    from peft import LoraConfig, get_peft_model

    def config() -> LoraConfig:
        return LoraConfig(
            r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), task_type="CAUSAL_LM"
        )

    peft_model = get_peft_model(model, config(), adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, config())
    peft_model.set_adapter(names[0])
    return peft_model


def process_device(device: str | torch.device | None) -> torch.device:
    """Where this process's model lives: a given torch device (the training run's accelerator device:
    `cuda:<local rank>` under several processes), else the named or best device."""
    from searchteam.llm.hf import pick_device

    return device if isinstance(device, torch.device) else torch.device(pick_device(device))


def weight_dtype(config: TrainConfig, dtype: torch.dtype) -> torch.dtype:
    """The dtype to load trained weights in. Full fine-tuning keeps fp32 master weights: AdamW's per-step
    change (≈ lr = 1e-6) is far below half a bf16 ulp of a weight of size 0.01 (≈ 3e-5), so in pure bf16
    almost every update rounds away. Half precision then comes from autocast: `mixed_precision` bf16/fp16
    (a warning when it is missing, and the run computes in fp32). LoRA adapters are fp32 in peft anyway,
    so their frozen backbone may stay in `dtype`."""
    if not config.full_ft or dtype == torch.float32:
        return dtype
    wanted = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)
    if config.mixed_precision != wanted:
        warnings.warn(
            f"full fine-tuning keeps fp32 weights instead of {dtype}; set train.mixed_precision: "
            f"{wanted} to compute in half precision (now: '{config.mixed_precision}')",
            stacklevel=3,
        )
    return torch.float32


def enable_activation_checkpointing(model: nn.Module, context_fn=None) -> None:
    """Recompute each layer's activations in the backward pass (non-reentrant; `context_fn` as in
    `torch.utils.checkpoint`; transformers ≥ 5.x renamed the method)."""
    kwargs = {"use_reentrant": False} | ({"context_fn": context_fn} if context_fn else {})
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def read_full_checkpoint(directory: Path, value_head: bool, critic: bool) -> dict[str, torch.Tensor]:
    """The tensors a full fine-tuning `Policy.save` wrote in `directory`, named as the policy's parameters:
    the model's, with the value head's and the separate critic's when asked for."""
    from safetensors.torch import load_file

    files = sorted((directory / "model").glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no model weights (*.safetensors) in {directory / 'model'}")
    state = {f"model.{k}": v for f in files for k, v in load_file(f).items()}
    if value_head:
        head = torch.load(directory / "value_head.pt", weights_only=True)
        state.update({f"value_head.{k}": v for k, v in head.items()})
    if critic:
        for f in sorted((directory / "critic").glob("*.safetensors")):
            state.update({f"critic_model.{k}": v for k, v in load_file(f).items()})
    return state


def load_model(
    name: str, config: TrainConfig, place: torch.device, dtype: str | None
) -> tuple[nn.Module, Any]:
    """A preset or Hugging Face model by name (see `searchteam.llm.models`) and its tokenizer (padding with
    its end-of-sequence token where it has no pad token). Full fine-tuning loads fp32 weights whatever
    `dtype` says (`weight_dtype`); LoRA keeps a `dtype` backbone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from searchteam.llm.hf import pick_dtype
    from searchteam.llm.models import resolve_model

    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    weights = weight_dtype(config, pick_dtype(dtype, place.type, training=True))
    return AutoModelForCausalLM.from_pretrained(path, dtype=weights), tokenizer
