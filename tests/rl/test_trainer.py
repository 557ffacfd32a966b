"""The trainer end to end on a tiny randomly initialised Llama with the real SmolLM2 tokenizer and scripted
rollouts: finite losses that move the weights, NaN steps that are skipped, exact checkpoint resume, and
distinct per-role LoRA adapters."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from searchteam.rl.checkpoints import list_checkpoints
from searchteam.rl.config import TrainConfig
from searchteam.rl.policy import Policy, build_policy
from searchteam.rl.trainer import Trainer
from searchteam.train.plot import plot_run, trailing_mean
from searchteam.types import Episode, Question, Turn

COMPLETIONS = {"plan": "<plan>find the city</plan>", "answer": "<answer>Paris</answer>"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: extra threads only add contention."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def tiny_model(tokenizer, seed: int = 0, tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )
    return LlamaForCausalLM(config)


def config(**overrides) -> TrainConfig:
    base = dict(
        steps=2,
        lr=5e-2,
        micro_batch_size=2,
        mini_batch_size=4,
        lora_r=4,
        lora_alpha=8,
        lora_targets=["q_proj", "v_proj"],
    )
    return TrainConfig(**(base | overrides))


def episode(tokenizer, qid: str, k: int) -> Episode:
    turns = [
        Turn(
            role=role,
            step=i,
            messages=[{"role": "user", "content": f"{role}: capital of France? ({qid})"}],
            completion=text,
            completion_token_ids=tokenizer(text, add_special_tokens=False)["input_ids"],
            parsed_ok=(k + i) % 3 != 0,
        )
        for i, (role, text) in enumerate(COMPLETIONS.items())
    ]
    return Episode(question=Question(id=qid, question="capital of France?"), method="scripted", turns=turns)


def scripted_rollout(tokenizer):
    """Two questions × two rollouts each; which questions depends on the step."""

    def rollout(step: int) -> list[Episode]:
        return [episode(tokenizer, f"q{step % 3}-{j}", k) for j in range(2) for k in range(2)]

    return rollout


def random_reward(episodes: list[Episode]) -> None:
    """Rewards from python's global RNG, so an exact resume also needs the RNG state restored."""
    for ep in episodes:
        for turn in ep.turns:
            turn.reward = round(random.random(), 3)


def trainable(policy: Policy) -> dict[str, torch.Tensor]:
    return policy.trainable_state_dict()


def test_training_moves_weights_and_writes_log_and_plot(tokenizer, tmp_path: Path):
    cfg = config(estimator="grpo", kl_coef=0.05)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    before = trainable(policy)
    trainer = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path)
    records = trainer.train()
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["skipped_updates"] == 0 and r["updates"] == 2
        assert all(torch.isfinite(torch.tensor(r[k])) for k in ("loss", "grad_norm", "kl_ref", "clip_frac"))
        assert r["samples/plan"] == 4 and r["response_length/answer"] == len(
            tokenizer(COMPLETIONS["answer"])["input_ids"]
        )
        assert 0 < r["format_error_rate/plan"] < 1
    after = trainable(policy)
    assert any(not torch.equal(before[n], after[n]) for n in before if "lora_B" in n)
    assert (
        all(
            torch.equal(a, b)
            for a, b in zip(policy.ref_model.parameters(), tiny_model(tokenizer).parameters(), strict=True)
        )
        if policy.ref_model
        else True
    )
    logged = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert (
        [r["step"] for r in logged] == [1, 2] and "reward/answer" in logged[0] and "time/update" in logged[0]
    )
    traces = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [t["step"] for t in traces] == [1] * 4 + [2] * 4
    assert [turn["role"] for turn in traces[0]["turns"]] == ["plan", "answer"]
    assert traces[0]["turns"][1]["completion"] == COMPLETIONS["answer"]
    assert all(isinstance(turn["reward"], float) and "messages" not in turn for turn in traces[0]["turns"])
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000002"]
    image = plot_run(tmp_path)
    assert image.exists() and image.read_bytes()[:4] == b"\x89PNG"


def test_trailing_mean_averages_up_to_window_values():
    assert trailing_mean([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert trailing_mean([2.0, 4.0], 8) == [2.0, 3.0]


def test_non_finite_loss_skips_the_step(tokenizer, tmp_path: Path):
    cfg = config(steps=1, estimator="grpo")
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    before = trainable(policy)

    def nan_reward(episodes: list[Episode]) -> None:
        random_reward(episodes)
        episodes[0].turns[0].reward = float("nan")

    trainer = Trainer(policy, scripted_rollout(tokenizer), nan_reward, cfg, tmp_path)
    (record,) = trainer.train()
    assert record["skipped_updates"] == record["updates"] == 2
    after = trainable(policy)
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert all(not trainer.optimizer.state[p] for g in trainer.optimizer.param_groups for p in g["params"])
    assert json.loads((tmp_path / "train_log.jsonl").read_text())["loss"] is None


def test_resume_continues_exactly(tokenizer, tmp_path: Path):
    cfg = config(
        steps=3,
        save_every=2,
        estimator="gae",
        gamma=0.9,
        lam=0.95,
        warmup_steps=1,
        schedule="cosine",
        ppo_epochs=2,
    )
    random.seed(123)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    straight = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path / "a").train()
    final = trainable(policy)
    assert [p.name for p in list_checkpoints(tmp_path / "a")] == ["step-000002", "step-000003"]
    assert not [p for p in (tmp_path / "a" / "checkpoints").iterdir() if p.name.startswith(".")]

    random.seed(999)  # the restored RNG state, not this seed, must drive the resumed run
    resumed_policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)  # same backbone, fresh adapters
    trainer = Trainer(resumed_policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path / "b")
    assert trainer.resume(tmp_path / "a" / "checkpoints" / "step-000002") == 2
    (record,) = trainer.train()
    assert record["step"] == 3
    for key in ("loss", "pg_loss", "value_loss", "grad_norm", "reward/mean", "lr"):
        assert record[key] == pytest.approx(straight[2][key], rel=1e-5, abs=1e-7)
    resumed = trainable(resumed_policy)
    for name in final:
        torch.testing.assert_close(resumed[name], final[name], rtol=1e-5, atol=1e-6)

    same_dir = Trainer(
        build_policy(tiny_model(tokenizer), tokenizer, cfg),
        scripted_rollout(tokenizer),
        random_reward,
        cfg,
        tmp_path / "a",
    )
    assert same_dir.resume(tmp_path / "a" / "checkpoints" / "step-000002") == 2
    assert len((tmp_path / "a" / "train_log.jsonl").read_text().splitlines()) == 2  # log cut back to step 2
    assert len((tmp_path / "a" / "rollouts.jsonl").read_text().splitlines()) == 8  # and the traces too


def test_resume_in_a_new_run_folder_starts_at_step_0(tokenizer, tmp_path: Path):
    cfg = config(steps=1, save_every=1)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    trainer = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path / "new")
    assert trainer.resume() == 0  # `train --resume` in a job script that may run again
    (record,) = trainer.train()
    assert record["step"] == 1 and [p.name for p in list_checkpoints(tmp_path / "new")] == ["step-000001"]


def test_per_role_lora_adapters_are_distinct(tokenizer, tmp_path: Path):
    cfg = config(
        steps=1,
        estimator="role_grpo",
        lora_per_role=True,
        roles=["plan", "answer"],
        role_lr={"plan": 5e-2, "answer": 1e-2},
    )
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    trainer = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path)
    lrs = {g["name"]: g["lr"] for g in trainer.optimizer.param_groups}
    assert lrs == {"plan": 5e-2, "answer": 1e-2}
    (record,) = trainer.train()
    assert record["skipped_updates"] == 0 and record["lr/answer"] == 1e-2
    state = trainable(policy)
    plan = {n.replace(".plan.", "."): t for n, t in state.items() if ".plan." in n}
    answer = {n.replace(".answer.", "."): t for n, t in state.items() if ".answer." in n}
    assert plan.keys() == answer.keys() and plan
    assert any(not torch.equal(plan[k], answer[k]) for k in plan if "lora_B" in k)
    batch_ids = torch.tensor([tokenizer("Paris is the capital of France")["input_ids"]])
    outputs = {}
    for role in ("plan", "answer"):
        policy.activate(role)
        with torch.no_grad():
            outputs[role] = policy.model(input_ids=batch_ids).logits
    assert not torch.allclose(outputs["plan"], outputs["answer"])
    with pytest.raises(KeyError, match="no LoRA adapter for role 'judge'"):
        policy.activate("judge")
    saved = list(
        (tmp_path / "checkpoints" / "step-000001" / "policy" / "adapters").rglob("adapter_model.safetensors")
    )
    assert len(saved) == 2


def test_full_finetuning_with_gspo_updates_every_weight(tokenizer, tmp_path: Path):
    cfg = config(
        steps=1,
        full_ft=True,
        ratio_level="sequence",
        loss_agg="seq_mean",
        clip_low=3e-4,
        clip_high=4e-4,
        lr=1e-3,
    )
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    embed_before = policy.model.get_input_embeddings().weight.detach().clone()
    (record,) = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path).train()
    assert record["skipped_updates"] == 0
    assert not torch.equal(embed_before, policy.model.get_input_embeddings().weight)
    saved = tmp_path / "checkpoints" / "step-000001" / "policy"
    assert (saved / "model" / "config.json").exists()
    restored = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    restored.load(saved)
    assert torch.equal(
        restored.model.get_input_embeddings().weight, policy.model.get_input_embeddings().weight
    )


@pytest.fixture
def fresh_accelerator_state():
    """accelerate keeps one process-wide state whose mixed precision cannot change once set: tests that
    need their own start it afresh and leave it fresh."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def one_update_config(**overrides) -> TrainConfig:
    """Every step's 8 samples in one micro-batch: one optimizer step per training step."""
    return config(**({"micro_batch_size": 8, "mini_batch_size": 8} | overrides))


def test_fp16_grad_scaler_skips_an_inf_step_and_trains_on(tokenizer, tmp_path: Path, fresh_accelerator_state):
    """fp16 with a grad scaler: the step whose gradients are inf is skipped by the scaler (which halves its
    scale) without touching the weights, and the next step trains. (Before, the trainer skipped before the
    scaler's `update()`, so the next `unscale_` raised.) accelerate gives no scaler on CPU, so the trainer
    gets an fp16 Accelerator holding torch's CPU GradScaler: the code path of CUDA fp16."""
    from accelerate import Accelerator

    accelerator = Accelerator(mixed_precision="fp16")
    accelerator.scaler, accelerator.native_amp = torch.amp.GradScaler("cpu", init_scale=1024.0), True
    cfg = one_update_config()
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    backwards: list[int] = []

    def inf_on_first_backward(grad: torch.Tensor) -> torch.Tensor:
        backwards.append(1)
        return torch.full_like(grad, float("inf")) if len(backwards) == 1 else grad

    next(p for n, p in policy.named_parameters() if "lora_B" in n).register_hook(inf_on_first_backward)
    trainer = Trainer(
        policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path, accelerator=accelerator
    )
    before = trainable(policy)
    first = trainer.train_step()
    assert first["skipped_updates"] == first["updates"] == 1
    assert all(torch.equal(before[n], t) for n, t in trainable(policy).items())
    assert accelerator.scaler.get_scale() == 512.0
    second = trainer.train_step()
    assert second["skipped_updates"] == 0 and second["updates"] == 1
    assert any(not torch.equal(before[n], t) for n, t in trainable(policy).items())


def save_tiny(tokenizer, directory: Path) -> str:
    tiny_model(tokenizer).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_bf16_full_finetuning_loads_fp32_master_weights(tokenizer, tmp_path: Path):
    """dtype bfloat16: full fine-tuning gets fp32 weights on this process's device (bf16 compute comes from
    mixed_precision, and without it a warning says so); LoRA keeps the bf16 backbone, and peft's adapters
    are fp32."""
    from accelerate import PartialState

    from searchteam.rl.policy import load_policy

    path = save_tiny(tokenizer, tmp_path / "tiny")
    full = load_policy(path, config(full_ft=True, mixed_precision="bf16"), device="cpu", dtype="bfloat16")
    assert {p.dtype for p in full.parameters()} == {torch.float32}
    assert next(full.parameters()).device == PartialState().device
    lora = load_policy(path, config(mixed_precision="bf16"), device="cpu", dtype="bfloat16")
    assert {p.dtype for p in lora.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in lora.parameters() if not p.requires_grad} == {torch.bfloat16}
    with pytest.warns(UserWarning, match="mixed_precision: bf16"):
        load_policy(path, config(full_ft=True), device="cpu", dtype="bfloat16")


def test_bf16_full_finetuning_step_moves_nearly_every_weight(
    tokenizer, tmp_path: Path, fresh_accelerator_state
):
    """One AdamW step at mask/qwen7b-gpu's lr 1e-6 under bf16 mixed precision changes (nearly) every fp32
    master weight (measured: 99.7 %). The same step on pure bf16 weights (what load_policy used to load)
    changes 0.3 % of them: AdamW moves each weight by ≈ lr, below half a bf16 ulp of any weight above
    ≈ 2.6e-4 (the issue measured 2 % after 10 steps on the real model); the trainer warns about such
    weights."""
    from searchteam.rl.policy import load_policy

    cfg = one_update_config(steps=1, full_ft=True, mixed_precision="bf16", lr=1e-6)

    def rollout(step: int) -> list[Episode]:  # the two answers of a question differ, so do their gradients
        episodes = scripted_rollout(tokenizer)(step)
        for ep in episodes[1::2]:
            ep.turns[-1].completion = "<answer>Rome</answer>"
            ep.turns[-1].completion_token_ids = tokenizer(ep.turns[-1].completion)["input_ids"]
        return episodes

    def changed_share(policy: Policy, run: str) -> float:
        before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
        Trainer(policy, rollout, random_reward, cfg, tmp_path / run).train()
        after = dict(policy.model.named_parameters())
        changed = sum(int((after[n] != t).sum()) for n, t in before.items())
        return changed / sum(t.numel() for t in before.values())

    path = save_tiny(tokenizer, tmp_path / "tiny")
    master = load_policy(path, cfg, device="cpu", dtype="bfloat16")
    assert changed_share(master, "fp32") > 0.99
    pure = build_policy(tiny_model(tokenizer).to(torch.bfloat16), tokenizer, cfg)
    with pytest.warns(UserWarning, match="trained weights are torch.bfloat16"):
        assert changed_share(pure, "bf16") < 0.05


def test_entropy_is_measured_on_the_completion_logits_and_logged_per_role(tokenizer, tmp_path: Path):
    """The logprobs pass's entropy equals that of the full-vocabulary (temperature-scaled) logits; the step
    record carries `entropy/<role>` and their token-weighted mean `entropy`."""
    from searchteam.llm.logprobs import chosen_token_stats

    model = tiny_model(tokenizer)
    ids = torch.tensor([tokenizer("The capital of France is Paris")["input_ids"]])
    with torch.no_grad():
        got = chosen_token_stats(
            model, ids, torch.ones_like(ids), torch.tensor([[1, 2, 3]]), 0.7, entropy="detached"
        ).entropy
        logp = torch.log_softmax(model(input_ids=ids).logits[0, 1:4].float() / 0.7, dim=-1)
    assert got[0].tolist() == pytest.approx((-(logp.exp() * logp).sum(-1)).tolist(), abs=1e-5)

    cfg = config(steps=1)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg, temperature=0.7)
    (record,) = Trainer(policy, scripted_rollout(tokenizer), random_reward, cfg, tmp_path).train()
    roles = [record["entropy/plan"], record["entropy/answer"]]
    assert all(0 < h <= torch.log(torch.tensor(float(len(tokenizer)))).item() for h in roles)
    assert min(roles) <= record["entropy"] <= max(roles)
    logged = json.loads((tmp_path / "train_log.jsonl").read_text())
    assert logged["entropy/plan"] == record["entropy/plan"]


def test_entropy_bonus_alone_moves_the_policy(tokenizer, tmp_path: Path):
    """Equal rewards give zero advantages: the step leaves the adapters as they were unless
    `entropy_coef` > 0, whose gradient alone then moves them."""

    def equal_reward(episodes: list[Episode]) -> None:
        for ep in episodes:
            for turn in ep.turns:
                turn.reward = 1.0

    for coef, moves in ((0.0, False), (0.5, True)):
        cfg = config(steps=1, entropy_coef=coef)
        policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
        before = trainable(policy)
        Trainer(policy, scripted_rollout(tokenizer), equal_reward, cfg, tmp_path / str(coef)).train()
        after = trainable(policy)
        assert any(not torch.equal(before[n], after[n]) for n in before) == moves
