"""Logprobs of chosen tokens without materializing full-sequence logits.

A causal LM's logits over a whole batch cost B·T·V floats (49k-152k vocabulary): for a batch of long
agent prompts that is gigabytes. Only the completion positions are needed, so we run the decoder, pick
the hidden states at those positions (only the trained ones, given a mask) and project just them through
the LM head, in fp32 (a bf16 logit of magnitude 20 is only good to ±0.06; the head's weight is cast once
per pass) and a fixed chunk of positions at a time: the forward pass holds one chunk's logits, and the
backward pass recomputes each chunk's logits (activation checkpointing) instead of keeping B·C·V floats
alive. The entropy of the next-token distribution is computed only when asked for.
This holds for decoder-only models whose logits are `lm_head(last_hidden_state)` (Llama, Qwen, SmolLM,
Mistral); models that rescale or soft-cap logits after the head are not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from searchteam.llm.prefix_tree import PrefixTree, uses_tree_attention

EntropyMode = Literal["none", "detached", "grad"]
Weights = tuple[torch.Tensor, torch.Tensor | None]

# Positions projected at once: 256 × 151936 (Qwen's vocabulary) fp32 logits are 156 MB.
CHUNK_POSITIONS = 256


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
    mask: torch.Tensor | None = None,
    chunk_positions: int = CHUNK_POSITIONS,
    tree: PrefixTree | None = None,
    tokens: torch.Tensor | None = None,
) -> TokenStats:
    """`chosen_token_logprobs` plus, optionally, H = −Σ_v π(v) log π(v) at each completion position:
    `"grad"` keeps it differentiable (entropy bonus), `"detached"` only measures it. `mask` [B, C] (e.g. the
    loss mask) skips the positions where it is 0 (padding, environment text): their logprob and entropy
    are 0 and they cost no projection. With a `tree` (a packed row of shared prefixes, `input_ids` its
    row), `positions` index the row and `tokens` [B, C] are the chosen tokens; `hidden` is then [1, N, H]."""
    hidden = decoder_hidden(model, input_ids, attention_mask, tree)
    if tree is None:
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        tokens = input_ids.gather(1, positions + 1) if tokens is None else tokens
    elif tokens is None:
        raise ValueError("a packed row needs the chosen tokens")
    else:
        picked = hidden[0][positions]
    logprobs, ent = projected_stats(
        model.get_output_embeddings(),
        picked,
        tokens,
        temperature,
        entropy=entropy,
        mask=mask,
        chunk_positions=chunk_positions,
    )
    return TokenStats(logprobs, hidden, ent)


def decoder_hidden(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, tree: PrefixTree | None = None
) -> torch.Tensor:
    """The decoder's last hidden states of a right-padded batch [B, T, H], or of a packed row [1, N, H]."""
    if tree is None:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "use_cache": False}
    elif not uses_tree_attention(model):
        raise ValueError("this model cannot forward a packed row: call enable_tree_attention(model) first")
    else:
        inputs = tree.decoder_kwargs
    return model.get_decoder()(**inputs).last_hidden_state


def projected_stats(
    head: nn.Module,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    *,
    entropy: EntropyMode = "none",
    mask: torch.Tensor | None = None,
    chunk_positions: int = CHUNK_POSITIONS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of `tokens` [B, C] and (if asked) entropy under softmax(head(hidden) / temperature) for
    hidden states [B, C, H], projected in fp32 `chunk_positions` positions at a time."""
    batch_shape = tokens.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_tokens = tokens.reshape(-1)
    keep = None if mask is None else mask.reshape(-1).nonzero().squeeze(-1)
    if keep is not None:
        flat_hidden, flat_tokens = flat_hidden[keep], flat_tokens[keep]
    weights = fp32_weights(head) if isinstance(head, nn.Linear) else None  # cast once, not per chunk
    project = _stats
    if torch.is_grad_enabled() and (
        flat_hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    ):  # each chunk's logits are recomputed at backward time, not stored
        project = partial(checkpoint, _stats, use_reentrant=False)
    pieces = [
        project(
            head,
            weights,
            flat_hidden[i : i + chunk_positions],
            flat_tokens[i : i + chunk_positions],
            temperature,
            entropy,
        )
        for i in range(0, flat_tokens.numel(), chunk_positions)
    ]
    logprobs = _join([p[0] for p in pieces], flat_hidden.device)
    ent = _join([p[1] for p in pieces], flat_hidden.device) if entropy != "none" else None
    if keep is not None:
        logprobs = _scatter(logprobs, keep, batch_shape.numel())
        ent = None if ent is None else _scatter(ent, keep, batch_shape.numel())
    return logprobs.view(batch_shape), None if ent is None else ent.view(batch_shape)


def _stats(
    head: nn.Module,
    weights: Weights | None,
    hidden: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float,
    entropy: EntropyMode,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = fp32_logits(head, hidden, weights)
    if temperature != 1.0:
        logits.div_(temperature)  # in place: the projection does not keep its output for backward
    logprobs = logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    if entropy == "none":
        return logprobs, None
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "grad"):
        return logprobs, token_entropy(logits)


def fp32_weights(head: nn.Linear) -> Weights:
    """A linear head's weight and bias in fp32 (the tensors themselves when they already are)."""
    return head.weight.float(), None if head.bias is None else head.bias.float()


def fp32_logits(head: nn.Module, hidden: torch.Tensor, weights: Weights | None = None) -> torch.Tensor:
    """head(hidden) computed in fp32 whatever the weights' dtype or an enclosing autocast: bf16 × bf16
    products are exact in fp32, so this equals the full-precision logits of the bf16 model. `weights`: a
    linear head's `fp32_weights`, cast beforehand."""
    with torch.autocast(hidden.device.type, enabled=False):
        if isinstance(head, nn.Linear):
            weight, bias = weights or fp32_weights(head)
            return F.linear(hidden.float(), weight, bias)
        weight = next(head.parameters())  # a wrapped head (e.g. a LoRA layer): run it, upcast the output
        return head(hidden.to(weight.dtype)).float()


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def _join(parts: list[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    tensors = [p for p in parts if p is not None]
    return torch.cat(tensors) if tensors else torch.zeros(0, device=device)


def _scatter(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """A length-`size` vector holding `values` at `index` and 0 elsewhere (differentiable in `values`)."""
    return torch.zeros(size, dtype=values.dtype, device=values.device).index_copy(0, index, values)
