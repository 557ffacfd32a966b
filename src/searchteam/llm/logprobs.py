"""Logprobs of chosen tokens without materializing full-sequence logits.

A causal LM's logits over a whole batch cost B·T·V floats (49k-152k vocabulary): for a batch of long
agent prompts that is gigabytes. Only the completion positions are needed, so we run the decoder, pick
the hidden states at those positions and project just them through the LM head (B·C·V floats). This
holds for decoder-only models whose logits are `lm_head(last_hidden_state)` (Llama, Qwen, SmolLM, Mistral);
models that rescale or soft-cap logits after the head are not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

EntropyMode = Literal["none", "detached", "grad"]


def chosen_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(x_{p+1} | x_{≤p}) in fp32 for each position p in `positions` [B, C] of the right-padded
    `input_ids` [B, T], and the decoder's last hidden states [B, T, H] (for a critic head)."""
    out = chosen_token_stats(model, input_ids, attention_mask, positions, temperature)
    return out.logprobs, out.hidden


@dataclass
class TokenStats:
    """Per completion position [B, C]: the chosen token's logprob and, when asked for, the entropy of the
    (temperature-scaled) next-token distribution; plus the decoder's last hidden states [B, T, H]."""

    logprobs: torch.Tensor
    hidden: torch.Tensor
    entropy: torch.Tensor | None = None


def chosen_token_stats(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    temperature: float = 1.0,
    *,
    entropy: EntropyMode = "none",
) -> TokenStats:
    """`chosen_token_logprobs` plus, optionally, H = −Σ_v π(v) log π(v) at each completion position from the
    same projected logits: `"grad"` keeps it differentiable (entropy bonus), `"detached"` only measures it
    (no B·C·V tensors kept for the backward pass)."""
    hidden = model.get_decoder()(
        input_ids=input_ids, attention_mask=attention_mask, use_cache=False
    ).last_hidden_state
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
    logits = model.get_output_embeddings()(picked).float() / temperature
    tokens = input_ids.gather(1, positions + 1)
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, tokens[..., None]).squeeze(-1) - log_norm
    out = TokenStats(logprobs, hidden)
    if entropy != "none":
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "grad"):
            out.entropy = token_entropy(logits)
    return out


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
