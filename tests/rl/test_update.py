"""The lean update on a tiny random Llama with the real SmolLM2 tokenizer: mini-batches planned over every
process's samples, length-sorted micro-batches, π_old taken from the first optimizer step's own forward
pass (checked against a separate scoring pass), only trained positions projected, each parameter group
clipped on its own, and one temperature and seed for rollouts and trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from searchteam.errors import ConfigError
from searchteam.llm import logprobs as lp
from searchteam.rl.batching import Slot, deal, lockstep, micro_batches, mini_batches
from searchteam.rl.experience import Sample, samples_from_episodes
from searchteam.rl.policy import Policy, build_policy
from searchteam.rl.trainer import Trainer
from searchteam.train.config import load_train_run_config
from tests.rl.test_trainer import config, episode, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tokenizer(smollm_tokenizer):
    return smollm_tokenizer


def slot(rank: int, index: int, length: int, role: str = "", sft: bool = False, group: str = "q") -> Slot:
    return Slot(rank, index, length, (role, sft), (group, index, 0, sft))


# ---- the schedule ----------------------------------------------------------------------------------------


def test_mini_batches_are_near_equal_parts_of_at_most_the_size():
    slots = [slot(0, i, 10) for i in range(10)]
    parts = mini_batches(slots, 4, torch.Generator().manual_seed(0))
    assert [len(p) for p in parts] == [3, 3, 4]  # ceil(10 / 4) = 3 steps, not 4 + 4 + 2
    assert sorted(s.index for p in parts for s in p) == list(range(10))
    assert [len(p) for p in mini_batches(slots, None, torch.Generator().manual_seed(0))] == [10]


def test_mini_batches_do_not_depend_on_how_samples_are_spread_over_processes():
    """The same 12 samples held by one process or split 3 + 9 over two fall into the same mini-batches."""
    groups = ["a"] * 3 + ["b"] * 9
    one = [Slot(0, i, 5 + i, ("", False), (g, i, 0, False)) for i, g in enumerate(groups)]
    # on two processes, episode ids restart at 0 on the second one, but keep their order within a group
    two = [
        Slot(0 if g == "a" else 1, i, 5 + i, ("", False), (g, i - 3 * (g == "b"), 0, False))
        for i, g in enumerate(groups)
    ]
    plan_one = mini_batches(one, 5, torch.Generator().manual_seed(3))
    plan_two = mini_batches(two, 5, torch.Generator().manual_seed(3))
    assert [[s.length for s in p] for p in plan_one] == [[s.length for s in p] for p in plan_two]


def test_micro_batches_sort_by_length_and_keep_to_the_token_budget_and_one_pool():
    slots = [slot(0, i, n) for i, n in enumerate([100, 10, 90, 12, 95, 11])]
    slots += [slot(0, 6, 50, role="plan"), slot(0, 7, 40, sft=True)]
    chunks = micro_batches(slots, max_samples=3, max_tokens=300)
    assert [[s.length for s in c] for c in chunks] == [[100, 95, 90], [12, 11, 10], [40], [50]]
    assert all(len({s.pool for s in c}) == 1 for c in chunks)
    tight = micro_batches(slots[:6], max_samples=8, max_tokens=200)
    assert all(len(c) * c[0].length <= 200 or len(c) == 1 for c in tight)
    assert [[s.length for s in c] for c in tight] == [[100, 95], [90, 12], [11, 10]]


def test_lockstep_pads_every_process_to_the_busiest_and_deal_balances_shares():
    minibatch = [slot(0, 0, 10), slot(0, 1, 10), slot(0, 2, 10), slot(1, 0, 10)]
    shares = lockstep(minibatch, world=2, max_samples=1)
    assert [len(s) for s in shares] == [3, 3] and shares[1][1:] == [[], []]
    dealt = deal([slot(0, i, n) for i, n in enumerate([9, 1, 8, 2, 7, 3])], world=2)
    per_rank = [sum(s.length for s in dealt if s.rank == r) for r in (0, 1)]
    assert per_rank == [15, 15]


# ---- the update ------------------------------------------------------------------------------------------


def trainer_for(tokenizer, tmp_path: Path, **overrides) -> Trainer:
    cfg = config(**({"estimator": "grpo"} | overrides))
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    return Trainer(policy, lambda step: [], lambda episodes: None, cfg, tmp_path)


def rewarded_samples(tokenizer, questions: int = 2) -> list[Sample]:
    episodes = [episode(tokenizer, f"q{j}", k) for j in range(questions) for k in range(2)]
    for i, ep in enumerate(episodes):
        for turn in ep.turns:
            turn.reward = float(i % 3)
    samples = samples_from_episodes(episodes, tokenizer)
    for s in samples:  # distinct rollouts: identical ones with opposite advantages cancel out
        s.completion_ids = [*s.completion_ids, 100 + s.episode_id]
        s.loss_mask = [*s.loss_mask, 1]
    return samples


def count_forwards(policy: Policy) -> list[bool]:
    """Record, for every forward pass of `policy`, whether it ran with gradients."""
    calls: list[bool] = []
    forward = policy.forward

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return forward(*args, **kwargs)

    policy.forward = counted  # type: ignore[method-assign]
    return calls


def test_one_optimizer_step_per_batch_needs_no_scoring_pass(tokenizer, tmp_path: Path):
    trainer = trainer_for(tokenizer, tmp_path, mini_batch_size=None, micro_batch_size=4)
    calls = count_forwards(trainer.policy)
    samples = rewarded_samples(tokenizer)
    record = trainer.updater.rl_update(samples, 0)
    assert record["updates"] == 1
    assert calls and all(calls)  # every forward pass trains: π_old came from the training pass itself
    assert all(s.old_logprobs is not None and len(s.old_logprobs) == len(s.completion_ids) for s in samples)


def test_only_samples_after_the_first_optimizer_step_are_scored(tokenizer, tmp_path: Path):
    trainer = trainer_for(tokenizer, tmp_path, mini_batch_size=4, micro_batch_size=8)
    calls = count_forwards(trainer.policy)
    record = trainer.updater.rl_update(rewarded_samples(tokenizer), 0)  # 8 samples: two steps of 4
    assert record["updates"] == 2
    assert calls == [False, True, True]  # one scoring pass (the second step's four) and two updates


def first_step(tokenizer, run_dir: Path) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The gradients of the first optimizer step of two epochs over one mini-batch, and the samples' π_old."""
    trainer = trainer_for(tokenizer, run_dir, mini_batch_size=None, ppo_epochs=2, micro_batch_size=3)
    samples = rewarded_samples(tokenizer)
    grads: list[dict[str, torch.Tensor]] = []
    step_if_finite = trainer.updater.step_if_finite

    def recording(finite, grad_norm, optimizer) -> bool:
        named = dict(trainer.policy.named_parameters())
        grads.append(
            {n: named[n].grad.clone() for n in trainer.policy._trainable if named[n].grad is not None}
        )
        return step_if_finite(finite, grad_norm, optimizer)

    trainer.updater.step_if_finite = recording  # type: ignore[method-assign]
    assert trainer.updater.rl_update(samples, 0)["updates"] == 2
    return grads[0], [torch.tensor(s.old_logprobs) for s in samples]


def test_pi_old_from_the_first_step_equals_a_separate_scoring_pass(tokenizer, tmp_path: Path, monkeypatch):
    """The second epoch's ratio needs π_old, which the first step kept from its own forward pass: it equals
    what a scoring pass with the initial weights computes (the path of a policy with dropout), and so do
    the first step's gradients computed both ways."""
    reused_grads, reused_old = first_step(tokenizer, tmp_path / "reuse")
    with monkeypatch.context() as patch:
        patch.setattr(Policy, "deterministic", property(lambda self: False))
        scored_grads, scored_old = first_step(tokenizer, tmp_path / "score")
    for reused, scored in zip(reused_old, scored_old, strict=True):
        torch.testing.assert_close(reused, scored, rtol=1e-5, atol=1e-5)
    scale = max(g.abs().max().item() for g in scored_grads.values())
    assert scale > 1e-4  # a real gradient, not rounding noise around zero
    for name, grad in scored_grads.items():
        torch.testing.assert_close(reused_grads[name], grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_a_policy_with_dropout_is_not_deterministic(tokenizer):
    assert build_policy(tiny_model(tokenizer), tokenizer, config()).deterministic
    assert not build_policy(tiny_model(tokenizer), tokenizer, config(lora_dropout=0.1)).deterministic


def test_only_trained_positions_are_projected_and_the_head_is_cast_once(
    tokenizer, tmp_path: Path, monkeypatch
):
    """A merged trajectory whose completion is mostly environment text: the training forward projects
    only the loss mask's positions, with one fp32 cast of the head per pass."""
    trainer = trainer_for(tokenizer, tmp_path, mini_batch_size=None, micro_batch_size=4)
    samples = rewarded_samples(tokenizer)
    for s in samples:  # a retrieved span in the middle of each completion, masked
        s.completion_ids = s.completion_ids + [42] * 20 + s.completion_ids
        s.loss_mask = (
            [1] * (len(s.completion_ids) - 20 - len(s.loss_mask)) + [0] * 20 + [1] * len(s.loss_mask)
        )
    projected: list[int] = []
    casts: list[int] = []
    stats, weights = lp._stats, lp.fp32_weights

    def counted_stats(head, cast, hidden, *rest):
        projected.append(hidden.shape[0])
        return stats(head, cast, hidden, *rest)

    def counted_cast(head):
        casts.append(1)
        return weights(head)

    monkeypatch.setattr(lp, "_stats", counted_stats)
    monkeypatch.setattr(lp, "fp32_weights", counted_cast)
    trainer.updater.rl_update(samples, 0)
    trained = sum(s.num_trained_tokens for s in samples)
    # no padding, no environment token through the vocabulary projection, in the forward pass and again in
    # the backward pass's recomputation
    assert sum(projected) == 2 * trained
    assert len(casts) == 2  # one forward pass per micro-batch of four samples


def test_each_parameter_group_is_clipped_on_its_own(tokenizer, tmp_path: Path):
    """A fresh critic's large gradient does not shrink the policy's: each group is clipped to the limit
    alone, and the log names each group's norm."""
    trainer = trainer_for(tokenizer, tmp_path, estimator="gae", max_grad_norm=1.0)
    named = dict(trainer.policy.named_parameters())
    groups = {g["name"]: g["params"] for g in trainer.optimizer.param_groups}
    assert set(groups) == {"policy", "value"}
    for name, params in groups.items():
        for p in params:
            p.grad = torch.full_like(p, 0.001 if name == "policy" else 10.0)
    before = {n: named[n].grad.clone() for n in trainer.policy._trainable}
    norms = trainer.updater.clip(trainer.optimizer, 1.0)
    assert norms["value"] > 1.0 > norms["policy"]
    for p in groups["policy"]:
        name = next(n for n, q in named.items() if q is p)
        torch.testing.assert_close(p.grad, before[name], rtol=0, atol=0)  # untouched
    value_norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in groups["value"]]))
    assert value_norm.item() == pytest.approx(1.0, rel=1e-4)


def test_the_log_counts_optimizer_steps_and_names_each_groups_norm(tokenizer, tmp_path: Path):
    trainer = trainer_for(tokenizer, tmp_path, estimator="gae", mini_batch_size=3, ppo_epochs=2)
    record = trainer.updater.rl_update(rewarded_samples(tokenizer), 0)  # 8 samples: ceil(8 / 3) = 3 per epoch
    assert record["updates"] == 6
    assert {"grad_norm", "grad_norm/policy", "grad_norm/value"} <= set(record)


# ---- configuration ---------------------------------------------------------------------------------------


def test_a_key_the_config_does_not_have_is_refused_by_name():
    with pytest.raises(ConfigError, match="field 'train.grad_accum': Extra inputs are not permitted"):
        load_train_run_config(None, {"method": "search_r1"}, settings={"train.grad_accum": 4})


def test_temperature_and_seed_are_set_once_at_the_top_level(tokenizer):
    cfg = load_train_run_config(None, {"method": "naive_rag", "temperature": 0.7, "seed": 5})
    assert (cfg.temperature, cfg.seed) == (0.7, 5)
    assert build_policy(tiny_model(tokenizer), tokenizer, cfg.train, cfg.temperature).temperature == 0.7
    for name in ("temperature", "seed"):
        with pytest.raises(ConfigError, match=f"field 'train.{name}': Extra inputs are not permitted"):
            load_train_run_config(None, {"method": "naive_rag"}, {f"train.{name}": 1})


def test_a_greedy_temperature_is_refused():
    with pytest.raises(ConfigError, match="temperature 0 .greedy. cannot train"):
        load_train_run_config(None, {"method": "naive_rag", "temperature": 0.0})


def test_auto_dtype_trains_in_bf16_only_where_the_cpu_multiplies_it_natively(monkeypatch):
    from searchteam.llm import hf

    monkeypatch.setattr(hf, "cpu_has_bf16", lambda: False)
    assert hf.pick_dtype("auto", "cpu", training=True) == hf.pick_dtype(None, "cpu") == torch.float32
    with pytest.warns(UserWarning, match="several times slower than float32"):
        assert hf.pick_dtype("bfloat16", "cpu") == torch.bfloat16
    monkeypatch.setattr(hf, "cpu_has_bf16", lambda: True)
    assert hf.pick_dtype("auto", "cpu", training=True) == torch.bfloat16
    assert hf.pick_dtype("auto", "cpu") == torch.float32  # inference keeps fp32 logits on the CPU
