"""M-ASK's separate critic V_φ (`critic: separate`): the value loss trains only the critic's own weights
(its LoRA adapter, or its model copy, and the head) and the policy loss never reaches them; with the
default `critic: head` the value loss flows into the policy's adapter."""

from __future__ import annotations

import pytest
import torch

from searchteam.rl.experience import Sample, collate
from searchteam.rl.losses import value_loss
from searchteam.rl.policy import CRITIC_ADAPTER, build_policy, load_policy
from tests.rl.test_trainer import config, save_tiny, tiny_model
from tests.support.helpers import assert_close_scaled


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def batch(tokenizer):
    ids = tokenizer("the capital of France is Paris", add_special_tokens=False)["input_ids"]
    sample = Sample(ids[:4], ids[4:], [1] * len(ids[4:]), "plan", 0, "q", 0, returns=1.0)
    return collate([sample, sample], pad_id=0)


def grads_after(policy, b, which: str) -> dict[str, bool]:
    policy.zero_grad(set_to_none=True)
    logprobs, values, _ = policy(b.input_ids, b.attention_mask, b.target_index, b.value_index)
    loss = value_loss(values, b.old_values, b.returns, None).loss if which == "value" else -logprobs.sum()
    loss.backward()
    return {n: p.grad is not None and bool(p.grad.abs().sum() > 0) for n, p in policy.named_parameters()}


def is_critic(name: str) -> bool:
    return name.startswith(("value_head.", "critic_model.")) or f".{CRITIC_ADAPTER}." in name


@pytest.mark.parametrize("full_ft", [False, True], ids=["lora", "full"])
def test_separate_critic_and_policy_do_not_share_gradients(tokenizer, full_ft: bool):
    cfg = config(estimator="gae", critic="separate", full_ft=full_ft, lora_targets=["q_proj", "v_proj"])
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    for p in policy.parameters():  # LoRA B and the head start at zero: give every weight a gradient path
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    b = batch(tokenizer)
    value = grads_after(policy, b, "value")
    assert any(g for n, g in value.items() if is_critic(n) and not n.startswith("value_head."))
    assert not any(g for n, g in value.items() if not is_critic(n))
    pg = grads_after(policy, b, "policy")
    assert any(g for n, g in pg.items() if not is_critic(n))
    assert not any(g for n, g in pg.items() if is_critic(n))
    if not full_ft:
        assert policy.model.active_adapter == "policy"  # the generating adapter is restored
    names = [g["name"] for g in policy.param_groups(1e-3, value_lr=1e-2)]
    assert names == ["policy", "value"]


def test_critic_head_shares_the_policy_adapter(tokenizer):
    policy = build_policy(tiny_model(tokenizer), tokenizer, config(estimator="gae"))
    for p in policy.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    value = grads_after(policy, batch(tokenizer), "value")
    assert any(g for n, g in value.items() if "lora_" in n)


def test_separate_critic_adapter_is_not_saved_as_a_generating_adapter(tokenizer, tmp_path):
    cfg = config(estimator="gae", critic="separate")
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    policy.save(tmp_path)
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir() if p.is_dir()) == ["policy"]
    restored = build_policy(tiny_model(tokenizer, seed=1), tokenizer, cfg)
    restored.load(tmp_path)
    state, again = policy.trainable_state_dict(), restored.trainable_state_dict()
    assert all(torch.equal(state[n], again[n]) for n in state)


@pytest.mark.parametrize(("saved", "loaded"), [("gae", "grpo"), ("grpo", "gae")])
def test_policy_only_load_crosses_critic_layouts(tokenizer, tmp_path, saved: str, loaded: str):
    """A warm-start round saved by a run with (or without) a critic restores the policy weights of a run
    without (or with) one; a strict load refuses the mismatch; the loading run's critic keeps its init."""
    source = build_policy(tiny_model(tokenizer), tokenizer, config(estimator=saved))
    for p in source.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    source.save(tmp_path)
    target = build_policy(tiny_model(tokenizer, seed=1), tokenizer, config(estimator=loaded))
    with pytest.raises(ValueError, match="does not match"):
        target.load(tmp_path)
    critic_before = {n: t for n, t in target.trainable_state_dict().items() if is_critic(n)}
    target.load(tmp_path, policy_only=True)
    state, again = source.trainable_state_dict(), target.trainable_state_dict()
    policy_names = [n for n in again if not is_critic(n)]
    assert policy_names and all(torch.equal(state[n], again[n]) for n in policy_names)
    assert all(torch.equal(critic_before[n], again[n]) for n in critic_before)


@pytest.mark.parametrize("per_role", [False, True], ids=["shared", "per_role"])
def test_init_from_adapters_only_restores_the_generating_weights(tokenizer, tmp_path, per_role: bool):
    """A shipped adapter holds only `policy/adapters/NAME` (no trainable.pt): `load_initial` copies those
    into a fresh policy, with or without a critic; another rank is refused by name of the cause."""
    roles = {"lora_per_role": True, "roles": ["planner", "ag"]} if per_role else {}
    source = build_policy(tiny_model(tokenizer), tokenizer, config(**roles))
    for p in source.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    source.save_adapters(tmp_path / "policy" / "adapters")
    target = build_policy(tiny_model(tokenizer, seed=1), tokenizer, config(estimator="gae", **roles))
    critic_before = {n: t for n, t in target.trainable_state_dict().items() if is_critic(n)}
    target.load_initial(tmp_path)
    state, again = source.trainable_state_dict(), target.trainable_state_dict()
    assert set(state) == {n for n in again if not is_critic(n)}
    assert all(torch.equal(state[n], again[n]) for n in state)
    assert all(torch.equal(critic_before[n], again[n]) for n in critic_before)
    other_rank = build_policy(tiny_model(tokenizer, seed=1), tokenizer, config(lora_r=2, **roles))
    with pytest.raises(ValueError, match="LoRA layout"):
        other_rank.load_initial(tmp_path)
    if per_role:
        shared = build_policy(tiny_model(tokenizer, seed=1), tokenizer, config())
        with pytest.raises(ValueError, match="this policy"):
            shared.load_initial(tmp_path)


def critic_and_policy_grads(tokenizer, model: str, checkpointing: bool) -> dict[str, torch.Tensor]:
    """Gradients of one combined policy + value loss (as the trainer backpropagates it) on a separate
    critic adapter of a policy loaded as training loads it, every trained weight non-zero so each
    gradient path is live."""
    cfg = config(estimator="gae", critic="separate", gradient_checkpointing=checkpointing)
    policy = load_policy(model, cfg, device="cpu", dtype="float32")
    torch.manual_seed(1)
    for p in policy.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    policy.train()
    b = batch(tokenizer)
    logprobs, values, _ = policy(b.input_ids, b.attention_mask, b.target_index, b.value_index)
    (-logprobs.sum() + value_loss(values, b.old_values, b.returns, None).loss).backward()
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}


def test_checkpointed_critic_pass_is_recomputed_with_the_critic_adapter(tokenizer, tmp_path):
    """Activation checkpointing recomputes the critic's pass during backward, after the policy's adapter
    is active again; the recomputation must use the critic's adapter, so the gradients equal those
    without checkpointing (a stale adapter changed the critic LoRA's gradient by O(1))."""
    model = save_tiny(tokenizer, tmp_path)
    plain = critic_and_policy_grads(tokenizer, model, checkpointing=False)
    checkpointed = critic_and_policy_grads(tokenizer, model, checkpointing=True)
    assert plain.keys() == checkpointed.keys()
    assert any(f".{CRITIC_ADAPTER}." in n for n in plain)
    for name, grad in plain.items():  # 1e-5 of its largest entry: reorderings ~1e-6, a stale adapter O(1)
        assert_close_scaled(checkpointed[name], grad, msg=name)


def test_full_finetuning_critic_copy_does_not_train_its_unused_lm_head(tokenizer):
    untied = tiny_model(tokenizer, tied=False)
    cfg = config(estimator="gae", critic="separate", full_ft=True)
    policy = build_policy(untied, tokenizer, cfg)
    trained = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert "critic_model.lm_head.weight" not in trained
    assert "model.lm_head.weight" in trained and "critic_model.model.norm.weight" in trained
