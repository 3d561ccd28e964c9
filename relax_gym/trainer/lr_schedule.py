"""Learning-rate schedule of the RL phase: ``actor.lr_schedule`` (constant, linear or cosine decay to
``actor.min_lr_ratio`` of ``actor.lr``).

Progress is the larger of two fractions: steps done out of ``trainer.steps`` and, when the run has a
``trainer.time_budget_s``, seconds spent out of that budget. A time-budgeted run therefore finishes its decay when
the budget ends, on a fast machine or a slow one, instead of stopping half-way down a schedule sized in steps.
"""

from __future__ import annotations

import math
from typing import Literal

LRSchedule = Literal["constant", "linear", "cosine"]

__all__ = ["LRSchedule", "lr_at", "progress"]


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
