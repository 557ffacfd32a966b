"""The memory estimate's terms against values computed by hand and parameter counts against real models."""

from __future__ import annotations

import pytest

from searchteam.train.memory_estimate import GIB, QWEN25, ModelShape, estimate_memory, shape_from_config

# H=4, I=8, 2 layers, 2 heads (head dim 2), 1 KV head (kv dim 2), vocabulary 10, tied embeddings.
TINY = ModelShape(hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, vocab=10)


def test_tiny_counts_by_hand():
    # per layer: q 4·4 + k 4·2 + v 4·2 + o 4·4 + gate/up/down 3·4·8 + norms 2·4 = 152; embeddings 40; norm 4
    assert TINY.params() == 40 + 2 * 152 + 4 == 348
    qwen_like = ModelShape(4, 8, 2, 2, 1, 10, tied=False, qkv_bias=True)  # + lm_head 40, + biases 4+2+2
    assert qwen_like.params() == 348 + 40 + 2 * 8
    # LoRA r=2 per layer: q 2·(4+4) + k 2·(4+2) + v 2·(4+2) + o 2·(4+4) + gate/up/down 3·2·(4+8) = 128
    assert TINY.lora_params(2) == 2 * 128 == 256
    assert TINY.lora_params(2, ["q_proj", "v_proj"]) == 2 * (16 + 12)
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        TINY.lora_params(2, ["qkv"])


def test_counts_equal_real_models():
    """A second way: the parameters of transformers' own Llama and Qwen2 and of peft's adapters."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    dims = dict(
        hidden_size=4,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=10,
    )
    for config, model_cls in (
        (LlamaConfig(**dims, tie_word_embeddings=True), LlamaForCausalLM),
        (Qwen2Config(**dims, tie_word_embeddings=False), Qwen2ForCausalLM),
    ):
        model = model_cls(config)
        shape = shape_from_config(config)
        assert shape.params() == sum(p.numel() for p in model.parameters()), config.model_type
        peft = get_peft_model(model, LoraConfig(r=2, target_modules=list(shape.module_dims())))
        lora = sum(p.numel() for n, p in peft.named_parameters() if "lora_" in n)
        assert shape.lora_params(2) == lora


def test_published_qwen_sizes():
    """Qwen2.5's model cards: 0.49B, 3.09B and 7.61B parameters."""
    card = {"Qwen2.5-0.5B": 0.49, "Qwen2.5-3B": 3.09, "Qwen2.5-7B": 7.61}
    for name, shape in QWEN25.items():
        assert abs(shape.params() / 1e9 - card[name]) < 0.01, name


def test_lora_estimate_by_hand():
    est = estimate_memory(TINY, tokens=10, lora_r=2, critic="head", rollout_tokens=5)
    assert est.weights == 348 * 2  # bf16 backbone
    assert est.trainable == 256 * 16  # fp32 adapter, gradient, two AdamW moments
    assert est.critic == (4 + 1) * 16
    assert est.reference == 0  # adapters disabled
    # checkpointed: each layer's input 10·4 bf16 values, plus one layer's 10·(6·4 + 2·2 + 4·8) values
    assert est.activations == 2 * 10 * 4 * 2 + 10 * 60 * 2 == 1360
    assert est.head == 10 * 4 * 4 + 3 * 256 * 10 * 4  # fp32 head copy + three [256, V] fp32 tensors
    assert est.kv_cache == 5 * 2 * 2 * 2 * 2  # tokens · layers · (K, V) · kv dim · bf16
    assert est.total == 696 + 4096 + 80 + 1360 + 30880 + 80
    no_ckpt = estimate_memory(TINY, tokens=10, lora_r=2, gradient_checkpointing=False)
    assert no_ckpt.activations == 2 * 10 * 60 * 2
    # a separate critic: its own adapter and value head, and a second pass's layer inputs
    separate = estimate_memory(TINY, tokens=10, lora_r=2, critic="separate")
    assert separate.critic == (256 + 5) * 16
    assert separate.activations == 2 * (2 * 10 * 4 * 2) + 10 * 60 * 2
    no_ckpt = estimate_memory(TINY, tokens=10, lora_r=2, critic="separate", gradient_checkpointing=False)
    assert no_ckpt.activations == 2 * 2 * 10 * 60 * 2


def test_full_fine_tuning_with_a_critic_copy_does_not_fit():
    """The old mask/qwen7b-gpu recipe: Qwen2.5-7B fully fine-tuned with AdamW plus a trained critic copy
    needs 2 · 16 bytes a parameter before activations, about 227 GiB."""
    shape = QWEN25["Qwen2.5-7B"]
    est = estimate_memory(shape, tokens=0, full_ft=True, critic="separate", kl=False)
    assert est.weights == 0 and est.trainable == shape.params() * 16
    assert est.critic == (shape.params() + shape.hidden + 1) * 16
    assert round((est.trainable + est.critic) / GIB) == 227
    with_kl = estimate_memory(shape, tokens=0, full_ft=True, critic="separate", kl=True)
    assert with_kl.reference == shape.params() * 2
