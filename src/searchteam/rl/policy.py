"""The trainable policy: one causal LM shared by all roles (full fine-tuning or one LoRA adapter, M-ASK's
parameter sharing), or one LoRA adapter per role on one frozen backbone (DAC), plus an optional critic head
for PPO. Computes per-token logprobs (and per-turn values) for right-padded micro-batches."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from searchteam.llm.logprobs import EntropyMode, chosen_token_stats, decoder_hidden
from searchteam.llm.prefix_tree import PrefixTree, enable_tree_attention
from searchteam.rl.config import Critic, TrainConfig
from searchteam.rl.experience import Batch
from searchteam.rl.model_setup import (
    Mode,
    enable_activation_checkpointing,
    frozen_copy,
    load_model,
    mode_of,
    name_preset_base,
    process_device,
    read_full_checkpoint,
    trainable_copy,
    with_lora,
)

SHARED_ADAPTER = "policy"
CRITIC_ADAPTER = "critic"  # the separate value model's LoRA adapter (critic="separate")


class Policy(nn.Module):
    """Wraps a transformers causal LM. In `role_lora` mode adapters are named after roles and `activate(role)`
    selects one; a micro-batch must then hold a single role."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer,
        *,
        mode: Mode = "lora",
        roles: Sequence[str] = (),
        lora_r: int = 16,
        lora_alpha: int = 32,
        lora_dropout: float = 0.0,
        lora_targets: Sequence[str] = ("q_proj", "v_proj"),
        value_head: bool = False,
        critic: Critic = "head",
        reference: bool = False,
        temperature: float = 1.0,
        gradient_checkpointing: bool = False,
        share_prefixes: bool = False,
    ) -> None:
        """`value_head` adds a critic. `critic="head"` puts it on the policy's own last hidden state (the
        value loss then also trains the policy's weights); `critic="separate"` gives it a value model of
        its own, the paper's V_φ (M-ASK Eq. 5): a LoRA adapter `critic` on the shared frozen backbone, or
        with full fine-tuning a trainable copy of the model (its unused LM head frozen).
        `gradient_checkpointing` recomputes each layer's activations in the backward pass;
        `share_prefixes` lets a forward pass take a packed row of shared prefixes (`Batch.tree`)."""
        super().__init__()
        if mode == "role_lora" and not roles:
            raise ValueError("role_lora needs the role names (one adapter per role)")
        bad = [r for r in roles if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", r) or r.startswith("lora")]
        if mode == "role_lora" and bad:
            raise ValueError(f"role names {bad} cannot name LoRA adapters: use letters, digits, '_' or '-'")
        if mode == "role_lora" and CRITIC_ADAPTER in roles:
            raise ValueError(f"a role may not be named '{CRITIC_ADAPTER}': that adapter is the critic's")
        self.tokenizer = tokenizer
        self.mode: Mode = mode
        self.roles = sorted(roles) if mode == "role_lora" else []
        self.temperature = temperature
        if share_prefixes:
            enable_tree_attention(model)
        self.ref_model = frozen_copy(model) if reference and mode == "full" else None
        separate = value_head and critic == "separate"
        self.critic_model = trainable_copy(model) if separate and mode == "full" else None
        if gradient_checkpointing:
            context = None if mode == "full" else self._adapter_of_forward
            for trained in (model, self.critic_model):
                if trained is not None:
                    enable_activation_checkpointing(trained, context)
        adapters = [*self.roles] or [SHARED_ADAPTER]
        if separate and mode != "full":
            adapters.append(CRITIC_ADAPTER)
        self.model = (
            model
            if mode == "full"
            else with_lora(model, adapters, lora_r, lora_alpha, lora_dropout, lora_targets)
        )
        self.separate_critic = separate
        hidden = model.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=torch.float32) if value_head else None
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        self._trainable = self._trainable_names()
        self._params = dict(self.named_parameters())

    def _trainable_names(self) -> list[str]:
        names = []
        for name, param in self.named_parameters():
            if name.startswith("ref_model."):
                continue
            if name.startswith("critic_model.lm_head."):  # the value model reads hidden states only
                param.requires_grad_(False)
                continue
            if self.mode == "full" or "lora_" in name or name.startswith("value_head."):
                names.append(name)
                param.requires_grad_(True)
            else:
                param.requires_grad_(False)
        return names

    @property
    def deterministic(self) -> bool:
        """Whether a training-mode forward pass computes what an evaluation one does (no dropout), so that
        the first optimizer step's own logprobs are π_old's."""
        dropout = any(isinstance(m, nn.Dropout) and m.p > 0 for m in self.modules())
        return not dropout and not getattr(self.model.config, "attention_dropout", 0.0)

    def activate(self, role: str | None) -> None:
        """Select the adapter that generates and is trained for `role` (no-op unless per-role LoRA)."""
        if self.mode != "role_lora":
            return
        if role not in self.roles:
            raise KeyError(f"no LoRA adapter for role '{role}'; adapters exist for: {', '.join(self.roles)}")
        self._set_adapter(role)

    def _set_adapter(self, name: str) -> None:
        self.model.set_adapter(name)
        for param in self._trainable:  # peft froze the other adapters; they keep training on their turns
            self._params[param].requires_grad_(True)

    @contextmanager
    def _using_adapter(self, name: str) -> Iterator[None]:
        """The LoRA adapter `name` active inside the block, the previous one after it."""
        active = self.model.active_adapter
        if active == name:
            yield
            return
        self._set_adapter(name)
        try:
            yield
        finally:
            self._set_adapter(active)

    def _adapter_of_forward(self) -> tuple[AbstractContextManager, AbstractContextManager]:
        """Activation checkpointing's `context_fn`: a layer's backward-time recomputation runs with the
        LoRA adapter that was active when the layer ran forward (the critic pass switches adapters, and its
        backward comes after the policy's adapter is back)."""
        return nullcontext(), self._using_adapter(self.model.active_adapter)

    def param_groups(
        self, lr: float, role_lr: dict[str, float] | None = None, value_lr: float | None = None
    ) -> list[dict]:
        """Optimizer parameter groups: one per role adapter (own learning rate) or one for the shared
        policy, and one for the critic head."""
        role_lr = role_lr or {}
        unknown = set(role_lr) - set(self.roles)
        if unknown:
            raise KeyError(f"role_lr names roles without an adapter: {sorted(unknown)}; roles: {self.roles}")
        params = dict(self.named_parameters())
        value = [params[n] for n in self._trainable if _is_critic(n)]
        policy = [n for n in self._trainable if not _is_critic(n)]
        groups: list[dict] = []
        if self.mode == "role_lora":
            for role in self.roles:
                names = [n for n in policy if f".{role}." in n]
                groups.append(
                    {"name": role, "params": [params[n] for n in names], "lr": role_lr.get(role, lr)}
                )
        else:
            groups.append({"name": SHARED_ADAPTER, "params": [params[n] for n in policy], "lr": lr})
        if value:
            groups.append({"name": "value", "params": value, "lr": value_lr or lr})
        return groups

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        target_index: torch.Tensor,
        value_index: torch.Tensor,
        entropy: EntropyMode = "none",
        critic: bool = True,
        mask: torch.Tensor | None = None,
        tree: PrefixTree | None = None,
        target_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Per-token logprobs [B, C] of the completion tokens (temperature-scaled, as sampled), with a
        critic head the value [B] of each turn's observation (unless `critic=False`: SFT micro-batches),
        and on request the per-token entropy [B, C] of the sampling distribution (`chosen_token_stats`).
        Where `mask` [B, C] (the loss mask) is 0, both are 0 and cost no projection. With a `tree` the
        batch is its packed row and `target_ids` [B, C] are the completion tokens (`Batch`)."""
        out = chosen_token_stats(
            self.model,
            input_ids,
            attention_mask,
            target_index,
            self.temperature,
            entropy=entropy,
            mask=mask,
            tree=tree,
            tokens=target_ids,
        )
        if self.value_head is None or not critic:
            return out.logprobs, None, out.entropy
        hidden = self._critic_hidden(input_ids, attention_mask, tree) if self.separate_critic else out.hidden
        if tree is None:
            picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), value_index]
        else:
            picked = hidden[0, value_index]
        values = self.value_head(picked.float()).squeeze(-1)
        return out.logprobs, values, out.entropy

    def _critic_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, tree: PrefixTree | None
    ) -> torch.Tensor:
        """Last hidden states of the separate value model: its own model copy, or the backbone with the
        critic adapter switched in for this one pass (then the generating adapter is restored)."""
        if self.critic_model is not None:
            return decoder_hidden(self.critic_model, input_ids, attention_mask, tree)
        with self._using_adapter(CRITIC_ADAPTER):
            return decoder_hidden(self.model, input_ids, attention_mask, tree)

    @torch.no_grad()
    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Logprobs under the frozen initial policy: the backbone with adapters disabled, or a frozen copy."""
        if self.mode == "full":
            if self.ref_model is None:
                raise RuntimeError("full fine-tuning with a KL penalty needs Policy(..., reference=True)")
            model, disabled = self.ref_model, nullcontext()
        else:
            model, disabled = self.model, self.model.disable_adapter()
        with disabled:
            out = chosen_token_stats(
                model,
                batch.input_ids,
                batch.attention_mask,
                batch.target_index,
                self.temperature,
                mask=batch.loss_mask,
                tree=batch.tree,
                tokens=batch.target_ids,
            )
        return out.logprobs

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Every trained tensor (all adapters, or all weights, plus the critic head), detached copies."""
        params = dict(self.named_parameters())
        return {n: params[n].detach().cpu().clone() for n in self._trainable}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor], policy_only: bool = False) -> None:
        """Copy `state` into the trained tensors; every one must match. `policy_only` loads the generating
        weights alone: critic tensors in `state` are dropped and this policy's critic keeps its own (a
        warm start, saved with or without a critic, then serves an RL stage with or without one)."""
        if policy_only:
            state = {n: t for n, t in state.items() if not _is_critic(n)}
        expected = [n for n in self._trainable if not (policy_only and _is_critic(n))]
        missing = set(expected) - set(state)
        unexpected = set(state) - set(expected)
        if missing or unexpected:
            raise ValueError(
                f"checkpoint does not match this policy (mode={self.mode}, roles={self.roles}): "
                f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
            )
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, tensor in state.items():
                params[name].copy_(tensor)

    def save(self, directory: Path) -> None:
        """LoRA: `adapters/` (peft format, one sub-folder per extra adapter) plus `trainable.pt` (adapters and
        critic, for exact resume). Full fine-tuning: `model/` (`save_pretrained` and tokenizer) plus
        `value_head.pt` when there is a critic."""
        directory.mkdir(parents=True, exist_ok=True)
        if self.mode == "full":
            self.model.save_pretrained(directory / "model")
            self.tokenizer.save_pretrained(directory / "model")
            if self.value_head is not None:
                torch.save(self.value_head.state_dict(), directory / "value_head.pt")
            if self.critic_model is not None:
                self.critic_model.save_pretrained(directory / "critic")
            return
        self.save_adapters(directory / "adapters")
        torch.save(self.trainable_state_dict(), directory / "trainable.pt")

    def save_adapters(self, directory: Path) -> dict[str, Path]:
        """The generating LoRA adapters (not the critic's) in peft format, one folder each. Returns what an
        inference engine loads: `{role: folder}` with one adapter per role, `{"": folder}` if shared."""
        generating = [a for a in self.model.peft_config if a != CRITIC_ADAPTER]
        self.model.save_pretrained(directory, selected_adapters=generating)
        for config in directory.glob("*/adapter_config.json"):
            name_preset_base(config)
        if self.mode == "role_lora":
            return {name: directory / name for name in generating}
        return {"": directory / SHARED_ADAPTER}

    def load(self, directory: Path, policy_only: bool = False) -> None:
        """Restore what `save` wrote into this (identically configured) policy; `policy_only`: see
        `load_trainable_state_dict`."""
        if self.mode != "full":
            state = torch.load(directory / "trainable.pt", weights_only=True)
            self.load_trainable_state_dict(state, policy_only)
            return
        head = self.value_head is not None and not policy_only
        state = read_full_checkpoint(directory, head, self.critic_model is not None and not policy_only)
        self.load_trainable_state_dict({k: v for k, v in state.items() if k in self._params}, policy_only)

    def load_initial(self, checkpoint: Path) -> None:
        """Start from another run's policy weights (`init_from`): the `policy/` of a `searchteam train`
        checkpoint or warm-start round, or of a shipped adapter, which holds only its peft adapters. The
        critic, if any, keeps its initial values."""
        directory = checkpoint / "policy"
        if self.mode == "full" or (directory / "trainable.pt").exists():
            self.load(directory, policy_only=True)
        else:
            self.load_peft_adapters(directory / "adapters")

    def load_peft_adapters(self, directory: Path) -> None:
        """Copy peft-format adapters (`directory/NAME/adapter_model.safetensors`, as `save_adapters` writes
        them) into the adapters of the same names; they must be exactly this policy's generating adapters,
        of the same rank and target modules."""
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        folders = sorted(p.parent for p in directory.glob("*/adapter_model.safetensors"))
        found = {p.name for p in folders}
        wanted = {a for a in self.model.peft_config if a != CRITIC_ADAPTER}
        if found != wanted:
            raise ValueError(
                f"adapters in {directory} are {sorted(found) or 'none'}; this policy (mode={self.mode}) "
                f"trains {sorted(wanted)}"
            )
        for folder in folders:
            state = load_file(folder / "adapter_model.safetensors")
            try:
                result = set_peft_model_state_dict(self.model, state, adapter_name=folder.name)
            except RuntimeError as err:  # a size mismatch: another lora_r
                raise ValueError(f"adapter {folder} does not fit this policy's LoRA layout: {err}") from err
            missing = [k for k in result.missing_keys if f".{folder.name}." in k]
            if result.unexpected_keys or missing:
                raise ValueError(
                    f"adapter {folder} does not match this policy's LoRA targets: "
                    f"missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
                )


def _is_critic(name: str) -> bool:
    """Whether a trainable tensor belongs to the critic (head, separate model or critic adapter)."""
    return name.startswith(("value_head.", "critic_model.")) or f".{CRITIC_ADAPTER}." in name


def build_policy(model: nn.Module, tokenizer, config: TrainConfig, temperature: float = 1.0) -> Policy:
    """The policy a TrainConfig describes (critic head only for GAE; reference copy only with a KL term),
    scoring at the rollouts' sampling `temperature`."""
    return Policy(
        model,
        tokenizer,
        mode=mode_of(config),
        roles=config.roles,
        lora_r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        lora_targets=config.lora_targets,
        value_head=config.uses_critic,
        critic=config.critic,
        reference=config.kl_coef > 0,
        temperature=temperature,
        gradient_checkpointing=config.gradient_checkpointing,
        share_prefixes=config.share_prefixes,
    )


def load_policy(
    name: str,
    config: TrainConfig,
    device: str | torch.device | None = None,
    dtype: str | None = None,
    temperature: float = 1.0,
) -> Policy:
    """Load a preset or Hugging Face model by name (`model_setup.load_model`) and wrap it, on `device` (a
    training run passes its accelerator's: `cuda:<local rank>` under several processes)."""
    place = process_device(device)
    model, tokenizer = load_model(name, config, place, dtype)
    return build_policy(model, tokenizer, config, temperature).to(place)
