"""aggregate, policy_loss, sft_loss: values and gradients against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from relax_gym.trainer.algorithms import LossOutput, aggregate, policy_loss, sft_loss

NAN, INF = float("nan"), float("inf")


def leaf(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype, requires_grad=True)


def grads(t):
    return t.grad.tolist()


def flat(rows):
    return [x for row in rows for x in row]


def assert_grad(t, expected_rows):
    """Gradient of leaf ``t`` equals the nested list (approx), masked positions included."""
    assert flat(t.grad.tolist()) == pytest.approx(flat(expected_rows))


# ---------------------------------------------------------------------------------------------- aggregate
# Ragged mask with an all-padding third row; garbage (NaN/inf) at masked positions must not leak.
VALUES = [[1.0, 2.0, 3.0, NAN], [5.0, 6.0, INF, -INF], [NAN, INF, 7.0, 8.0]]
MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "value", "grad_rows"),
    [
        ("token_mean", 17 / 5, [1 / 5, 1 / 5]),  # (1+2+3+5+6) / 5 tokens
        ("seq_mean_token_mean", (6 / 3 + 11 / 2) / 2, [1 / 6, 1 / 4]),  # 2 non-empty sequences
        ("seq_mean_token_sum", (6 + 11) / 2, [1 / 2, 1 / 2]),
    ],
)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.long])
def test_aggregate_modes_on_ragged_mask(mode, value, grad_rows, mask_dtype):
    values = leaf(VALUES)
    out = aggregate(values, torch.tensor(MASK, dtype=mask_dtype), mode)
    assert out.item() == pytest.approx(value)
    out.backward()
    g0, g1 = grad_rows
    assert_grad(values, [[g0, g0, g0, 0.0], [g1, g1, 0.0, 0.0], [0.0] * 4])


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_aggregate_all_masked_is_zero_with_grad(mode):
    values = leaf(VALUES)
    out = aggregate(values, torch.zeros(3, 4), mode)
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert grads(values) == [[0.0] * 4] * 3


def test_aggregate_bad_inputs():
    with pytest.raises(ValueError, match="mode"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 2), "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        aggregate(torch.zeros(2, 2), torch.ones(2, 3))


# ---------------------------------------------------------------------------------------------- policy_loss
def test_ratio_one_gives_minus_mean_advantage_and_its_gradient():
    lp = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.2, -INF]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, NAN]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = policy_loss(lp, old, torch.tensor([1.0, -2.0]), mask)
    assert isinstance(out, LossOutput)
    assert out.loss.item() == pytest.approx(-(1.0 * 3 - 2.0 * 2) / 5)  # token-weighted -mean(A)
    out.loss.backward()
    assert_grad(lp, [[-1 / 5] * 3, [2 / 5, 2 / 5, 0.0]])  # -A / 5 tokens
    m = out.metrics
    assert m["ratio_mean"] == pytest.approx(1.0)
    assert m["clip_frac_low"] == m["clip_frac_high"] == m["approx_kl"] == 0.0
    assert m["tokens"] == 5.0
    assert all(math.isfinite(v) for v in m.values())


def test_ratio_one_with_sequence_mean_aggregation():
    lp = leaf([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]])
    out = policy_loss(lp, lp.detach().clone(), torch.tensor([1.0, -2.0]), torch.tensor([[1, 1, 1], [1, 1, 0]]),
                      aggregation="seq_mean_token_mean")
    assert out.loss.item() == pytest.approx(-(1.0 - 2.0) / 2)
    out.loss.backward()
    assert_grad(lp, [[-1 / 6] * 3, [1 / 2, 1 / 2, 0.0]])  # -A / (tokens * sequences)


def test_per_token_advantages_equal_broadcast_ones():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    old = torch.tensor([[-1.1, -1.8], [-0.4, -0.3]])
    mask = torch.ones(2, 2)
    a = policy_loss(lp, old, torch.tensor([0.5, -1.5]), mask)
    b = policy_loss(lp, old, torch.tensor([[0.5, 0.5], [-1.5, -1.5]]), mask)
    assert a.loss.item() == pytest.approx(b.loss.item())


def clip_case(ratios, advantages, **kwargs):
    lp = leaf([[math.log(r) for r in ratios]])
    out = policy_loss(lp, torch.zeros_like(lp), torch.tensor([advantages], dtype=torch.float64),
                      torch.ones_like(lp), **kwargs)
    out.loss.backward()
    return out, grads(lp)[0]


def test_clipping_on_both_sides():
    # token: A=+1 r=1.5 clipped high | A=-1 r=0.5 clipped low | A=+1 r=0.5 unclipped | A=-1 r=1.5 unclipped
    out, g = clip_case([1.5, 0.5, 0.5, 1.5], [1.0, -1.0, 1.0, -1.0])
    per_token = [-1.2, 0.8, -0.5, 1.5]
    assert out.loss.item() == pytest.approx(sum(per_token) / 4)
    # d/dlp of -A * r is -A * r; clipped tokens get exactly zero.
    assert g == pytest.approx([0.0, 0.0, -0.5 / 4, 1.5 / 4])
    assert g[0] == 0.0 and g[1] == 0.0
    assert out.metrics["clip_frac_high"] == 0.25
    assert out.metrics["clip_frac_low"] == 0.25
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    kl = sum(r - 1 - math.log(r) for r in (1.5, 0.5, 0.5, 1.5)) / 4
    assert out.metrics["approx_kl"] == pytest.approx(kl)


def test_clip_higher_is_asymmetric():
    # A=+1 at r=1.25 and A=-1 at r=0.79
    sym, g_sym = clip_case([1.25, 0.79], [1.0, -1.0], clip_low=0.2, clip_high=0.2)
    dapo, g_dapo = clip_case([1.25, 0.79], [1.0, -1.0], clip_low=0.2, clip_high=0.28)
    assert sym.loss.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert g_sym == [0.0, 0.0]
    assert dapo.loss.item() == pytest.approx((-1.25 + 0.8) / 2)  # high side no longer clipped at 1.25
    assert g_dapo == pytest.approx([-1.25 / 2, 0.0])  # low side still clipped at 0.8
    assert (sym.metrics["clip_frac_high"], dapo.metrics["clip_frac_high"]) == (0.5, 0.0)
    assert sym.metrics["clip_frac_low"] == dapo.metrics["clip_frac_low"] == 0.5


def test_gspo_sequence_ratio_value_and_shared_gradient():
    # row 0 token log-ratios [0.1, -0.2, 0.4] -> mean 0.1; row 1 [0.3, 0.1, masked] -> mean 0.2
    lp = leaf([[0.1, -0.2, 0.4], [0.3, 0.1, NAN]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = policy_loss(lp, torch.zeros(2, 3, dtype=torch.float64), torch.tensor([1.0, -1.0]), mask,
                      ratio_level="sequence", aggregation="seq_mean_token_mean", clip_low=0.5, clip_high=0.5)
    s0, s1 = math.exp(0.1), math.exp(0.2)
    assert out.loss.item() == pytest.approx((-s0 + s1) / 2)
    assert out.metrics["ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5)
    out.loss.backward()
    # every token carries its sequence's ratio: d/dlp_t = -A * s / (tokens * sequences)
    assert_grad(lp, [[-s0 / 6] * 3, [s1 / 4, s1 / 4, 0.0]])
    # token-level ratios would have given different gradients within a row
    lp2 = lp.detach().clone().requires_grad_(True)
    policy_loss(lp2, torch.zeros(2, 3, dtype=torch.float64), torch.tensor([1.0, -1.0]), mask,
                aggregation="seq_mean_token_mean", clip_low=0.5, clip_high=0.5).loss.backward()
    assert lp2.grad[0, 0].item() != pytest.approx(lp2.grad[0, 1].item())


def test_gspo_gradient_equals_the_sequence_objective():
    lp = leaf([[0.01, -0.02, 0.04, 0.03]])
    policy_loss(lp, torch.zeros_like(lp), torch.tensor([2.0]), torch.ones(1, 4), ratio_level="sequence",
                aggregation="seq_mean_token_mean", clip_low=0.5, clip_high=0.5).loss.backward()
    # -A * exp(mean(lp - old)) without any stop-gradient: d/dlp_t = -A * s / 4
    s = math.exp(0.015)
    assert grads(lp)[0] == pytest.approx([-2.0 * s / 4] * 4)


def test_gspo_clips_whole_sequences_with_the_paper_range():
    # token log-ratios [0.001, -0.0005, -0.0002]: token 0 alone (ratio 1.001) is outside 1 + 4e-4, but the
    # sequence ratio exp(1e-4) is inside, so nothing is clipped at the sequence level.
    inside = leaf([[0.001, -0.0005, -0.0002]])
    out = policy_loss(inside, torch.zeros_like(inside), torch.tensor([1.0]), torch.ones(1, 3), ratio_level="sequence",
                      aggregation="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4)
    out.loss.backward()
    assert grads(inside)[0] == pytest.approx([-math.exp(1e-4) / 3] * 3)
    assert out.metrics["clip_frac_high"] == 0.0
    # sequence ratio exp(0.1) > 1 + 4e-4 with A > 0: every token of the sequence is clipped together
    outside = leaf([[0.1, -0.2, 0.4], [0.0, 0.0, 0.0]])
    out = policy_loss(outside, torch.zeros_like(outside), torch.tensor([1.0, 1.0]), torch.ones(2, 3),
                      ratio_level="sequence", clip_low=3e-4, clip_high=4e-4)
    out.loss.backward()
    assert grads(outside)[0] == [0.0, 0.0, 0.0]
    assert grads(outside)[1] == pytest.approx([-1 / 6] * 3)
    assert out.metrics["clip_frac_high"] == 0.5


def test_truncated_importance_sampling_weights():
    # ratio 1, A = 1; exp(old - rollout) = [3, 0.5, 1] -> capped at 2 -> [2, 0.5, 1]
    lp = leaf([[-1.0, -2.0, -0.5]])
    old = lp.detach().clone().requires_grad_(True)
    rollout = (old.detach() - torch.tensor([[math.log(3.0), math.log(0.5), 0.0]], dtype=torch.float64)).requires_grad_(True)
    out = policy_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 3), rollout_logprobs=rollout, tis_cap=2.0)
    assert out.loss.item() == pytest.approx(-(2.0 + 0.5 + 1.0) / 3)
    out.loss.backward()
    assert grads(lp)[0] == pytest.approx([-2 / 3, -0.5 / 3, -1 / 3])
    assert old.grad is None and rollout.grad is None  # weights (and old) are detached
    assert out.metrics["is_weight_mean"] == pytest.approx(3.5 / 3)
    assert out.metrics["is_capped_share"] == pytest.approx(1 / 3)
    uncapped = policy_loss(lp.detach(), old.detach(), torch.tensor([1.0]), torch.ones(1, 3),
                           rollout_logprobs=rollout.detach())
    assert uncapped.loss.item() == pytest.approx(-(3.0 + 0.5 + 1.0) / 3)
    assert uncapped.metrics["is_capped_share"] == 0.0
    plain = policy_loss(lp.detach(), old.detach(), torch.tensor([1.0]), torch.ones(1, 3))
    assert "is_weight_mean" not in plain.metrics


def test_kl_term_is_added_with_its_coefficient():
    lp = leaf([[math.log(0.5), math.log(0.5)]])
    ref = torch.full((1, 2), math.log(0.25), dtype=torch.float64)
    k3 = math.log(2.0) - 0.5
    out = policy_loss(lp, lp.detach().clone(), torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1)
    assert out.loss.item() == pytest.approx(0.1 * k3)
    out.loss.backward()
    assert grads(lp)[0] == pytest.approx([0.1 * (1 - 0.5) / 2] * 2)  # coef * (1 - ref/pi) / tokens
    assert out.metrics["kl_ref"] == pytest.approx(k3)
    assert out.metrics["kl_loss"] == pytest.approx(0.1 * k3)
    # with advantages: the KL adds exactly coef * mean KL on top of the surrogate
    adv = torch.tensor([1.5])
    base = policy_loss(lp.detach(), lp.detach(), adv, torch.ones(1, 2)).loss.item()
    with_k1 = policy_loss(lp.detach(), lp.detach(), adv, torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.3, kl_kind="k1")
    assert with_k1.loss.item() == pytest.approx(base + 0.3 * math.log(2.0))
    reported = policy_loss(lp.detach(), lp.detach(), adv, torch.ones(1, 2), ref_logprobs=ref)
    assert reported.loss.item() == pytest.approx(base)
    assert reported.metrics["kl_ref"] == pytest.approx(k3)


def test_all_masked_batch_gives_finite_zero():
    lp = leaf([[NAN, -INF], [INF, -1.0]])
    for level in ("token", "sequence"):
        lp.grad = None
        out = policy_loss(lp, torch.full((2, 2), NAN, dtype=torch.float64), torch.tensor([1.0, NAN]),
                          torch.zeros(2, 2), ratio_level=level, ref_logprobs=torch.zeros(2, 2, dtype=torch.float64),
                          kl_coef=0.1, rollout_logprobs=torch.full((2, 2), -INF, dtype=torch.float64), tis_cap=2.0)
        assert out.loss.item() == 0.0
        out.loss.backward()
        assert grads(lp) == [[0.0, 0.0], [0.0, 0.0]]
        assert all(math.isfinite(v) for v in out.metrics.values())
        assert out.metrics["tokens"] == 0.0


def test_policy_loss_argument_errors():
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(z, z, torch.zeros(1), z, kl_coef=0.1)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(z, z, torch.zeros(1), z, clip_low=1.0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(z, z, torch.zeros(3), z)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(z, torch.zeros(1, 3), torch.zeros(1), z)


# ---------------------------------------------------------------------------------------------- sft_loss
def test_sft_loss_is_masked_nll():
    lp = leaf([[math.log(0.5), math.log(0.25), NAN], [math.log(0.125), -INF, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = sft_loss(lp, mask)
    ln2 = math.log(2.0)
    assert out.loss.item() == pytest.approx((1 + 2 + 3) * ln2 / 3)
    out.loss.backward()
    assert_grad(lp, [[-1 / 3, -1 / 3, 0.0], [-1 / 3, 0.0, 0.0]])
    assert out.metrics["nll"] == pytest.approx(2 * ln2)
    assert out.metrics["ppl"] == pytest.approx(4.0)
    seq = sft_loss(lp.detach(), mask, aggregation="seq_mean_token_mean")
    assert seq.loss.item() == pytest.approx(((1 + 2) / 2 * ln2 + 3 * ln2) / 2)
    assert sft_loss(lp.detach(), torch.zeros(2, 3)).loss.item() == 0.0
