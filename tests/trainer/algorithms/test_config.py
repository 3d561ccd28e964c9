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


def test_unknown_preset():
    with pytest.raises(ValueError, match="ppo"):
        preset("ppo")
    with pytest.raises(ValidationError) as exc:
        AlgorithmConfig(name="ppo")
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
