"""Group advantages, identical-reward groups and the zero-advantage share, against hand-computed numbers."""

from __future__ import annotations

import math
import random

import pytest
import torch

from relax_gym.trainer.algorithms import group_advantages, identical_reward_groups, zero_advantage_share

# Four groups, interleaved, non-contiguous ids, sizes 3 / 2 / 1 / 4:
#   id 7: [1.0, 0.0, 0.5]  mean 0.5, deviations [0.5, -0.5, 0], population var 1/6
#   id 2: [3.0, 1.0]       mean 2.0, deviations [1, -1], population var 1 (unbiased would be 2)
#   id 5: [4.0]            single sample -> 0
#   id 9: [0.1] * 4        all equal -> exactly 0
IDS = torch.tensor([7, 2, 5, 7, 9, 2, 9, 7, 9, 9])
REWARDS = torch.tensor([1.0, 3.0, 4.0, 0.0, 0.1, 1.0, 0.1, 0.5, 0.1, 0.1], dtype=torch.float64)


def test_std_scaled_by_hand():
    adv = group_advantages(REWARDS, IDS, eps=0.0)
    s = math.sqrt(1.5)  # 0.5 / sqrt(1/6)
    expected = [s, 1.0, 0.0, -s, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    assert adv.tolist() == pytest.approx(expected, abs=1e-12)


def test_eps_is_added_to_the_std():
    adv = group_advantages(REWARDS, IDS, eps=0.1)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 6) + 0.1))
    assert adv[1].item() == pytest.approx(1.0 / 1.1)


def test_std_is_population_not_unbiased():
    adv = group_advantages(torch.tensor([3.0, 1.0]), torch.tensor([0, 0]), eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0])  # unbiased std sqrt(2) would give +-0.7071


def test_scale_none_only_centres():
    adv = group_advantages(REWARDS, IDS, scale="none")
    assert adv.tolist() == pytest.approx([0.5, 1.0, 0.0, -0.5, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0], abs=1e-12)


@pytest.mark.parametrize("scale", ["std", "none"])
def test_single_sample_and_identical_groups_are_exactly_zero(scale):
    adv = group_advantages(REWARDS.float(), IDS, scale=scale)
    for i in (2, 4, 6, 8, 9):
        assert adv[i].item() == 0.0  # exact, despite 0.1 not being representable


def test_matches_a_plain_python_loop_on_random_groups():
    rng = random.Random(0)
    ids = [rng.randrange(6) * 11 for _ in range(40)]
    rewards = [rng.choice([0.0, 0.5, 1.0]) + rng.random() * (i % 2) for i in range(40)]
    adv = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids), eps=1e-6)
    for i, (r, g) in enumerate(zip(rewards, ids)):
        members = [rr for rr, gg in zip(rewards, ids) if gg == g]
        mean = sum(members) / len(members)
        std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))
        expected = 0.0 if max(members) == min(members) else (r - mean) / (std + 1e-6)
        assert adv[i].item() == pytest.approx(expected, abs=1e-9)


def test_dtype_follows_rewards_and_ints_become_float():
    assert group_advantages(REWARDS.float(), IDS).dtype == torch.float32
    assert group_advantages(REWARDS, IDS).dtype == torch.float64
    adv = group_advantages(torch.tensor([1, 0, 1, 1]), torch.tensor([0, 0, 1, 1]), scale="none")
    assert adv.dtype == torch.get_default_dtype()
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_empty_batch():
    assert group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long)).shape == (0,)
    assert zero_advantage_share(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="equal length"):
        group_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="integer"):
        group_advantages(torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale="max")  # type: ignore[arg-type]


def test_identical_reward_groups_mask():
    mask = identical_reward_groups(REWARDS, IDS)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [False, False, True, False, True, False, True, False, True, True]


def test_zero_advantage_share_counts_groups_not_samples():
    assert zero_advantage_share(REWARDS, IDS) == 0.5  # ids 5 and 9 of {7, 2, 5, 9}
    assert zero_advantage_share(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1])) == 1.0
    assert zero_advantage_share(torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 1, 1, 1])) == 0.5


def test_negative_scale_shrinks_only_negative_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    full = group_advantages(rewards, groups)
    half = group_advantages(rewards, groups, negative_scale=0.5)
    zero = group_advantages(rewards, groups, negative_scale=0.0)
    # group 0: mean 0.25, population std sqrt(3)/4 -> +sqrt(3) for the winner, -1/sqrt(3) for the others
    assert full[0].item() == pytest.approx(3 ** 0.5, rel=1e-5) and full[1].item() == pytest.approx(-(3 ** -0.5), rel=1e-5)
    assert half[0] == full[0] and torch.allclose(half[1:4], full[1:4] / 2)
    assert zero[0] == full[0] and zero[1:4].eq(0).all() and zero[4:].eq(0).all()
    with pytest.raises(ValueError, match="negative_scale"):
        group_advantages(rewards, groups, negative_scale=1.5)
