"""``AlgorithmConfig``: which policy-optimisation recipe to run and its knobs, with named presets.

The ``name`` selects a preset whose values fill every knob the caller did not set, so a recipe can say just
``algorithm: {name: dapo}`` (or override ``algorithm.name=dapo``) and get DAPO's defaults, and
``preset("dapo", kl_coef=0.01)`` is the same as ``AlgorithmConfig(name="dapo", kl_coef=0.01)``:

=====  ===============  ===========  ====================  ==============  =======  ===============
name   clip low / high  ratio level  aggregation           advantages      kl_coef  dynamic sampling
=====  ===============  ===========  ====================  ==============  =======  ===============
grpo   0.2 / 0.2        token        seq_mean_token_mean   group, std      0        no
dapo   0.2 / 0.28       token        token_mean            group, std      0        yes
gspo   3e-4 / 4e-4      sequence     seq_mean_token_mean   group, std      0        no
ppo    0.2 / 0.2        token        token_mean            gae, whitened   0        no
sft    (unused)         token        token_mean            (unused)        0        no
=====  ===============  ===========  ====================  ==============  =======  ===============

The advantages column is the preset's ``advantage_estimator`` and every preset's ``policy_loss`` is ``clipped``:
names in the registries of :mod:`.registry` (a new estimator or loss is one decorated function there, and a recipe
picks it by name, validated here).

GSPO's clip range is the paper's (Zheng et al. 2025, sec. 5.1): a sequence ratio is a length-normalised
geometric mean, so it stays much closer to 1 than token ratios do. ``tis_cap`` (truncated importance sampling
against the rollout engine's log-probs) is off (None) in every preset; 2.0 is a common choice when enabled.

``ppo`` trains a critic (a value model, the ``critic:`` section of the run's config) and takes per-token
advantages from GAE (:mod:`~relax_gym.trainer.algorithms.gae`) with ``gamma`` 1.0 (an episode is one reward at
its end: no discount), ``lam`` 0.95, the value loss clipped at ``value_clip`` 0.2 around the critic's earlier
values, and the advantages whitened over the step's tokens (``whiten_advantages``). These four knobs are read only
by ``ppo``; the group knobs (``advantage_scale``, ``negative_advantage_scale``, ``dynamic_sampling``) do not apply
to it, and setting the last two to anything but their neutral values with ``ppo`` is an error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.algorithms.advantages import AdvantageScale
from relax_gym.trainer.algorithms.kl import KLKind
from relax_gym.trainer.algorithms.losses import Aggregation, RatioLevel
from relax_gym.trainer.algorithms.registry import estimator, estimator_names, policy_loss_names

AlgorithmName = Literal["grpo", "dapo", "gspo", "ppo", "sft"]

__all__ = ["PRESETS", "AlgorithmConfig", "AlgorithmName", "preset"]

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {"clip_low": 0.2, "clip_high": 0.2, "ratio_level": "token", "aggregation": "seq_mean_token_mean",
             "advantage_scale": "std", "kl_coef": 0.0, "dynamic_sampling": False},
    "dapo": {"clip_low": 0.2, "clip_high": 0.28, "ratio_level": "token", "aggregation": "token_mean",
             "advantage_scale": "std", "kl_coef": 0.0, "dynamic_sampling": True},
    "gspo": {"clip_low": 3e-4, "clip_high": 4e-4, "ratio_level": "sequence", "aggregation": "seq_mean_token_mean",
             "advantage_scale": "std", "kl_coef": 0.0, "dynamic_sampling": False},
    "ppo": {"advantage_estimator": "gae", "clip_low": 0.2, "clip_high": 0.2, "ratio_level": "token", "aggregation": "token_mean", "kl_coef": 0.0,
            "dynamic_sampling": False, "gamma": 1.0, "lam": 0.95, "value_clip": 0.2, "whiten_advantages": True},
    "sft": {"ratio_level": "token", "aggregation": "token_mean", "kl_coef": 0.0, "dynamic_sampling": False},
}


class AlgorithmConfig(BaseModel):
    """Knobs of the policy loss and advantage estimator. Frozen; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: AlgorithmName = "grpo"
    advantage_estimator: str = "group"  # a name in the estimator registry (registry.py); ppo's preset: gae
    policy_loss: str = "clipped"  # a name in the policy-loss registry
    clip_low: float = Field(default=0.2, gt=0, lt=1)  # ratio lower bound 1 - clip_low must stay > 0
    clip_high: float = Field(default=0.2, gt=0)
    ratio_level: RatioLevel = "token"
    aggregation: Aggregation = "token_mean"
    advantage_scale: AdvantageScale = "std"
    negative_advantage_scale: float = Field(default=1.0, ge=0, le=1)  # 0: learn from better-than-average samples only
    kl_coef: float = Field(default=0.0, ge=0)
    kl_kind: KLKind = "k3"
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (DAPO)
    tis_cap: float | None = Field(default=None, gt=1)  # truncated-IS cap; None = no rollout correction
    temperature: float = Field(default=1.0, gt=0)  # the sampler's; token_logprobs must use the same
    routing_replay: bool = False  # MoE policies: force the rollout's routed experts in the training forward (R3)
    # ppo only (GAE and the critic's loss; see the module docstring)
    gamma: float = Field(default=1.0, gt=0, le=1)  # discount per trained token
    lam: float = Field(default=0.95, ge=0, le=1)  # GAE's bias-variance trade-off: 1 Monte-Carlo, 0 one-step TD
    value_clip: float | None = Field(default=0.2, gt=0)  # clip of the value loss around the old values; None: off
    whiten_advantages: bool = True  # normalise the step's token advantages to mean 0, std 1

    @property
    def needs_critic(self) -> bool:
        """The estimator takes a critic's values (ppo's ``gae``): the run trains a value model beside the policy."""
        return estimator(self.advantage_estimator).needs_critic

    @model_validator(mode="after")
    def _known_names(self) -> AlgorithmConfig:
        if self.advantage_estimator not in estimator_names():
            raise ValueError(f"unknown advantage_estimator {self.advantage_estimator!r}; registered: {estimator_names()}")
        if self.policy_loss not in policy_loss_names():
            raise ValueError(f"unknown policy_loss {self.policy_loss!r}; registered: {policy_loss_names()}")
        return self

    @model_validator(mode="after")
    def _ppo_has_no_groups(self) -> AlgorithmConfig:
        if self.needs_critic and self.dynamic_sampling:
            raise ValueError("dynamic_sampling drops groups whose rewards are all equal, which carry no signal only for "
                             "group-relative advantages; algorithm.name=ppo takes its advantages from the critic")
        if self.needs_critic and self.negative_advantage_scale != 1.0:
            raise ValueError(f"negative_advantage_scale={self.negative_advantage_scale} scales group advantages; "
                             "algorithm.name=ppo takes its advantages from the critic (leave it at 1.0)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            name = data.get("name", "grpo")
            if isinstance(name, str) and name in PRESETS:
                return {**PRESETS[name], **data, "name": name}
        return data

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> AlgorithmConfig:
        """The named preset with ``overrides`` applied and validated (unknown names and keys are errors)."""
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls.model_validate({**overrides, "name": name})

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :func:`~relax_gym.trainer.algorithms.losses.policy_loss`."""
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "ratio_level": self.ratio_level,
                "aggregation": self.aggregation, "kl_coef": self.kl_coef, "kl_kind": self.kl_kind,
                "tis_cap": self.tis_cap}


def preset(name: str, **overrides: Any) -> AlgorithmConfig:
    """Module-level alias of :meth:`AlgorithmConfig.preset`."""
    return AlgorithmConfig.preset(name, **overrides)
