"""Learning-rate schedule of the RL phase: ``actor.lr_schedule`` (constant, linear or cosine decay to
``actor.min_lr_ratio`` of ``actor.lr``).

Progress is the larger of two fractions: steps done out of ``trainer.steps`` and, when the run has a
``trainer.time_budget_s``, seconds spent out of that budget. A time-budgeted run therefore finishes its decay when
the budget ends, on a fast machine or a slow one, instead of stopping half-way down a schedule sized in steps.

With ``actor.lr_hold_until_reward`` the decay waits for the policy to leave its plateau: the learning rate holds at
its peak until the mean training reward of the last ``actor.lr_hold_window`` steps exceeds that value, and the
decay then runs over what remains of the run (:class:`DecayGate`). A run whose policy leaves chance late still
climbs at the full rate instead of at a rate the clock has already decayed.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from relax_gym.trainer.actors.settings import LRSchedule

__all__ = ["DecayGate", "LRSchedule", "decayed_fraction", "lr_at", "progress", "step_lr"]


def progress(step: int, steps: int, elapsed_s: float = 0.0, budget_s: float | None = None) -> float:
    """How far the run is, in [0, 1]."""
    by_steps = step / steps if steps > 0 else 1.0
    by_time = elapsed_s / budget_s if budget_s else 0.0
    return min(1.0, max(by_steps, by_time, 0.0))


def lr_at(base_lr: float, schedule: LRSchedule, fraction: float, min_ratio: float = 0.0) -> float:
    """The learning rate at ``fraction`` of the run."""
    if schedule == "constant":
        return base_lr
    f = min(1.0, max(0.0, fraction))
    if schedule == "linear":
        shape = 1.0 - f
    elif schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * f))
    else:
        raise ValueError(f"unknown lr_schedule {schedule!r}; choose constant, linear or cosine")
    return base_lr * (min_ratio + (1.0 - min_ratio) * shape)


def decayed_fraction(fraction: float, decay_from: float | None) -> float:
    """How far down its schedule the learning rate is when the run is at ``fraction`` and the decay started at
    ``decay_from`` (None: it has not started, the rate holds at its peak)."""
    if decay_from is None:
        return 0.0
    if decay_from >= 1.0:
        return 1.0
    return min(1.0, max(0.0, (fraction - decay_from) / (1.0 - decay_from)))


def step_lr(actor: Any, trainer: Any, done: int, elapsed_s: float, decay_from: float | None) -> float:
    """The learning rate of the step after ``done`` steps, ``elapsed_s`` seconds into the run, the decay started at
    ``decay_from`` (:class:`DecayGate`); ``actor`` / ``trainer``: the config's sections. Both modes' one formula
    (the colocate loop and the async actor role)."""
    fraction = decayed_fraction(progress(done, trainer.steps, elapsed_s, trainer.time_budget_s), decay_from)
    return lr_at(actor.lr, actor.lr_schedule, fraction, actor.min_lr_ratio)


class DecayGate:
    """Holds the decay back until the training reward leaves its plateau (see the module docstring).

    ``observe`` takes each step's mean training reward and the run's progress after it; ``decay_from`` is the
    progress at which the decay started (0.0 without a threshold: the plain schedule; None while holding).
    ``state`` / ``from_state`` carry it through a checkpoint."""

    def __init__(self, threshold: float | None, window: int = 50) -> None:
        if window < 1:
            raise ValueError(f"actor.lr_hold_window must be at least 1 (got {window})")
        self.threshold = threshold
        self.window = window
        self.recent: deque[float] = deque(maxlen=window)
        self.decay_from: float | None = 0.0 if threshold is None else None

    def observe(self, reward_mean: float, fraction: float) -> None:
        if self.decay_from is not None:
            return
        self.recent.append(float(reward_mean))
        if len(self.recent) == self.window and sum(self.recent) / self.window > self.threshold:
            self.decay_from = min(1.0, max(0.0, fraction))

    def state(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "window": self.window, "recent": list(self.recent), "decay_from": self.decay_from}

    @classmethod
    def from_state(cls, state: dict[str, Any] | None, threshold: float | None, window: int = 50) -> DecayGate:
        """The gate a checkpoint saved (``state``; None or a checkpoint without one: a fresh gate). A checkpoint
        saved with another threshold or window starts the gate afresh."""
        gate = cls(threshold, window)
        if state and state.get("threshold") == threshold and int(state.get("window", -1)) == window:
            gate.recent.extend(float(r) for r in state.get("recent", []))
            gate.decay_from = state.get("decay_from")
        return gate
