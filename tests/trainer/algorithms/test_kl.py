"""k1 / k2 / k3 KL estimators at hand-computed points, and their expectations on a small categorical."""

from __future__ import annotations

import math

import pytest
import torch

from relax_gym.trainer.algorithms import kl_penalty

LN2 = math.log(2.0)


def test_values_at_ratio_two_and_one_half():
    lp = torch.tensor([math.log(0.5), math.log(0.25)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25), math.log(0.5)], dtype=torch.float64)
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([LN2, -LN2])
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx([0.5 * LN2**2, 0.5 * LN2**2])
    # k3 = exp(ref - lp) - (ref - lp) - 1: 0.5 + ln2 - 1 and 2 - ln2 - 1
    assert kl_penalty(lp, ref, "k3").tolist() == pytest.approx([LN2 - 0.5, 1.0 - LN2])


@pytest.mark.parametrize("kind", ["k1", "k2", "k3"])
def test_zero_at_equality(kind):
    x = torch.tensor([-3.0, -0.1, 0.0])
    assert kl_penalty(x, x.clone(), kind).tolist() == [0.0, 0.0, 0.0]


def test_k3_and_k2_are_nonnegative():
    grid = torch.linspace(-8, 0, 41, dtype=torch.float64)
    lp, ref = torch.meshgrid(grid, grid, indexing="ij")
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert (kl_penalty(lp, ref, "k2") >= 0).all()
    assert (kl_penalty(lp, ref, "k1") < 0).any()


def test_k3_gradient_is_one_minus_ref_over_pi():
    lp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    kl_penalty(lp, torch.tensor([math.log(0.25)], dtype=torch.float64), "k3").sum().backward()
    assert lp.grad.item() == pytest.approx(1.0 - 0.5)


def test_k1_and_k3_are_unbiased_for_kl_under_the_policy():
    p = [0.5, 0.3, 0.2]
    q = [0.2, 0.5, 0.3]
    true_kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    lp = torch.tensor([math.log(x) for x in p], dtype=torch.float64)
    ref = torch.tensor([math.log(x) for x in q], dtype=torch.float64)
    weights = torch.tensor(p, dtype=torch.float64)
    for kind in ("k1", "k3"):
        assert (weights * kl_penalty(lp, ref, kind)).sum().item() == pytest.approx(true_kl)


def test_unknown_kind():
    with pytest.raises(ValueError, match="k4"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")  # type: ignore[arg-type]
