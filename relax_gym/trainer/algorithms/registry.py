"""Registries of advantage estimators and policy losses: a new one is one decorated function.

    @advantage_estimator("my_estimator")
    def my_estimator(batch: StepBatch, algo) -> Advantages: ...

    @policy_loss_function("my_loss")
    def my_loss(logprobs, old_logprobs, advantages, mask, **knobs) -> LossOutput: ...

An algorithm preset (:mod:`.config`, validated data) names its estimator (``advantage_estimator``) and its loss
(``policy_loss``); both trainer modes look them up here (:func:`estimator`, :func:`policy_loss_of`) instead of
testing the algorithm's name. Built in: ``group`` (GRPO / Dr.GRPO group-relative, :mod:`.advantages`), ``gae``
(PPO: GAE from the critic's values, :mod:`.gae`; ``needs_critic``) and the ``clipped`` surrogate (:mod:`.losses`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["Advantages", "Estimator", "StepBatch", "advantage_estimator", "estimator", "estimator_names",
           "policy_loss_function", "policy_loss_names", "policy_loss_of"]

# the modules whose functions register the built-in entries (imported on the first look-up: no import cycle)
_BUILT_IN = ("relax_gym.trainer.algorithms.advantages", "relax_gym.trainer.algorithms.gae", "relax_gym.trainer.algorithms.losses")


@dataclass(frozen=True)
class StepBatch:
    """One step's trained samples as an estimator sees them: rewards and group ids; for estimators that need a
    critic, each sample's loss mask (over its tokens) and the critic's values (one per next-token position)."""

    rewards: Sequence[float]
    group_ids: Sequence[int] = ()
    loss_masks: Sequence[Any] | None = None
    values: Sequence[Tensor] | None = None


@dataclass(frozen=True)
class Advantages:
    """An estimator's answer: one advantage per sample (a ``[N]`` tensor) or one row per sample (per token), and
    for a critic the returns it regresses towards."""

    advantages: Tensor | list[Tensor]
    returns: list[Tensor] | None = None


@dataclass(frozen=True)
class Estimator:
    name: str
    estimate: Callable[[StepBatch, Any], Advantages]
    needs_critic: bool  # the step needs a value model (its values in, its returns out)


_ESTIMATORS: dict[str, Estimator] = {}
_LOSSES: dict[str, Callable[..., Any]] = {}


def advantage_estimator(name: str, *, needs_critic: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn(batch: StepBatch, algo) -> Advantages`` as the estimator ``name``."""

    def register(fn: Callable[[StepBatch, Any], Advantages]) -> Callable[[StepBatch, Any], Advantages]:
        if name in _ESTIMATORS:
            raise ValueError(f"an advantage estimator named {name!r} is registered already")
        _ESTIMATORS[name] = Estimator(name, fn, needs_critic)
        return fn

    return register


def policy_loss_function(name: str) -> Callable[[Callable], Callable]:
    """Register ``fn(logprobs, old_logprobs, advantages, mask, **knobs) -> LossOutput`` as the policy loss ``name``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _LOSSES:
            raise ValueError(f"a policy loss named {name!r} is registered already")
        _LOSSES[name] = fn
        return fn

    return register


def _built_in() -> None:
    for module in _BUILT_IN:
        importlib.import_module(module)


def estimator_names() -> list[str]:
    _built_in()
    return sorted(_ESTIMATORS)


def policy_loss_names() -> list[str]:
    _built_in()
    return sorted(_LOSSES)


def estimator(name: str) -> Estimator:
    """The registered estimator ``name``; an unknown name is an error that lists the known ones."""
    _built_in()
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; registered: {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name]


def policy_loss_of(name: str) -> Callable[..., Any]:
    """The registered policy loss ``name``; an unknown name is an error that lists the known ones."""
    _built_in()
    if name not in _LOSSES:
        raise ValueError(f"unknown policy loss {name!r}; registered: {sorted(_LOSSES)}")
    return _LOSSES[name]
