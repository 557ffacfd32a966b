"""Advantage estimators against hand-computed values (GAE, GRPO, DECOR Eq. 6, DAPO dynamic sampling)."""

from __future__ import annotations

import math

import pytest
import torch

from searchteam.rl.advantages import (
    _ESTIMATORS,
    AdvantageEstimator,
    adv_estimator_names,
    assign_advantages,
    gae,
    get_adv_estimator,
    group_normalize,
    informative_groups,
    informative_mask,
    register_adv_est,
    whiten,
)
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Sample
from searchteam.rl.trainer import lr_multiplier


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def test_gae_matches_hand_computation():
    # δ2 = 2 − 0.1 = 1.9; δ1 = 0.9·0.1 − 0.2 = −0.11; δ0 = 1 + 0.9·0.2 − 0.5 = 0.68; γλ = 0.72
    adv, ret = gae(t(1.0, 0.0, 2.0), t(0.5, 0.2, 0.1), gamma=0.9, lam=0.8)
    a2 = 1.9
    a1 = -0.11 + 0.72 * a2
    a0 = 0.68 + 0.72 * a1
    assert adv.tolist() == pytest.approx([a0, a1, a2])
    assert ret.tolist() == pytest.approx([a0 + 0.5, a1 + 0.2, a2 + 0.1])


def test_gae_with_gamma_lambda_one_is_reward_to_go():
    adv, ret = gae(t(1.0, 0.0, 2.0), t(0.0, 0.0, 0.0), gamma=1.0, lam=1.0)
    assert adv.tolist() == [3.0, 2.0, 2.0]
    assert ret.tolist() == [3.0, 2.0, 2.0]
    adv, ret = gae(t(1.0, 0.0, 2.0), t(0.5, 0.2, 0.1), gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([2.5, 1.8, 1.9])
    assert ret.tolist() == pytest.approx([3.0, 2.0, 2.0])


def test_gae_with_lambda_zero_is_one_step_td():
    adv, _ = gae(t(1.0, 0.0, 2.0), t(0.5, 0.2, 0.1), gamma=0.9, lam=0.0)
    assert adv.tolist() == pytest.approx([0.68, -0.11, 1.9])


def test_grpo_group_normalization():
    rewards = t(1.0, 0.0, 0.0, 0.0, 2.0, 4.0, 7.0)
    keys = ["a", "a", "a", "a", "b", "b", "c"]
    # group a: mean 0.25, sample std sqrt((0.75² + 3·0.25²)/3) = 0.5; group b: mean 3, std √2; c: alone
    adv = group_normalize(rewards, keys, eps=0.0)
    s2 = 1 / math.sqrt(2)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, -s2, s2, 0.0])
    centered = group_normalize(rewards, keys, scale=False)
    assert centered.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, -1.0, 1.0, 0.0])


def test_grpo_equal_rewards_give_zero_and_nan_propagates():
    assert group_normalize(t(1.0, 1.0, 1.0), ["g"] * 3, eps=0.0).tolist() == [0.0, 0.0, 0.0]
    assert torch.isnan(group_normalize(t(1.0, float("nan")), ["g"] * 2)).all()


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    keep = informative_groups([1, 1, 0, 1, 0, 0, 0.5], ["a", "a", "b", "b", "c", "c", "d"])
    assert keep == [False, False, True, True, False, False, False]
    assert informative_groups([float("nan"), 1.0], ["a", "a"]) == [True, True]


def test_whiten():
    out = whiten(t(1.0, 2.0, 3.0))
    assert out.tolist() == pytest.approx([-1.0, 0.0, 1.0])


def _sample(role: str, group: str, episode: int, turn: int, reward: float) -> Sample:
    return Sample([1], [2], [1], role, episode, group, turn, reward=reward)


def test_assign_advantages_per_estimator():
    samples = [
        _sample("plan", "q", 0, 0, 1.0),
        _sample("answer", "q", 0, 1, 2.0),
        _sample("plan", "q", 1, 0, 0.0),
        _sample("answer", "q", 1, 1, 1.0),
    ]
    assign_advantages(samples, TrainConfig(estimator="gae", gamma=1.0, lam=1.0))
    assert [s.advantage for s in samples] == [3.0, 2.0, 1.0, 1.0]  # reward-to-go within each episode
    assign_advantages(samples, TrainConfig(estimator="role_grpo", adv_eps=1e-12))
    s2 = 1 / math.sqrt(2)  # plan {1, 0} and answer {2, 1}: ±0.5 / √0.5
    assert [s.advantage for s in samples] == pytest.approx([s2, s2, -s2, -s2])


def test_lr_schedule_warmup_then_decay():
    cfg = TrainConfig(steps=10, warmup_steps=2, schedule="linear", min_lr_ratio=0.0)
    assert [lr_multiplier(s, cfg) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert lr_multiplier(6, cfg) == pytest.approx(0.5)
    cos = TrainConfig(steps=10, warmup_steps=0, schedule="cosine", min_lr_ratio=0.1)
    assert lr_multiplier(5, cos) == pytest.approx(0.1 + 0.9 * 0.5)


def test_grpo_normalizes_over_trajectories_not_turns():
    """QAgent Eq. 1: a 3-turn trajectory scoring 1 and a 1-turn trajectory scoring 0 are two members of the
    group: Â = (R − 0.5) / std(1, 0) = ±1/√2 on every turn of each (per-turn statistics gave +0.5 / −1.5)."""
    samples = [_sample("agent", "q", 0, i, 1.0) for i in range(3)] + [_sample("agent", "q", 1, 0, 0.0)]
    assign_advantages(samples, TrainConfig(estimator="grpo", adv_eps=1e-12))
    s2 = 1 / math.sqrt(2)
    assert [s.advantage for s in samples] == pytest.approx([s2, s2, s2, -s2])


def test_role_grpo_scores_each_role_of_a_trajectory_once():
    """DECOR Eq. 6 per trajectory and role: trajectory 0 has planner turns 1 and 0 (mean 0.5) and trajectory
    1 one planner turn of 0; the planner group is {0.5, 0}: ±1/√2. Answerers {1, 1} carry no signal."""
    samples = [
        _sample("planner", "q", 0, 0, 1.0),
        _sample("planner", "q", 0, 1, 0.0),
        _sample("answerer", "q", 0, 2, 1.0),
        _sample("planner", "q", 1, 0, 0.0),
        _sample("answerer", "q", 1, 1, 1.0),
    ]
    assign_advantages(samples, TrainConfig(estimator="role_grpo", adv_eps=1e-12))
    s2 = 1 / math.sqrt(2)
    assert [s.advantage for s in samples] == pytest.approx([s2, s2, 0.0, -s2, 0.0])


def test_subgroups_are_normalized_apart():
    """DAC's hard-positive generator turns (`subgroup`) form their own GRPO group within the question."""
    samples = [
        _sample("generator", "q", 0, 0, 1.0),
        _sample("generator", "q", 1, 0, 0.0),
        Sample([1], [2], [1], "generator", 0, "q", 1, reward=0.0, subgroup="hard_positive"),
        Sample([1], [2], [1], "generator", 1, "q", 1, reward=0.0, subgroup="hard_positive"),
    ]
    assign_advantages(samples, TrainConfig(estimator="grpo", adv_eps=1e-12))
    s2 = 1 / math.sqrt(2)
    assert [s.advantage for s in samples] == pytest.approx([s2, -s2, 0.0, 0.0])


def test_role_estimators_mix_gae_and_grpo():
    """DAC (Appendix B.1): searcher PPO + GAE (γ = λ = 1, V = 0: reward-to-go over its own turns only),
    generator GRPO over the group's trajectories."""
    samples = [
        _sample("searcher", "q", 0, 0, 0.0),
        _sample("searcher", "q", 0, 1, 1.0),
        _sample("generator", "q", 0, 2, 1.0),
        _sample("searcher", "q", 1, 0, 1.0),
        _sample("searcher", "q", 1, 1, -1.0),
        _sample("generator", "q", 1, 2, 0.0),
    ]
    cfg = TrainConfig(
        estimator="grpo",
        adv_eps=1e-12,
        role_estimators={"searcher": {"estimator": "gae", "gamma": 1, "lam": 1}},
    )
    assert cfg.uses_critic and cfg.estimator_of("generator").estimator == "grpo"
    assign_advantages(samples, cfg)
    s2 = 1 / math.sqrt(2)
    assert [s.advantage for s in samples] == pytest.approx([1.0, 1.0, s2, 0.0, -1.0, -s2])
    assert [s.returns for s in samples][:2] == pytest.approx([1.0, 1.0])


def test_shipped_mask_recipe_gives_each_transition_its_own_return():
    """M-ASK Algorithm 1: plan r = F1(a_0) = 0, search/summary/update share ΔF1 = 0.5, answer F1(a_1) = 0.5,
    the <end> search 0. With the shipped recipe every return equals its own reward (GAE with γ = λ = 1 over
    the interleaved roles gave the plan turn 2.0 and the first search 2.0)."""
    from pathlib import Path

    from searchteam.train.config import load_train_run_config

    rewards = [0.0, 0.5, 0.5, 0.5, 0.5, 0.0]  # plan, search, summary, update, answer, search <end>
    roles = ["plan", "search", "summary", "update", "answer", "search"]
    for name in ("mask/smollm135m-cpu", "mask/qwen7b-gpu"):
        cfg = load_train_run_config(Path(name), {}).train
        samples = [_sample(r, "q", 0, i, x) for i, (r, x) in enumerate(zip(roles, rewards, strict=True))]
        assign_advantages(samples, cfg)
        assert [s.returns for s in samples] == pytest.approx(rewards), name
        assert [s.advantage for s in samples] == pytest.approx(rewards), name  # V = 0 before training


def test_sft_samples_get_no_advantage():
    samples = [_sample("generator", "q", 0, 0, 1.0), _sample("generator", "q", 1, 0, 0.0)]
    samples.append(Sample([1], [2], [1], "generator", 1, "q", 0, sft=True))
    assign_advantages(samples, TrainConfig(estimator="grpo", adv_eps=1e-12))
    assert samples[2].advantage == 0.0 and samples[0].advantage > 0


def test_credit_stats_report_each_roles_mean_return_and_advantage():
    from searchteam.rl.run_log import credit_stats

    samples = [_sample("plan", "q", 0, 0, 0.0), _sample("answer", "q", 0, 1, 0.5)]
    assign_advantages(samples, TrainConfig(estimator="gae", gamma=0.0))
    assert credit_stats(samples) == {
        "return/answer": 0.5,
        "abs_advantage/answer": 0.5,
        "return/plan": 0.0,
        "abs_advantage/plan": 0.0,
    }


def test_a_config_names_estimators_from_the_registry(monkeypatch: pytest.MonkeyPatch):
    assert adv_estimator_names() == ["gae", "grpo", "role_grpo"]
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; registered: gae, grpo"):
        TrainConfig(estimator="ppo")
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        TrainConfig(role_estimators={"searcher": {"estimator": "ppo"}})
    monkeypatch.setitem(_ESTIMATORS, "ppo", AdvantageEstimator("ppo", lambda s, o, c: None, False, None))
    assert TrainConfig(estimator="ppo").estimator == "ppo"  # a registered estimator needs no config edit


def test_the_registry_refuses_unknown_and_duplicate_names():
    assert get_adv_estimator("gae").critic and get_adv_estimator("role_grpo").by_role
    with pytest.raises(
        ValueError, match="unknown advantage estimator 'ppo'; registered: gae, grpo, role_grpo"
    ):
        get_adv_estimator("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est("grpo")(lambda samples, options, config: None)


def test_advantages_and_dynamic_sampling_follow_the_registry(monkeypatch: pytest.MonkeyPatch):
    """What `grpo` is registered as decides the advantages and which groups DAPO keeps."""

    def reward_as_advantage(samples: list[Sample], options, config) -> None:
        for s in samples:
            s.advantage, s.returns = 10 * s.reward, s.reward

    monkeypatch.setitem(_ESTIMATORS, "grpo", AdvantageEstimator("grpo", reward_as_advantage, False, None))
    samples = [_sample("agent", "q", 0, 0, 1.0), _sample("agent", "q", 1, 0, 1.0)]
    cfg = TrainConfig(estimator="grpo")
    assign_advantages(samples, cfg)
    assert [s.advantage for s in samples] == [10.0, 10.0]
    assert informative_mask(samples, cfg) == [True, True]  # not group-relative: no group is dropped
    monkeypatch.undo()
    assert informative_mask(samples, cfg) == [False, False]  # GRPO: equal rewards carry no signal
