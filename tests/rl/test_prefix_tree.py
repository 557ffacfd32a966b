"""The shared-prefix update: samples packed into one row where each shared token prefix appears once give
the hidden states, logprobs, losses and gradients of the plain padded update, on a tiny random Llama with the
real SmolLM2 tokenizer, for GRPO, PPO with a critic (head or separate adapter), one LoRA per role, gradient
checkpointing, π_old reuse over two epochs, a KL reference pass and SFT samples. Two processes:
tests/rl/test_distributed.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from searchteam.llm.prefix_tree import enable_tree_attention, pack
from searchteam.rl.batching import Slot, micro_batches
from searchteam.rl.experience import Sample
from searchteam.rl.model_setup import enable_activation_checkpointing
from searchteam.rl.policy import build_policy
from searchteam.rl.trainer import Trainer
from tests.rl.test_trainer import config, tiny_model
from tests.rl.test_update import rewarded_samples
from tests.support.dist_scenarios import RecordingTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

SEQUENCES = [
    [5, 6, 7, 8, 9, 10],
    [5, 6, 7, 11, 12],
    [5, 6, 7, 8, 9, 13, 14],
    [20, 21],
    [5, 6],  # a prefix of others
    [5, 6, 7, 11, 12],  # a duplicate
]


@pytest.fixture(scope="module")
def tokenizer(smollm_tokenizer):
    return smollm_tokenizer


def test_each_shared_prefix_is_packed_once_at_its_depth():
    tree = pack(SEQUENCES)
    distinct = {tuple(s[: i + 1]) for s in SEQUENCES for i in range(len(s))}
    assert tree.input_ids.shape[1] == len(distinct) == 12
    for seq, path in zip(SEQUENCES, tree.paths, strict=True):
        assert tree.input_ids[0, path].tolist() == seq
        assert tree.position_ids[0, path].tolist() == list(range(len(seq)))
    assert sum(r.end - r.start for r in tree.runs) == 12


@pytest.mark.parametrize("checkpointed", [False, True])
def test_a_packed_row_gives_each_sequence_its_own_hidden_states_and_gradients(tokenizer, checkpointed):
    model = tiny_model(tokenizer)
    enable_tree_attention(model)
    if checkpointed:
        enable_activation_checkpointing(model)
    model.train()
    decoder = model.get_decoder()
    weights = torch.randn(len(SEQUENCES), 16)

    def loss(hidden_of) -> torch.Tensor:
        return sum((hidden_of(i).sum(0) * weights[i]).sum() for i in range(len(SEQUENCES)))

    tree = pack(SEQUENCES)
    packed = decoder(**tree.decoder_kwargs).last_hidden_state[0]
    loss(lambda i: packed[tree.paths[i]]).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    alone = [decoder(input_ids=torch.tensor([s])).last_hidden_state[0] for s in SEQUENCES]
    loss(lambda i: alone[i]).backward()
    for i, seq_hidden in enumerate(alone):
        torch.testing.assert_close(packed[tree.paths[i]], seq_hidden, rtol=1e-5, atol=1e-5)
    for name, param in model.named_parameters():
        if param.grad is not None:
            scale = param.grad.abs().max().item()
            torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_a_model_without_tree_attention_refuses_a_packed_row(tokenizer):
    from searchteam.llm.logprobs import decoder_hidden

    tree = pack(SEQUENCES)
    with pytest.raises(ValueError, match="enable_tree_attention"):
        decoder_hidden(tiny_model(tokenizer), tree.input_ids, torch.ones_like(tree.input_ids), tree)


def test_shared_micro_batches_meet_in_token_order_within_a_budget_of_distinct_tokens():
    def slot(index: int, ids: list[int], role: str = "") -> Slot:
        return Slot(0, index, len(ids), (role, False), ("q", index, 0, False), tuple(ids))

    prefix = list(range(10))
    slots = [
        slot(0, prefix + [50, 51]),
        slot(1, [90] * 12),
        slot(2, prefix + [60, 61]),
        slot(3, prefix + [50, 52], role="other"),
        slot(4, [91] * 6),
    ]
    # the pool "" holds samples of 12, 12, 12 and 6 tokens, 10.5 on average: one sample per plain
    # micro-batch gives 10 distinct tokens per packed one, and each sample goes alone; two give 21, where
    # the two with a common prefix fit (14 tokens)
    assert [[s.index for s in c] for c in micro_batches(slots, 1)] == [[0], [2], [1], [4], [3]]
    assert [[s.index for s in c] for c in micro_batches(slots, 2)] == [[0, 2], [1, 4], [3]]
    assert [[s.index for s in c] for c in micro_batches(slots, 1, max_tokens=14)] == [[0, 2], [1], [4], [3]]


def with_shared_turns(samples: list[Sample]) -> list[Sample]:
    """The samples plus, for each, a later turn whose prompt extends its prompt and completion, and for
    the first two an SFT target (DAC's hard-positive pseudo-targets) on the same prompt."""
    later = [
        Sample(
            prompt_ids=s.prompt_ids + s.completion_ids + [7, 8, 9],
            completion_ids=[300 + s.episode_id, 301],
            loss_mask=[1, 1],
            role=s.role,
            episode_id=s.episode_id,
            group_id=s.group_id,
            turn_index=s.turn_index + 10,
            reward=s.reward + 0.5,
        )
        for s in samples
    ]
    sft = [replace(s, completion_ids=[400, 401, 402], loss_mask=[1, 1, 1], sft=True) for s in samples[:2]]
    return samples + later + sft


def count_tokens(trainer: Trainer) -> list[tuple[int, int]]:
    """Per forward pass of `trainer`'s updater, as it runs: the tokens it computes and its samples' tokens."""
    collate = trainer.updater.collate
    rows: list[tuple[int, int]] = []

    def counting(chunk: list[Sample]):
        batch = collate(chunk)
        rows.append(
            (batch.attention_mask.sum().item(), sum(len(s.prompt_ids + s.completion_ids) for s in chunk))
        )
        return batch

    trainer.updater.collate = counting  # type: ignore[method-assign]
    return rows


def assert_shared_only_when_asked(rows: list[tuple[int, int]], share: bool) -> None:
    computed, tokens = map(sum, zip(*rows, strict=True))
    assert (computed < tokens) == share  # prefixes were shared, and only when asked


def assert_same_steps(shared: list[dict[str, torch.Tensor]], plain: list[dict[str, torch.Tensor]]) -> None:
    """As many optimizer steps, each with the same real gradient, to a tolerance scaled to the gradient."""
    assert len(shared) == len(plain) >= 1
    for step, grads in enumerate(plain):
        scale = max(g.abs().max().item() for g in grads.values())
        assert scale > 1e-4  # a real gradient, not rounding noise around zero
        assert shared[step].keys() == grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(
                shared[step][name], grad, rtol=1e-4, atol=1e-5 * scale, msg=f"step {step}: {name}"
            )


def update(tokenizer, run_dir: Path, share: bool, **overrides) -> tuple[list[dict], list[list[float]]]:
    """One RL update of a fresh tiny policy: each optimizer step's gradients and each sample's π_old."""
    cfg = config(share_prefixes=share, **overrides)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    trainer = RecordingTrainer(policy, lambda step: [], lambda episodes: None, cfg, run_dir)
    rows = count_tokens(trainer)
    samples = with_shared_turns(rewarded_samples(tokenizer))
    record = trainer.updater.rl_update(samples, 0)
    assert record["skipped_updates"] == 0
    assert_shared_only_when_asked(rows, share)
    return trainer.grads, [s.old_logprobs for s in samples if not s.sft]


PLAIN_ROLES = {"lora_per_role": True, "roles": ["answer", "plan"]}
SETTINGS = {
    "grpo, two epochs, KL": {"estimator": "grpo", "ppo_epochs": 2, "kl_coef": 0.1},
    "grpo, two optimizer steps": {"estimator": "grpo", "mini_batch_size": 6},
    "ppo, critic head": {"estimator": "gae", "gamma": 0.9, "whiten_advantages": True},
    "ppo, separate critic, checkpointed": {
        "estimator": "gae",
        "critic": "separate",
        "gradient_checkpointing": True,
    },
    "SFT samples": {"estimator": "grpo", "sft_coef": 0.5},
    "one LoRA per role, mixed estimators": PLAIN_ROLES
    | {"role_estimators": {"plan": {"estimator": "gae", "gamma": 0.9}}},
}


@pytest.mark.parametrize("settings", SETTINGS.values(), ids=SETTINGS.keys())
def test_the_shared_prefix_update_equals_the_plain_update(tokenizer, tmp_path: Path, settings):
    # a small step: Adam moves a weight by about lr whatever its gradient's size, so a later step's
    # gradient is compared after steps that rounding noise in near-zero gradients barely changed
    settings = {"mini_batch_size": None, "micro_batch_size": 3, "max_grad_norm": 1e6, "lr": 1e-4} | settings
    plain_grads, plain_old = update(tokenizer, tmp_path / "plain", False, **settings)
    shared_grads, shared_old = update(tokenizer, tmp_path / "shared", True, **settings)
    for old, expected in zip(shared_old, plain_old, strict=True):
        torch.testing.assert_close(torch.tensor(old), torch.tensor(expected), rtol=1e-5, atol=1e-5)
    assert_same_steps(shared_grads, plain_grads)


def test_tree_attention_leaves_generation_unchanged(tokenizer):
    """A policy that can take packed rows still generates as sdpa does (the hf engine may share it)."""
    plain = tiny_model(tokenizer)
    tree = tiny_model(tokenizer)
    enable_tree_attention(tree)
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    kwargs = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(plain.generate(prompt, **kwargs), tree.generate(prompt, **kwargs))


def warm_start_gradients(tokenizer, run_dir: Path, share: bool) -> list[dict[str, torch.Tensor]]:
    """The gradients of every optimizer step of one warm-start round (SFT mini-batches that every process
    holds and shares out, `replicated`)."""
    from tests.rl.test_warm_start import no_reward, rl_config, scripted_stage

    cfg = rl_config(share_prefixes=share, lr=1e-4, max_grad_norm=1e6)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    stage = scripted_stage(tokenizer, 1, [])
    trainer = RecordingTrainer(policy, None, no_reward, cfg, run_dir, warm_start=stage)
    rows = count_tokens(trainer)
    trainer.run_warm_start()
    assert_shared_only_when_asked(rows, share)
    return trainer.grads


def test_a_warm_start_with_shared_prefixes_takes_the_plain_steps(tokenizer, tmp_path: Path):
    plain = warm_start_gradients(tokenizer, tmp_path / "plain", False)
    shared = warm_start_gradients(tokenizer, tmp_path / "shared", True)
    assert len(plain) > 1
    assert_same_steps(shared, plain)
