"""When a step is followed by an eval, a checkpoint, or the end of the run — one answer for both training modes.

    schedule = Schedule(cfg.trainer)      # in the trainer's __init__
    schedule.start(already_s)             # when the loop starts (already_s: a resumed run's clock)
    ...
    plan = schedule.after(step)           # once per step, after its metrics row is built
    if plan.eval: ...; write the row; if plan.checkpoint: ...; if plan.stop: break

Eval: every ``eval_every`` steps, at the last step, and before a time-budget stop. Checkpoint: every
``checkpoint_every`` steps, at the last step, and at a time-budget stop (so a stopped run can always be resumed
where it stopped). Stop: once the run's clock has passed ``trainer.time_budget_s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Schedule", "StepPlan"]


@dataclass(frozen=True)
class StepPlan:
    eval: bool
    checkpoint: bool
    stop: bool


class Schedule:
    """``trainer``: the config's trainer section (``steps``, ``eval_every``, ``checkpoint_every``,
    ``time_budget_s``). Also the run's clock (the time-budget and learning-rate clock)."""

    def __init__(self, trainer: Any, clock=time.perf_counter) -> None:
        self.trainer = trainer
        self.clock = clock
        self.start_time = clock()

    def start(self, already_s: float = 0.0) -> float:
        """Start the run's clock now, ``already_s`` seconds in (the time a resumed run had spent); its start time."""
        self.start_time = self.clock() - float(already_s)
        return self.start_time

    def elapsed(self) -> float:
        return self.clock() - self.start_time

    def over_budget(self) -> bool:
        budget = self.trainer.time_budget_s
        return budget is not None and self.elapsed() > budget

    def after(self, step: int) -> StepPlan:
        """What follows step ``step`` (counted from 1)."""
        t = self.trainer
        stop = self.over_budget() and step < t.steps
        last = step == t.steps
        return StepPlan(eval=step % t.eval_every == 0 or last or stop,
                        checkpoint=step % t.checkpoint_every == 0 or last or stop, stop=stop)
