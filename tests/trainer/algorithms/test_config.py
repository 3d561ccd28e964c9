"""AlgorithmConfig presets, overrides and validation errors that name the field."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from relax_gym.trainer.algorithms import AlgorithmConfig, policy_loss, preset


def test_grpo_preset():
    c = preset("grpo")
    assert (c.clip_low, c.clip_high, c.ratio_level, c.aggregation) == (0.2, 0.2, "token", "seq_mean_token_mean")
    assert (c.advantage_scale, c.kl_coef, c.dynamic_sampling, c.tis_cap) == ("std", 0.0, False, None)


def test_dapo_preset():
    c = preset("dapo")
    assert (c.clip_low, c.clip_high, c.aggregation, c.dynamic_sampling, c.kl_coef) == (0.2, 0.28, "token_mean", True, 0.0)
    assert c.clip_high > c.clip_low


def test_gspo_preset():
    c = preset("gspo")
    assert (c.ratio_level, c.clip_low, c.clip_high, c.aggregation) == ("sequence", 3e-4, 4e-4, "seq_mean_token_mean")


def test_sft_preset():
    c = preset("sft")
    assert (c.name, c.aggregation, c.kl_coef, c.dynamic_sampling) == ("sft", "token_mean", 0.0, False)


def test_name_alone_selects_the_preset_and_overrides_win():
    assert AlgorithmConfig(name="dapo") == preset("dapo")
    assert AlgorithmConfig.model_validate({"name": "gspo"}) == preset("gspo")
    assert AlgorithmConfig() == preset("grpo")
    c = preset("dapo", clip_high=0.3, kl_coef=0.01, tis_cap=2.0)
    assert (c.clip_high, c.kl_coef, c.tis_cap, c.clip_low, c.dynamic_sampling) == (0.3, 0.01, 2.0, 0.2, True)
    assert AlgorithmConfig.model_validate(c.model_dump()) == c


def test_ppo_preset():
    c = preset("ppo")
    assert (c.clip_low, c.clip_high, c.ratio_level, c.aggregation) == (0.2, 0.2, "token", "token_mean")
    assert (c.gamma, c.lam, c.value_clip, c.whiten_advantages) == (1.0, 0.95, 0.2, True)
    assert (c.kl_coef, c.dynamic_sampling, c.negative_advantage_scale) == (0.0, False, 1.0)
    assert AlgorithmConfig(name="ppo") == c
    c = preset("ppo", gamma=0.99, lam=1.0, value_clip=None, whiten_advantages=False)
    assert (c.gamma, c.lam, c.value_clip, c.whiten_advantages) == (0.99, 1.0, None, False)


def test_the_grpo_presets_are_unchanged_by_the_ppo_knobs():
    for name in ("grpo", "dapo", "gspo"):
        c = preset(name)
        assert c.advantage_scale == "std" and c.negative_advantage_scale == 1.0
    assert preset("dapo").dynamic_sampling and preset("grpo").aggregation == "seq_mean_token_mean"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"dynamic_sampling": True}, "dynamic_sampling"),
    ({"negative_advantage_scale": 0.0}, "negative_advantage_scale=0.0"),
])
def test_ppo_refuses_the_group_knobs(overrides, message):
    with pytest.raises(ValidationError, match=message):
        preset("ppo", **overrides)


@pytest.mark.parametrize(("field", "value"), [("gamma", 0.0), ("gamma", 1.01), ("lam", -0.1), ("lam", 1.5),
                                              ("value_clip", 0.0), ("value_clip", -1.0)])
def test_ppo_knobs_are_validated(field, value):
    with pytest.raises(ValidationError) as exc:
        preset("ppo", **{field: value})
    assert [e["loc"] for e in exc.value.errors()] == [(field,)]


def test_unknown_preset():
    with pytest.raises(ValueError, match="reinforce"):
        preset("reinforce")
    with pytest.raises(ValidationError) as exc:
        AlgorithmConfig(name="reinforce")
    assert exc.value.errors()[0]["loc"] == ("name",)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("clip_low", 0.0), ("clip_low", -0.1), ("clip_low", 1.0), ("clip_high", 0.0), ("kl_coef", -0.01),
        ("tis_cap", 1.0), ("tis_cap", 0.5), ("temperature", 0.0), ("ratio_level", "group"),
        ("aggregation", "sum"), ("advantage_scale", "max"), ("kl_kind", "k4"), ("clip", 0.2),
    ],
)
def test_validation_errors_name_the_field(field, value):
    with pytest.raises(ValidationError) as exc:
        preset("grpo", **{field: value})
    assert [e["loc"] for e in exc.value.errors()] == [(field,)]


def test_frozen():
    with pytest.raises(ValidationError):
        preset("grpo").kl_coef = 1.0  # type: ignore[misc]


def test_loss_kwargs_drive_policy_loss():
    c = preset("gspo", kl_coef=0.05, tis_cap=2.0)
    lp = torch.tensor([[-1.0, -2.0]])
    out = policy_loss(lp, lp, torch.tensor([1.0]), torch.ones(1, 2), ref_logprobs=lp, **c.loss_kwargs())
    assert out.loss.item() == pytest.approx(-1.0)
    assert set(c.loss_kwargs()) == {"clip_low", "clip_high", "ratio_level", "aggregation", "kl_coef", "kl_kind", "tis_cap"}
