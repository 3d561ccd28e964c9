"""The advantage-estimator and policy-loss registries (trainer/algorithms/registry.py): presets name their entries,
an unknown name is refused with the registered ones listed, and a new estimator is one decorated function that a
config can name and the advantages role then uses."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from relax_gym.trainer.algorithms import (
    AlgorithmConfig,
    Advantages,
    StepBatch,
    advantage_estimator,
    estimator,
    group_advantages,
    policy_loss,
    policy_loss_of,
    preset,
)
from relax_gym.trainer.async_engine.roles.advantages import group_fields


@advantage_estimator("test_rank")  # registered once, at import: a test estimator no preset names
def rank_within_group(batch: StepBatch, algo) -> Advantages:
    """+1 for a group's best reward, -1 for the others."""
    best = {}
    for r, g in zip(batch.rewards, batch.group_ids):
        best[g] = max(best.get(g, r), r)
    return Advantages(torch.tensor([1.0 if r == best[g] else -1.0 for r, g in zip(batch.rewards, batch.group_ids)]))


def test_presets_name_registered_estimators_and_losses():
    assert {n: preset(n).advantage_estimator for n in ("grpo", "dapo", "gspo", "ppo")} == {
        "grpo": "group", "dapo": "group", "gspo": "group", "ppo": "gae"}
    assert preset("ppo").needs_critic and not preset("grpo").needs_critic
    assert policy_loss_of(preset("dapo").policy_loss) is policy_loss


def test_the_group_estimator_is_group_advantages():
    rewards, groups = [1.0, 0.0, 0.5, 2.0, 2.0, 1.0], [0, 0, 0, 1, 1, 1]
    algo = preset("grpo", negative_advantage_scale=0.5)
    out = estimator("group").estimate(StepBatch(rewards, groups), algo)
    want = group_advantages(torch.tensor(rewards), torch.tensor(groups), negative_scale=0.5)
    assert torch.equal(out.advantages, want) and out.returns is None


def test_the_gae_estimator_needs_values_and_gives_returns():
    algo = preset("ppo", whiten_advantages=False, lam=1.0)
    out = estimator("gae").estimate(StepBatch([1.0], loss_masks=[[0, 1, 1]], values=[torch.tensor([0.25, 0.5])]), algo)
    assert torch.allclose(out.advantages[0], torch.tensor([0.75, 0.5])) and torch.allclose(out.returns[0], torch.ones(2))
    with pytest.raises(ValueError, match="3 values for 2 next-token positions"):
        estimator("gae").estimate(StepBatch([1.0], loss_masks=[[0, 1, 1]], values=[torch.zeros(3)]), algo)


def test_unknown_names_are_refused_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'nope'; registered: \[.*'gae', 'group'"):
        estimator("nope")
    with pytest.raises(ValidationError, match="unknown advantage_estimator 'nope'"):
        AlgorithmConfig(advantage_estimator="nope")
    with pytest.raises(ValidationError, match="unknown policy_loss 'nope'"):
        AlgorithmConfig(policy_loss="nope")
    with pytest.raises(ValueError, match="registered already"):
        advantage_estimator("group")(rank_within_group)


def test_a_new_estimator_is_one_decorated_function_the_roles_use():
    algo = AlgorithmConfig(advantage_estimator="test_rank")
    fields, counts = group_fields([0, 0, 1, 1, 1], [1.0, 0.0, 3.0, 3.0, 2.0], [True, True, True, False, True], algo)
    assert fields["advantages"] == [1.0, -1.0, 1.0, 0.0, -1.0]  # the masked sample keeps 0
    assert counts["valid_groups"] == 2 and not algo.needs_critic
