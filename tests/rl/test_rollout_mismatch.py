"""The rollout-vs-trainer mismatch: the engine's logprobs of the sampled tokens reach the samples, the log
reports |π_rollout − π_old| and a KL estimate per role, and truncated importance sampling weights each
token's surrogate by min(π_old / π_rollout, C). Values checked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from searchteam.llm.openai import _sampled_logprobs
from searchteam.rl.experience import Sample, collate
from searchteam.rl.losses import policy_loss, truncated_is_weights
from searchteam.rl.policy import build_policy
from searchteam.rl.run_log import mismatch_stats, mismatch_sums
from searchteam.rl.trainer import Trainer
from searchteam.types import Episode, Turn
from tests.rl.test_sampling import answer_episode, reward_paris, tokenizer  # noqa: F401  (fixture)
from tests.rl.test_trainer import config, tiny_model

LN = math.log


def test_truncated_is_weights_by_hand():
    old = torch.tensor([[LN(0.5), LN(0.2), LN(0.9)]])
    rollout = torch.tensor([[LN(0.25), LN(0.4), math.nan]])
    weights = truncated_is_weights(old, rollout, cap=1.5)
    # 0.5/0.25 = 2 → capped at 1.5; 0.2/0.4 = 0.5; no engine logprob → 1
    assert torch.allclose(weights, torch.tensor([[1.5, 0.5, 1.0]]))


def test_weighted_surrogate_by_hand_and_its_gradient():
    """Two tokens at ratio 1 with advantage 1: the GRPO surrogate is −ρ·A per token, token-mean. Weights
    1.5 and 1: loss −(1.5 + 1)/2 = −1.25, and each token's gradient is its weight times the unweighted one."""
    logprobs = torch.tensor([[LN(0.5), LN(0.2)]], requires_grad=True)
    old = logprobs.detach().clone()
    weights = torch.tensor([[1.5, 1.0]])
    mask, adv = torch.ones(1, 2), torch.tensor([1.0])
    out = policy_loss(logprobs, old, adv, mask, is_weights=weights)
    assert out.loss.item() == pytest.approx(-1.25)
    out.loss.backward()
    weighted = logprobs.grad.clone()
    logprobs.grad = None
    policy_loss(logprobs, old, adv, mask).loss.backward()
    assert torch.allclose(weighted, weights * logprobs.grad)


def test_mismatch_sums_and_stats_by_hand():
    sample = Sample(
        prompt_ids=[1],
        completion_ids=[5, 6, 7, 8],
        loss_mask=[1, 1, 1, 0],
        role="answer",
        episode_id=0,
        group_id="q",
        turn_index=0,
        old_logprobs=[LN(0.4), LN(0.25), LN(0.9), LN(0.1)],
        rollout_logprobs=[LN(0.5), LN(0.25), math.nan, LN(0.9)],  # unknown, then an untrained token
    )
    sums = mismatch_sums([sample])
    k3 = (0.8 - 1) - LN(0.8)  # r = 0.4 / 0.5 on the first token; 0 on the second (r = 1)
    assert sums["answer"] == pytest.approx([2, 0.1, 0.1, k3])
    stats = mismatch_stats([sums, {"answer": [2, 0.3, 0.3, 0.0]}])  # a second process's share
    assert stats["mismatch/prob_diff_mean/answer"] == pytest.approx(0.4 / 4)
    assert stats["mismatch/prob_diff_max/answer"] == pytest.approx(0.3)
    assert stats["mismatch/kl/answer"] == pytest.approx(k3 / 4)
    batch = collate([sample, Sample([1], [5], [1], "answer", 1, "q", 0)], pad_id=0)
    assert torch.isnan(batch.rollout_logprobs[1]).all()  # a sample without engine logprobs: all unknown


def test_server_logprobs_are_read_from_both_answer_shapes():
    assert _sampled_logprobs({"logprobs": {"token_logprobs": [-0.5, -1.0]}}, 2) == [-0.5, -1.0]
    assert _sampled_logprobs({"logprobs": {"content": [{"logprob": -0.5}]}}, 1) == [-0.5]
    assert _sampled_logprobs({"logprobs": {"token_logprobs": [-0.5]}}, 2) is None  # not one per token
    assert _sampled_logprobs({}, 2) is None


def engine_episode(tok, qid: str, correct: bool, shift: float) -> Episode:
    """An answer episode whose engine reported logprob `shift` for every sampled token."""
    episode = answer_episode(tok, qid, correct)
    turn: Turn = episode.turns[0]
    turn.logprobs = [shift] * len(turn.completion_token_ids)
    return episode


def test_the_step_record_reports_the_mismatch_and_the_cap_changes_the_update(tokenizer, tmp_path: Path):  # noqa: F811
    def rollout(step: int, attempt: int = 0) -> list[Episode]:
        return [engine_episode(tokenizer, "q1", c, -0.05) for c in (True, False)]

    records = {}
    for cap in (None, 0.5):
        cfg = config(steps=1, estimator="grpo", rollout_is_cap=cap)
        policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)
        (records[cap],) = Trainer(policy, rollout, reward_paris, cfg, tmp_path / str(cap)).train()
    plain, capped = records[None], records[0.5]
    # a random tiny model gives its tokens ~1/vocab, far below the engine's e^-0.05: a large mismatch
    assert 0.9 < plain["mismatch/prob_diff_mean/answer"] <= plain["mismatch/prob_diff_max/answer"] < 1.0
    assert plain["mismatch/kl/answer"] > 1.0
    assert capped["pg_loss"] != pytest.approx(plain["pg_loss"])  # min(π_old/π_rollout, 0.5) ≠ 1


def test_rollouts_without_engine_logprobs_log_no_mismatch(tokenizer, tmp_path: Path):  # noqa: F811
    cfg = config(steps=1, estimator="grpo")
    policy = build_policy(tiny_model(tokenizer), tokenizer, cfg)

    def rollout(step: int, attempt: int = 0) -> list[Episode]:
        return [answer_episode(tokenizer, "q1", c) for c in (True, False)]

    (record,) = Trainer(policy, rollout, reward_paris, cfg, tmp_path).train()
    assert not any(key.startswith("mismatch/") for key in record)
