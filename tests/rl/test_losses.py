"""Policy and value losses against hand-computed values: PPO clip branches, clip-higher, GSPO's sequence
ratio, k1/k3 KL, loss aggregation and loss masking."""

from __future__ import annotations

import math

import pytest
import torch

from searchteam.rl.losses import (
    aggregate,
    clipped_surrogate,
    kl_penalty,
    policy_loss,
    sequence_log_ratio,
    value_loss,
)

RATIOS = [1.1, 1.5, 0.5]  # inside, above and below the clip range [0.8, 1.2]


def logs(*ratios: float) -> torch.Tensor:
    return torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64)


@pytest.mark.parametrize(
    ("advantage", "expected", "clipped"),
    [
        (1.0, [-1.1, -1.2, -0.5], [False, True, False]),  # A > 0: only a ratio above 1 + ε is clipped
        (-1.0, [1.1, 1.5, 0.8], [False, False, True]),  # A < 0: only a ratio below 1 − ε is clipped
    ],
)
def test_ppo_clip_branches(advantage: float, expected: list[float], clipped: list[bool]):
    new = logs(*RATIOS).requires_grad_(True)
    old = torch.zeros_like(new)
    per_token, was_clipped = clipped_surrogate(
        torch.exp(new - old), torch.full_like(new, advantage), 0.2, 0.2
    )
    assert per_token[0].tolist() == pytest.approx(expected)
    assert was_clipped[0].tolist() == clipped
    per_token.sum().backward()
    grads = new.grad[0].tolist()
    for g, c, r in zip(grads, clipped, RATIOS, strict=True):
        assert g == pytest.approx(0.0 if c else -advantage * r)  # d(−A ρ)/d log π = −A ρ; clipped → 0


def test_policy_loss_token_mean_and_stats():
    new = logs(*RATIOS)
    out = policy_loss(
        new, torch.zeros_like(new), torch.tensor([1.0], dtype=torch.float64), torch.ones_like(new)
    )
    assert out.loss.item() == pytest.approx((-1.1 - 1.2 - 0.5) / 3)
    assert out.stats["clip_frac"] == pytest.approx(1 / 3)
    assert out.stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert out.stats["approx_kl"] == pytest.approx(-sum(math.log(r) for r in RATIOS) / 3)


def test_clip_higher_is_asymmetric():
    new = logs(1.25, 1.4, 0.75)
    old = torch.zeros_like(new)
    ratio = torch.exp(new - old)
    pos, _ = clipped_surrogate(ratio, torch.ones_like(new), clip_low=0.2, clip_high=0.28)
    assert pos[0].tolist() == pytest.approx([-1.25, -1.28, -0.75])  # 1.25 no longer clipped; ceiling 1.28
    neg, neg_clipped = clipped_surrogate(ratio, -torch.ones_like(new), clip_low=0.2, clip_high=0.28)
    assert neg[0].tolist() == pytest.approx([1.25, 1.4, 0.8])  # the floor stays at 1 − ε_low = 0.8
    assert neg_clipped[0].tolist() == [False, False, True]


def test_gspo_sequence_ratio_is_exp_of_mean_token_log_ratio():
    new = torch.tensor([[0.1, 0.3, 5.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(new)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)  # the third token is environment text
    assert sequence_log_ratio(new, old, mask).item() == pytest.approx(0.2)
    rho = math.exp(0.2)  # 1.2214 > 1 + ε_high = 1.2
    up = policy_loss(new, old, torch.tensor([1.0]), mask, level="sequence", agg="seq_mean")
    assert up.loss.item() == pytest.approx(-1.2)
    assert up.stats["clip_frac"] == 1.0 and up.stats["ratio_mean"] == pytest.approx(rho)
    down = policy_loss(new, old, torch.tensor([-1.0]), mask, level="sequence", agg="seq_mean")
    assert down.loss.item() == pytest.approx(rho)
    down.loss.backward()
    assert new.grad[0].tolist() == pytest.approx([rho / 2, rho / 2, 0.0])  # ∂ρ/∂log π_t = ρ / |o|


def test_gspo_wider_clip_leaves_sequence_unclipped():
    new = torch.tensor([[0.1, 0.3]], dtype=torch.float64)
    out = policy_loss(
        new,
        torch.zeros_like(new),
        torch.tensor([1.0]),
        torch.ones_like(new),
        level="sequence",
        clip_high=0.28,
    )
    assert out.loss.item() == pytest.approx(-math.exp(0.2))
    assert out.stats["clip_frac"] == 0.0


def test_aggregation_modes():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(values, mask, "seq_mean").item() == pytest.approx((2 + 4) / 2)
    # micro-batch parts normalized by the whole mini-batch's totals add up to the full-batch loss
    parts = [aggregate(values[i : i + 1], mask[i : i + 1], "token_mean", num_tokens=4.0) for i in range(2)]
    assert sum(p.item() for p in parts) == pytest.approx(10 / 4)


def test_kl_estimators():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - math.log(0.5) - 1)
    assert kl_penalty(logp, logp, "k3").item() == 0.0


def test_kl_penalty_adds_to_the_policy_loss():
    new = torch.tensor([[math.log(0.5), math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    base = policy_loss(new, new, torch.tensor([1.0]), torch.ones_like(new))
    with_kl = policy_loss(
        new, new, torch.tensor([1.0]), torch.ones_like(new), ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1"
    )
    assert with_kl.loss.item() == pytest.approx(base.loss.item() + 0.1 * math.log(2) / 2)
    assert with_kl.stats["kl_ref"] == pytest.approx(math.log(2) / 2)


def test_masked_env_tokens_get_no_gradient():
    new = torch.tensor([[0.1, 3.0, -0.2]], requires_grad=True)  # the middle token is retrieved text
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    out = policy_loss(new, torch.zeros_like(new), torch.tensor([2.0]), mask, clip_high=10.0, clip_low=0.9)
    out.loss.backward()
    assert new.grad[0, 1].item() == 0.0
    assert new.grad[0, 0].item() != 0.0 and new.grad[0, 2].item() != 0.0
    assert out.loss.item() == pytest.approx(-2.0 * (math.exp(0.1) + math.exp(-0.2)) / 2)


def test_value_loss_is_clipped():
    values = torch.tensor([1.0, 0.0])
    old = torch.tensor([0.5, 0.5])
    returns = torch.tensor([2.0, 0.0])
    # clipped values 0.7 and 0.3: squared errors max((1, 0), (1.69, 0.09)) = (1.69, 0.09)
    out = value_loss(values, old, returns, clip_eps=0.2)
    assert out.loss.item() == pytest.approx(0.5 * (1.69 + 0.09) / 2)
    assert out.stats["value_clip_frac"] == 1.0
    plain = value_loss(values, old, returns, clip_eps=None)
    assert plain.loss.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)


def test_token_entropy_of_a_hand_computed_distribution():
    """H(½, ¼, ¼) = ½ ln 2 + 2 · ¼ ln 4 = 1.5 ln 2 and a (near) point mass has 0, from shifted logits."""
    from searchteam.llm.logprobs import token_entropy

    probs = torch.tensor([[0.5, 0.25, 0.25], [1.0 - 2e-9, 1e-9, 1e-9]], dtype=torch.float64)
    got = token_entropy(torch.log(probs) + 3.0)  # logits are defined up to a constant
    assert got.tolist() == pytest.approx([1.5 * math.log(2), 0.0], abs=1e-7)


def test_entropy_bonus_reverses_the_gradient_of_a_confident_token():
    """Two tokens, π = softmax(z) with π(chosen) = 0.9, advantage 0.01. The PG loss −A·ρ has
    ∂/∂z_chosen = −A(1 − π) = −0.001 (raise the chosen token); the entropy H has ∂H/∂z_chosen =
    −π₀π₁ ln(π₀/π₁) = −0.09 ln 9 = −0.1978, so with c = 0.1 the loss − c·H has ∂/∂z_chosen = +0.0188 (spread
    the distribution instead)."""
    from searchteam.llm.logprobs import token_entropy

    def grad(coef: float) -> tuple[float, dict[str, float]]:
        z = torch.tensor([[[math.log(9.0), 0.0]]], dtype=torch.float64, requires_grad=True)
        logp = torch.log_softmax(z, -1)[..., 0]
        out = policy_loss(
            logp,
            logp.detach(),
            torch.tensor([0.01], dtype=torch.float64),
            torch.ones(1, 1),
            entropy=token_entropy(z),
            entropy_coef=coef,
        )
        out.loss.backward()
        return z.grad[0, 0, 0].item(), out.stats

    plain, stats = grad(0.0)
    bonus, _ = grad(0.1)
    assert plain == pytest.approx(-0.001)
    assert bonus == pytest.approx(-0.001 + 0.1 * 0.09 * math.log(9))
    assert stats["entropy"] == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)))


def test_sft_loss_is_beta_times_the_mean_token_nll():
    """DAC Eq. 8 term on target tokens with π = 0.5 and 0.25: β · (ln 2 + ln 4) / 2 = 0.05 · 1.5 ln 2."""
    import math

    from searchteam.rl.losses import sft_loss

    logprobs = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]], requires_grad=True)
    out = sft_loss(logprobs, torch.tensor([[1.0, 1.0, 0.0]]), coef=0.05)
    assert out.loss.item() == pytest.approx(0.05 * 1.5 * math.log(2))
    assert out.stats["sft_loss"] == pytest.approx(1.5 * math.log(2))
    out.loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-0.025, -0.025, 0.0])
