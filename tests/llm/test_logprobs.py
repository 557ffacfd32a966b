"""Chunked fp32 logprobs and entropy against a second computation from the model's full-sequence logits,
values worked out by hand, gradients through LoRA and a trained head, and what the backward pass keeps."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from searchteam.llm.logprobs import chosen_token_stats, fp32_logits, projected_stats, token_entropy
from tests.support.helpers import assert_close_scaled

VOCAB = 97


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_llama(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():  # a spread of logits like a trained model's, not a near-uniform one
        model.lm_head.weight.mul_(40.0)
    return model.eval()


def batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two right-padded rows (lengths 12 and 9) and the positions whose next tokens are scored, the
    second row's completion padded with position 0."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    ids[1, 9:], mask[1, 9:] = 0, 0
    positions = torch.tensor([[4, 5, 6, 7, 8, 9, 10], [5, 6, 7, 0, 0, 0, 0]])
    return ids, mask, positions


def reference(model: nn.Module, ids, mask, positions, temperature: float):
    """The straightforward way: every position's logits from the model's own forward, then pick."""
    logits = model(input_ids=ids, attention_mask=mask).logits.float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    rows = torch.arange(ids.shape[0])[:, None]
    picked = logp[rows, positions]
    chosen = picked.gather(-1, ids.gather(1, positions + 1)[..., None]).squeeze(-1)
    return chosen, -(picked.exp() * picked).sum(-1)


@pytest.mark.parametrize("chunk", [1, 3, 256])
def test_chunked_logprobs_and_entropy_equal_full_logits(chunk: int):
    model = tiny_llama()
    ids, mask, positions = batch()
    with torch.no_grad():
        out = chosen_token_stats(model, ids, mask, positions, 0.7, entropy="detached", chunk_positions=chunk)
        want_lp, want_ent = reference(model, ids, mask, positions, 0.7)
    assert out.logprobs.dtype == torch.float32 and out.logprobs.shape == positions.shape
    # both round like the logits, whose range the lowest logprob shows (-26): fp32 reorderings move them
    # ~2e-7 of it, a wrong position or temperature by whole nats
    scale = want_lp.abs().max()
    assert_close_scaled(out.logprobs, want_lp, scale=scale)
    assert_close_scaled(out.entropy, want_ent, scale=scale)
    assert out.logprobs.min() < -1.0 and out.entropy.max() > 0.1  # not a degenerate distribution


def test_values_by_hand():
    head = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    # logits [ln 2, 0, 0] -> π = [1/2, 1/4, 1/4]; H = ½ ln 2 + 2·¼ ln 4 = 1.5 ln 2
    hidden = torch.tensor([[[math.log(2), 0.0], [math.log(2), 0.0]]])
    lp, ent = projected_stats(head, hidden, torch.tensor([[0, 2]]), entropy="detached")
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.5), math.log(0.25)]]))
    torch.testing.assert_close(ent, torch.full((1, 2), 1.5 * math.log(2)))
    # temperature 2: logits [2 ln 3, 0, 0] / 2 -> π = [3/5, 1/5, 1/5]
    lp, ent = projected_stats(head, torch.tensor([[[2 * math.log(3), 0.0]]]), torch.tensor([[1]]), 2.0)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.2)]]))
    assert ent is None


def test_mask_skips_positions():
    model = tiny_llama()
    ids, mask, positions = batch()
    loss_mask = (positions > 0).float()
    loss_mask[0, 2] = 0.0  # an environment token inside a completion
    with torch.no_grad():
        full = chosen_token_stats(model, ids, mask, positions, entropy="detached", chunk_positions=2)
        part = chosen_token_stats(
            model, ids, mask, positions, entropy="detached", mask=loss_mask, chunk_positions=2
        )
    keep = loss_mask.bool()
    scale = full.logprobs[keep].abs().max()  # fewer positions projected: other shapes, other kernels
    assert_close_scaled(part.logprobs[keep], full.logprobs[keep], scale=scale)
    assert_close_scaled(part.entropy[keep], full.entropy[keep], scale=scale)
    assert (part.logprobs[~keep] == 0).all() and (part.entropy[~keep] == 0).all()


def lora(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(model, config)


def objective(lp: torch.Tensor, ent: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    weights = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp) * (positions > 0)
    return -(weights * lp).sum() - 0.3 * (ent * (positions > 0)).sum()


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("trained", ["lora", "full"])
def test_gradients_equal_full_logits(trained: str):
    """One loss (weighted logprobs plus an entropy bonus) differentiated through the chunked, recomputed
    projection and through the full-sequence logits: the same gradient on every trained weight (LoRA
    adapters; or every weight, the LM head included)."""
    ids, mask, positions = batch()
    found = []
    for way in ("chunked", "reference"):
        model = lora(tiny_llama()) if trained == "lora" else tiny_llama()
        if way == "chunked":
            out = chosen_token_stats(model, ids, mask, positions, 0.7, entropy="grad", chunk_positions=3)
            lp, ent = out.logprobs, out.entropy
        else:
            lp, ent = reference(model, ids, mask, positions, 0.7)
        objective(lp, ent, positions).backward()
        found.append(grads(model))
    chunked, want = found
    assert chunked.keys() == want.keys() and len(want) == (8 if trained == "lora" else 21)
    assert "lm_head.weight" in want or trained == "lora"
    for name in want:
        assert want[name].abs().max() > 0, name
        # relative to each tensor's largest entry: fp32 reorderings reach ~1e-6 of it (9e-5 on an
        # embedding gradient of scale 244), a dropped entropy term or temperature moves every tensor by >3%
        assert_close_scaled(chunked[name], want[name], rel=3e-5, msg=name)


def test_detached_entropy_carries_no_gradient():
    model = lora(tiny_llama())
    ids, mask, positions = batch()
    out = chosen_token_stats(model, ids, mask, positions, entropy="detached")
    assert out.logprobs.requires_grad and not out.entropy.requires_grad
    assert chosen_token_stats(model, ids, mask, positions).entropy is None


def test_bf16_backbone_is_projected_in_fp32():
    model = tiny_llama(torch.bfloat16)
    ids, mask, positions = batch()
    with torch.no_grad():
        out = chosen_token_stats(model, ids, mask, positions, entropy="detached")
        hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        rows = torch.arange(2)[:, None]
        h = hidden[rows, positions]
        tokens = ids.gather(1, positions + 1)[..., None]
        fp32 = torch.log_softmax(F.linear(h.float(), model.lm_head.weight.float()), -1)
        bf16 = torch.log_softmax(model.lm_head(h).float(), -1)  # the old way: bf16 logits, then cast
    assert out.hidden.dtype == torch.bfloat16 and out.logprobs.dtype == torch.float32
    want = fp32.gather(-1, tokens).squeeze(-1)
    # 4e-6 of the logprobs' scale (18): fp32 reorderings move them ~1e-7 of it, bf16 logits ~1e-3 (0.02)
    scale = want.abs().max()
    assert_close_scaled(out.logprobs, want, rel=4e-6, scale=scale)
    assert_close_scaled(out.entropy, token_entropy(fp32), rel=4e-6, scale=scale)
    assert (bf16.gather(-1, tokens).squeeze(-1) - out.logprobs).abs().max() > 1e-3


def test_projection_ignores_an_enclosing_autocast():
    head = nn.Linear(8, 50).to(torch.bfloat16)
    hidden = torch.randn(5, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = fp32_logits(head, hidden)
    want = F.linear(hidden.float(), head.weight.float(), head.bias.float())
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, want, atol=0, rtol=0)


def test_backward_keeps_no_full_logits():
    """What autograd saves for the backward pass is O(positions · hidden), not O(positions · vocabulary):
    each chunk's logits are recomputed at backward time."""
    head = nn.Linear(16, 1000)
    hidden = torch.randn(2, 64, 16, requires_grad=True)
    tokens = torch.randint(0, 1000, (2, 64))
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = projected_stats(head, hidden, tokens, entropy="grad", chunk_positions=16)
    (lp.sum() + ent.sum()).backward()
    assert hidden.grad is not None and hidden.grad.abs().max() > 0
    assert max(saved) <= hidden.numel()  # chunks of hidden states; one [B, C, V] logits tensor is 128000
