"""DAPO dynamic sampling with re-sampling, and DAC's auxiliary SFT samples, through the trainer on a tiny
randomly initialised Llama (the SmolLM2 tokenizer, scripted rollouts and rewards)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from searchteam.rl.policy import build_policy
from searchteam.rl.trainer import Trainer
from searchteam.types import Episode, Question, Turn
from tests.rl.test_trainer import config, tiny_model


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: extra threads only add contention
    yield AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    torch.set_num_threads(threads)


def answer_episode(tokenizer, qid: str, correct: bool) -> Episode:
    text = "<answer>Paris</answer>" if correct else "<answer>Rome</answer>"
    turn = Turn(
        role="answer",
        messages=[{"role": "user", "content": f"capital of France? ({qid})"}],
        completion=text,
        completion_token_ids=tokenizer(text, add_special_tokens=False)["input_ids"],
    )
    return Episode(question=Question(id=qid, question="capital of France?"), method="scripted", turns=[turn])


def reward_paris(episodes: list[Episode]) -> None:
    for ep in episodes:
        ep.turns[0].reward = float("Paris" in ep.turns[0].completion)


def test_dynamic_sampling_resamples_until_the_batch_holds_informative_groups(tokenizer, tmp_path: Path):
    """Round 0: q0 all right, q1 mixed (1 of 2 groups informative); round 1: q2 all wrong; round 2: q3 and
    q4 mixed. The step stops at round 2 with 2 informative groups (as many as round 0 had groups), keeps
    q1 and q3 and cuts q4."""
    rounds = {0: [("q0", True, True), ("q1", True, False)], 1: [("q2", False, False)]}
    rounds[2] = [("q3", False, True), ("q4", True, False)]
    asked: list[int] = []

    def rollout(step: int, attempt: int = 0) -> list[Episode]:
        asked.append(attempt)
        return [answer_episode(tokenizer, q, c) for q, *cs in rounds[attempt] for c in cs]

    cfg = config(steps=1, estimator="grpo", dynamic_sampling=True, resample_rounds=3)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    (record,) = Trainer(policy, rollout, reward_paris, cfg, tmp_path).train()
    assert asked == [0, 1, 2]
    assert record["sampling_rounds"] == 3 and record["samples"] == 4 and record["episodes"] == 10
    assert record["informative_share"] == pytest.approx(3 / 5)
    assert record["filtered_samples"] == 6  # q0, q2 (uninformative) and q4 (beyond the target)
    traces = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(traces) == 10


def test_without_resampling_uninformative_groups_are_only_dropped(tokenizer, tmp_path: Path):
    def rollout(step: int) -> list[Episode]:
        return [answer_episode(tokenizer, "q0", True), answer_episode(tokenizer, "q0", True)]

    cfg = config(steps=1, estimator="grpo", dynamic_sampling=True)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    (record,) = Trainer(policy, rollout, reward_paris, cfg, tmp_path).train()
    assert record["samples"] == 0 and record["informative_share"] == 0.0 and record["sampling_rounds"] == 1


def test_sft_target_adds_a_likelihood_sample(tokenizer, tmp_path: Path):
    """DAC Eq. 7-8: a turn whose scheme recorded `sft_target` adds a sample trained by −β·log π(target)."""
    target = "<answer>Paris</answer>"

    def rollout(step: int) -> list[Episode]:
        eps = [answer_episode(tokenizer, "q0", True), answer_episode(tokenizer, "q0", False)]
        eps[1].turns[0].sft_target = target
        return eps

    cfg = config(steps=1, estimator="grpo", sft_coef=0.05, micro_batch_size=4, mini_batch_size=4)
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    before = {k: v.clone() for k, v in policy.trainable_state_dict().items()}
    (record,) = Trainer(policy, rollout, reward_paris, cfg, tmp_path).train()
    assert record["samples"] == 3 and record["skipped_updates"] == 0
    assert "sft_loss" in record and record["sft_loss"] > 0
    after = policy.trainable_state_dict()
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_critic_learns_only_the_roles_gae_estimates(tokenizer, tmp_path: Path):
    """DAC: the searcher's GAE needs the critic, the generator's GRPO does not. Searcher returns are 0 and
    the (zero-initialised) critic predicts 0, so the value loss is exactly 0 unless generator rows, whose
    GRPO returns are 1 and 0, leak into it."""

    def rollout(step: int) -> list[Episode]:
        episodes = [answer_episode(tokenizer, "q0", c) for c in (True, False)]
        for ep in episodes:
            ep.turns[0].role = "generator"
            ep.turns.insert(0, ep.turns[0].model_copy(update={"role": "searcher", "completion": "<stop>"}))
        return episodes

    def reward(episodes: list[Episode]) -> None:
        reward_paris(episodes)
        for ep in episodes:
            ep.turns[0].reward = 0.0

    cfg = config(
        steps=1,
        estimator="grpo",
        role_estimators={"searcher": {"estimator": "gae"}},
        lora_per_role=True,
        roles=["searcher", "generator"],
        lr=1e-9,
    )
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    (record,) = Trainer(policy, rollout, reward, cfg, tmp_path).train()
    assert record["samples"] == 4 and record["value_loss"] == 0.0


def test_failed_episodes_are_counted_in_the_step_record(tokenizer, tmp_path: Path):
    """An episode that failed (a request the engine refused, a team bug) leaves the step running and is
    counted; it has no turns to train."""

    def rollout(step: int, attempt: int = 0) -> list[Episode]:
        failed = Episode(
            question=Question(id="q9", question="?"), method="scripted", error="RequestRejected: x"
        )
        return [answer_episode(tokenizer, "q1", True), answer_episode(tokenizer, "q1", False), failed]

    cfg = config(steps=1, estimator="grpo")
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    reward = lambda episodes: reward_paris([e for e in episodes if e.turns])  # noqa: E731
    (record,) = Trainer(policy, rollout, reward, cfg, tmp_path).train()
    assert record["episodes"] == 3 and record["failed_episodes"] == 1 and record["samples"] == 2
