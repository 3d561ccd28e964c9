"""Token-level GAE, whitening, explained variance and the clipped value loss, against numbers worked out by hand."""

from __future__ import annotations

import pytest
import torch

from relax_gym.trainer.algorithms import (
    explained_variance,
    gae,
    gae_rows,
    value_loss,
    whiten,
)

INF, NAN = float("inf"), float("nan")


def t(rows, dtype=torch.float64):
    return torch.tensor(rows, dtype=dtype)


def test_monte_carlo_when_gamma_and_lambda_are_one():
    """gamma = lam = 1: A_i = R - V_i, and every return is the reward."""
    adv, ret = gae(t([[0.5, 0.2, 0.4]]), t([1.0]), t([[1, 1, 1]]), gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.8, 0.6])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_discount_and_lambda_below_one():
    """gamma 0.9, lam 0.5 (gamma*lam 0.45), V = (0.5, 0.2, 0.4), R = 1 at the last token:
    deltas  0.9*0.2-0.5 = -0.32, 0.9*0.4-0.2 = 0.16, 1-0.4 = 0.6
    A       -0.32+0.45*0.43 = -0.1265, 0.16+0.45*0.6 = 0.43, 0.6;   returns A + V."""
    adv, ret = gae(t([[0.5, 0.2, 0.4]]), t([1.0]), t([[1, 1, 1]]), gamma=0.9, lam=0.5)
    assert adv[0].tolist() == pytest.approx([-0.1265, 0.43, 0.6])
    assert ret[0].tolist() == pytest.approx([0.3735, 0.63, 1.0])


def test_one_step_td_when_lambda_is_zero():
    adv, _ = gae(t([[0.5, 0.2, 0.4]]), t([1.0]), t([[1, 1, 1]]), gamma=0.9, lam=0.0)
    assert adv[0].tolist() == pytest.approx([-0.32, 0.16, 0.6])


# A batch of three: a two-turn episode (prompt, turn 1 = positions 1-2, env reply 3-4, turn 2 = position 5,
# padding), a one-turn episode, and a row with nothing trained. Masked positions hold garbage that must not leak.
VALUES = [[9.0, 0.1, 0.3, INF, NAN, 0.6, -7.0, 3.0],
          [0.5, -0.5, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0],
          [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]]
MASK = [[0, 1, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0]]
REWARDS = [2.0, 0.0, 5.0]
# gamma 0.9, lam 0.8 (gamma*lam 0.72). Row 0's chain is V = (0.1, 0.3, 0.6) at positions 1, 2, 5:
#   deltas 0.9*0.3-0.1 = 0.17, 0.9*0.6-0.3 = 0.24, 2-0.6 = 1.4
#   A      0.17+0.72*1.248 = 1.06856, 0.24+0.72*1.4 = 1.248, 1.4
# Row 1: V = (0.5, -0.5), R = 0: deltas 0.9*-0.5-0.5 = -0.95, 0.5; A = -0.95+0.72*0.5 = -0.59, 0.5
ADV = [[0.0, 1.06856, 1.248, 0.0, 0.0, 1.4, 0.0, 0.0],
       [-0.59, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
       [0.0] * 8]
RET = [[0.0, 1.16856, 1.548, 0.0, 0.0, 2.0, 0.0, 0.0],
       [-0.09, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
       [0.0] * 8]


def test_a_multi_turn_episode_is_one_chain_over_its_trained_tokens():
    adv, ret = gae(t(VALUES), t(REWARDS), t(MASK), gamma=0.9, lam=0.8)
    for got, want in zip(adv.tolist(), ADV):
        assert got == pytest.approx(want)
    for got, want in zip(ret.tolist(), RET):
        assert got == pytest.approx(want)


def test_results_keep_the_values_dtype_and_ignore_their_gradient():
    values = t(VALUES, torch.float32).nan_to_num(posinf=0.0).requires_grad_(True)
    adv, ret = gae(values, t(REWARDS, torch.float32), t(MASK), gamma=0.9, lam=0.8)
    assert adv.dtype == ret.dtype == torch.float32 and not adv.requires_grad and not ret.requires_grad


def test_gae_rows_on_ragged_rows_equals_the_padded_batch():
    rows = [t(VALUES[0]), t(VALUES[1][:2]), t(VALUES[2][:3])]
    masks = [t(MASK[0]), t(MASK[1][:2]), t(MASK[2][:3])]
    adv, ret = gae_rows(rows, masks, REWARDS, gamma=0.9, lam=0.8, whiten_advantages=False)
    assert [len(a) for a in adv] == [8, 2, 3] and [len(r) for r in ret] == [8, 2, 3]
    assert all(a.dtype == torch.float32 for a in adv)
    assert adv[0].tolist() == pytest.approx(ADV[0]) and adv[1].tolist() == pytest.approx(ADV[1][:2])
    assert ret[1].tolist() == pytest.approx(RET[1][:2]) and adv[2].tolist() == [0.0, 0.0, 0.0]
    white, same_ret = gae_rows(rows, masks, REWARDS, gamma=0.9, lam=0.8, whiten_advantages=True)
    flat = torch.tensor([x for row, m in zip(ADV, MASK) for x, k in zip(row, m) if k], dtype=torch.float64)
    expected = (flat - flat.mean()) / flat.std(unbiased=False)
    got = [x for row, m in zip(white, masks) for x, k in zip(row.tolist(), m.tolist()) if k]
    assert got == pytest.approx(expected.tolist(), abs=1e-6)
    assert white[0][0] == 0.0 and white[1].tolist()[0] == pytest.approx(expected[3].item(), abs=1e-6)
    assert [r.tolist() for r in same_ret] == [r.tolist() for r in ret]  # whitening leaves the critic's targets alone


def test_gae_refuses_bad_shapes_and_knobs():
    with pytest.raises(ValueError, match="rewards must be"):
        gae(t([[0.0, 0.0]]), t([1.0, 2.0]), t([[1, 1]]))
    with pytest.raises(ValueError, match="mask must be"):
        gae(t([[0.0, 0.0]]), t([1.0]), t([[1, 1, 1]]))
    with pytest.raises(ValueError, match="gamma"):
        gae(t([[0.0]]), t([1.0]), t([[1]]), gamma=0.0)
    with pytest.raises(ValueError, match="one values row"):
        gae_rows([t([0.0])], [], [1.0], gamma=1.0, lam=1.0, whiten_advantages=False)


def test_whiten_over_the_valid_positions_of_the_batch():
    """Valid (1, 2, 3) and (5): mean 2.75, population std sqrt(((1.75)^2 + 0.75^2 + 0.25^2 + 2.25^2) / 4)."""
    x = t([[1.0, 2.0, 3.0, NAN], [5.0, INF, 0.0, 0.0]])
    m = t([[1, 1, 1, 0], [1, 0, 0, 0]])
    std = ((1.75**2 + 0.75**2 + 0.25**2 + 2.25**2) / 4) ** 0.5
    out = whiten(x, m, eps=0.0)
    assert out[0].tolist() == pytest.approx([-1.75 / std, -0.75 / std, 0.25 / std, 0.0])
    assert out[1].tolist() == pytest.approx([2.25 / std, 0.0, 0.0, 0.0])
    assert whiten(t([[4.0, 4.0]]), t([[1, 1]])).tolist() == [[0.0, 0.0]]  # no spread: nothing to tell apart
    assert whiten(t([[4.0]]), t([[0]])).tolist() == [[0.0]]


def test_explained_variance():
    r, m = t([[1.0, 2.0, 3.0, 99.0]]), t([[1, 1, 1, 0]])
    assert explained_variance(t([[1.0, 2.0, 3.0, 0.0]]), r, m) == pytest.approx(1.0)
    assert explained_variance(t([[2.0, 2.0, 2.0, 0.0]]), r, m) == pytest.approx(0.0)
    # R - V = (0, 0, -1): variance 2/9; Var(R) = 2/3 -> 1 - 1/3
    assert explained_variance(t([[1.0, 2.0, 4.0, 0.0]]), r, m) == pytest.approx(2.0 / 3.0)
    assert explained_variance(t([[1.0, 2.0]]), t([[5.0, 5.0]]), t([[1, 1]])) == 0.0  # constant returns


# Value loss: token 0 keeps the unclipped branch (V moved away from R past the clip: the plain error is larger);
# token 1 takes the clipped branch (V moved towards R past the clip: its gradient is cut); token 2 is masked.
V = [[1.2, 0.1, INF]]
OLD = [[0.9, 0.8, 0.0]]
R = [[0.0, 0.0, NAN]]
M = [[1, 1, 0]]


def test_value_loss_takes_the_larger_of_the_clipped_and_plain_errors():
    """clip 0.2. Token 0: plain (1.2)^2 = 1.44, clipped V = 1.1 -> 1.21: plain wins, d/dV = 0.5 * 2 * 1.2 / 2.
    Token 1: plain 0.01, clipped V = 0.6 -> 0.36: clipped wins, no gradient. Loss 0.5 * (1.44 + 0.36) / 2."""
    v = t(V).requires_grad_(True)
    out = value_loss(v, t(OLD), t(R), t(M), clip=0.2)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.45)
    assert v.grad.tolist()[0] == pytest.approx([0.6, 0.0, 0.0])
    assert out.metrics["value_clip_frac"] == pytest.approx(0.5)
    assert out.metrics["values_mean"] == pytest.approx(0.65) and out.metrics["returns_mean"] == 0.0
    assert out.metrics["tokens"] == 2.0 and out.metrics["value_loss"] == pytest.approx(0.45)


def test_value_loss_without_clipping_is_half_the_mean_squared_error():
    v = t(V).requires_grad_(True)
    out = value_loss(v, t(OLD), t(R), t(M), clip=None)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.5 * (1.44 + 0.01) / 2)
    assert v.grad.tolist()[0] == pytest.approx([0.6, 0.05, 0.0])
    assert out.metrics["value_clip_frac"] == 0.0


def test_value_loss_inside_the_clip_range_equals_the_plain_loss():
    v = t([[0.5, 0.7]]).requires_grad_(True)
    clipped = value_loss(v, t([[0.45, 0.75]]), t([[1.0, 0.0]]), t([[1, 1]]), clip=0.2)
    plain = value_loss(t([[0.5, 0.7]]), t([[0.45, 0.75]]), t([[1.0, 0.0]]), t([[1, 1]]), clip=None)
    assert clipped.loss.item() == pytest.approx(plain.loss.item()) and clipped.metrics["value_clip_frac"] == 0.0


def test_value_loss_of_an_all_masked_batch_is_a_zero_with_a_gradient():
    v = t([[INF, NAN]]).requires_grad_(True)
    out = value_loss(v, t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[0, 0]]))
    out.loss.backward()
    assert out.loss.item() == 0.0 and v.grad.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="clip"):
        value_loss(v, t([[0.0, 0.0]]), t([[1.0, 1.0]]), t([[0, 0]]), clip=0.0)
