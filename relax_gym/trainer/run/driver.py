"""What both training modes do around their steps, written once.

    driver = RunDriver(cfg, run_dir, mode=self, progress=progress, clock=clock)
    driver.restore_lr_gate(state)              # a resumed run's gate, as its checkpoint saved it
    driver.start(already_s)                    # the run's clock (a resumed run's seconds already spent)
    ... the mode's warm-up, reference, critic ...
    await driver.open(resumed)                 # the step-0 eval, or a resumed run's eval history
    for step in ...:
        lr = driver.learning_rate(step)        # the mode sets it on its actor (or sends it along)
        row, episodes = <the mode rolls out, trains, pushes and builds its row>
        if await driver.after_step(step, row, episodes):
            break                              # the time budget is spent
    return driver.finish(steps, extra)         # summary.json

:meth:`RunDriver.after_step` is the tail every step shares: the tool-crash warning, the learning-rate gate, the
schedule (:mod:`.schedule`), the eval, the metrics row, the progress event, the checkpoint (a failed write is
recorded and the run goes on) and the stop. A mode supplies only what differs (:class:`StepMode`): how it
evaluates and how it writes a checkpoint; how it rolls out, trains and pushes stays in its own loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.run.checkpoint import CheckpointFailures, eval_history
from relax_gym.trainer.run.lr_schedule import DecayGate, progress, step_lr
from relax_gym.trainer.run.metrics import MetricsWriter
from relax_gym.trainer.run.schedule import Schedule
from relax_gym.trainer.run.step_row import RewardComponents, summary_end, summary_start, warn_on_tool_crashes
from relax_gym.trainer.run.warmup import report_warmup_row

__all__ = ["RunDriver", "StepMode"]


class StepMode(Protocol):
    """What a training mode supplies to the driver."""

    version: int  # the policy version the engines serve

    async def evaluate(self, step: int) -> dict[str, float]:
        """The eval row after ``step`` (0: before the first step)."""

    async def save_checkpoint(self, step: int) -> str | None:
        """Write the checkpoint of ``step``; the error when the write failed (the previous one stays the resume
        point), None when it was written."""


class RunDriver:
    """The run's metrics file, schedule, reward components, learning-rate gate and checkpoint failures, and the
    step tail over them (see the module docstring). ``clock``: the run's clock (the planner hands in its virtual
    one); ``purge_step`` rewinds TensorBoard for a resumed run."""

    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, mode: StepMode, progress: Callable[[str, dict], Any],
                 clock: Callable[[], float] = time.perf_counter, purge_step: int | None = None) -> None:
        self.cfg, self.run_dir, self.mode, self.progress = cfg, Path(run_dir), mode, progress
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.metrics.tensorboard, purge_step=purge_step)
        self.schedule = Schedule(cfg.trainer, clock=clock)  # eval / checkpoint / stop after each step, and the run's clock
        self.components = RewardComponents()  # the reward components seen in the run: every row keeps them
        self.checkpoint_failures = CheckpointFailures()
        self.lr_gate = self._gate(None)  # when the lr decay starts
        self.first_eval: dict[str, float] = {}
        self.last_eval: dict[str, float] = {}
        self.summary: dict[str, Any] = {}

    def _gate(self, state: dict[str, Any] | None) -> DecayGate:
        a = self.cfg.actor
        return DecayGate.from_state(state, a.lr_hold_until_reward, a.lr_hold_window)

    def restore_lr_gate(self, state: dict[str, Any] | None) -> None:
        """The learning-rate gate as a checkpoint saved it (None: a fresh one)."""
        self.lr_gate = self._gate(state)

    def reopen_metrics(self, purge_step: int) -> None:
        """After a global restart: the metrics file (closed and rewound to the checkpoint by the caller) again."""
        self.metrics = MetricsWriter(self.run_dir, tensorboard=self.cfg.metrics.tensorboard, purge_step=purge_step)

    # -- before the steps ----------------------------------------------------------------------------------------

    def start(self, already_s: float = 0.0) -> float:
        """Start the run's clock, ``already_s`` seconds in; its start time."""
        return self.schedule.start(already_s)

    def warmup_row(self, i: int, row: dict[str, float]) -> None:
        report_warmup_row(self.metrics, self.progress, self.cfg.trainer, i, row)

    async def open(self, resumed: bool) -> None:
        """The eval before the first step (metrics step 0), or a resumed run's first and last evals."""
        if resumed:
            self.last_eval, self.first_eval = eval_history(self.run_dir)
        else:
            self.last_eval = self.first_eval = await self.mode.evaluate(0)
            self.metrics.write(0, {**self.last_eval, "policy_version": self.mode.version})
            self.progress("eval", {"step": 0, **self.last_eval})
        self.summary = summary_start(self.first_eval)

    # -- each step -----------------------------------------------------------------------------------------------

    def learning_rate(self, step: int) -> float:
        """The learning rate of step ``step`` (from 1): the schedule at the run's progress before it."""
        return step_lr(self.cfg.actor, self.cfg.trainer, step - 1, self.schedule.elapsed(), self.lr_gate.decay_from)

    async def after_step(self, step: int, row: dict[str, Any], episodes: int) -> bool:
        """The tail of step ``step`` (its ``row`` built from ``episodes`` episodes); True when the run stops."""
        t = self.cfg.trainer
        warn_on_tool_crashes(row, episodes, step)
        self.lr_gate.observe(row["reward_mean"], progress(step, t.steps, self.schedule.elapsed(), t.time_budget_s))
        plan = self.schedule.after(step)
        if plan.eval:
            self.last_eval = await self.mode.evaluate(step)
            row.update(self.last_eval)
        self.metrics.write(step, row)
        self.progress("step", {"step": step, "of": t.steps, **row, "eval_reward": self.last_eval["eval_reward"]})
        if plan.checkpoint:
            error = await self.mode.save_checkpoint(step)
            if error:  # disk full: the previous checkpoint stays the resume point
                self.checkpoint_failures.record(step, error)
                self.progress("checkpoint_failed", {"step": step, "error": error})
        return plan.stop

    def trainer_extra(self) -> dict[str, Any]:
        """What the driver adds to a checkpoint's trainer state (the learning-rate gate)."""
        return {"lr_gate": self.lr_gate.state()}

    # -- the end -------------------------------------------------------------------------------------------------

    def finish(self, steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The run's summary (``summary.json``): start and end evals, steps, the clock, ``extra`` (the mode's own
        figures) and the checkpoint failures."""
        self.summary.update({"env": self.cfg.env.id, **summary_end(self.last_eval, self.first_eval), "steps": steps,
                             "elapsed_s": self.schedule.elapsed(), **(extra or {}), **self.checkpoint_failures.figures()})
        (self.run_dir / "summary.json").write_text(json.dumps(self.summary, indent=2))
        return self.summary
