"""What ``relax-gym train`` shows while it runs: in a terminal, rich progress bars (base build, SFT warm-up, RL steps)
with the latest figures on a line of their own under the bars (so a narrow terminal wraps the figures, not the bars
and their labels); in a log that is not a terminal (``| tee run.log``, a job scheduler's file), one plain line every
``every`` RL steps and at the last one. Each evaluation prints one line that stays, as it happens, in both.

The ETA counts whichever ends the run first: the remaining steps at the recent seconds per step, or the time budget
(``trainer.time_budget_s``) left. When the budget ends the run first, the step count shown is the step it will stop
at, estimated from the recent seconds per step and marked ``~`` (e.g. ``250/~503``), and "next eval" says the
budget's end when that comes before the next scheduled eval. Third-party progress bars (Hugging Face's "Writing
model shards" at each checkpoint) are switched off for the run: they would interleave with ours and fill logs.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any, Self

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text

__all__ = ["TrainProgress", "eval_line", "format_eta", "quiet_third_party_bars"]

SKIPPED_EVAL_KEYS = ("eval_failed", "eval_tool_calls", "eval_policy_version")


def quiet_third_party_bars() -> None:
    """Switch off the tqdm bars transformers and huggingface_hub draw when saving or loading checkpoints."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:
        pass


def format_eta(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds) or seconds < 0:
        return "?"
    seconds = round(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


class _BarsAndFigures(Progress):
    """Progress bars, then the RL figures as wrapped text below them (a long figures line never squeezes a bar)."""

    figures: str = ""

    def get_renderables(self):
        yield self.make_tasks_table(self.tasks)
        if self.figures:
            yield Text(self.figures)


def eval_line(data: dict[str, Any]) -> str:
    """``eval at step N: reward 0.412 accuracy 0.400 format 1.000`` (the reward and its components)."""
    parts = [f"{k[len('eval_'):]} {v:.3f}" for k, v in data.items()
             if k.startswith("eval_") and k not in SKIPPED_EVAL_KEYS and isinstance(v, (int, float))]
    return f"eval at step {data['step']}: " + " ".join(parts)


class TrainProgress:
    """Receives the trainer's progress events (``on_event``) and shows them on ``console``.

    ``steps``: the RL step budget; ``budget_s``: the time budget (None: none); ``eval_every``: for "next eval";
    ``every``: one line per this many steps when the console is not a terminal (0: the default, about 20 lines
    per run, at least every step for short runs and at most every 50)."""

    def __init__(self, console: Console, *, steps: int, sft_steps: int, budget_s: float | None, eval_every: int,
                 every: int = 0, base_name: str | None = None) -> None:
        self.console = console
        self.steps, self.sft_steps, self.budget_s, self.eval_every = steps, sft_steps, budget_s, eval_every
        self.every = every or max(1, min(50, steps // 20))
        self.live = console.is_terminal
        self.started = time.monotonic()
        self.recent: deque[float] = deque(maxlen=10)  # seconds per step of the last steps
        self.progress: Progress | None = None
        self._handler: logging.Handler | None = None
        self._replaced: list[logging.Handler] = []
        self.base_name = base_name
        self.evals_shown: set[int] = set()  # steps whose eval line is printed

    # -- lifetime -----------------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        quiet_third_party_bars()
        if self.live:
            self.progress = _BarsAndFigures(
                TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)), BarColumn(bar_width=None),
                TextColumn("{task.fields[count]}", table_column=Column(no_wrap=True)), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}", table_column=Column(no_wrap=True)), console=self.console, expand=True)
            self.progress.__enter__()
            self.base = self.progress.add_task(f"base {self.base_name}", total=None, info="", count="", visible=False)
            self.sft = self.progress.add_task("sft warm-up", total=self.sft_steps, info="", count=f"0/{self.sft_steps}",
                                              visible=self.sft_steps > 0)
            self.rl = self.progress.add_task("rl", total=self.steps, info="", count=f"0/{self.steps}", start=False)
            self._route_logging_above_the_bars()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)
        self._restore_logging()

    def _route_logging_above_the_bars(self) -> None:
        """Log records go through rich on the same console, so they print above the bars instead of through them."""
        root = logging.getLogger()
        self._replaced = [h for h in root.handlers if isinstance(h, logging.StreamHandler)
                          and getattr(h, "stream", None) in (None, *_std_streams())]
        for h in self._replaced:
            root.removeHandler(h)
        self._handler = RichHandler(console=self.console, show_path=False, show_time=False, markup=False)
        self._handler.setLevel(logging.WARNING)
        root.addHandler(self._handler)

    def _restore_logging(self) -> None:
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
            self._handler = None
        for h in self._replaced:
            root.addHandler(h)
        self._replaced = []

    # -- events -------------------------------------------------------------------------------------------

    def eta_s(self, step: int, elapsed_s: float | None = None) -> float | None:
        """Seconds until the run ends: the steps left at the recent pace, or the time budget left if sooner."""
        left = []
        if self.recent:
            left.append((self.steps - step) * (sum(self.recent) / len(self.recent)))
        if self.budget_s is not None:
            left.append(self.budget_s - (elapsed_s if elapsed_s is not None else time.monotonic() - self.started))
        return max(0.0, min(left)) if left else None

    def steps_in_budget(self, step: int, elapsed_s: float | None = None) -> int | None:
        """The step the time budget will stop the run at, estimated from the recent seconds per step; None when
        there is no budget, no pace yet, or the step budget ends the run first."""
        if self.budget_s is None or not self.recent:
            return None
        elapsed = elapsed_s if elapsed_s is not None else time.monotonic() - self.started
        pace = sum(self.recent) / len(self.recent)
        last = step + math.ceil(max(0.0, self.budget_s - elapsed) / pace) if pace > 0 else self.steps
        return last if last < self.steps else None

    def next_eval(self, step: int) -> int | None:
        if self.eval_every <= 0 or step >= self.steps:
            return None
        return min(self.steps, (step // self.eval_every + 1) * self.eval_every)

    def count(self, step: int, elapsed_s: float | None = None) -> str:
        """``250/1500``, or ``250/~503`` when the time budget is estimated to stop the run at step ~503."""
        last = self.steps_in_budget(step, elapsed_s)
        return f"{step}/{self.steps}" if last is None else f"{step}/~{last}"

    def status(self, data: dict[str, Any]) -> str:
        step = int(data["step"])
        figures = [f"reward {data['reward_mean']:.3f}"] if "reward_mean" in data else []
        if isinstance(data.get("accuracy_mean"), (int, float)):
            figures.append(f"accuracy {data['accuracy_mean']:.3f}")
        if isinstance(data.get("eval_reward"), (int, float)):
            figures.append(f"eval {data['eval_reward']:.3f}")
        if "time_step_s" in data:
            figures.append(f"{data['time_step_s']:.1f} s/step")
        figures.append(f"ETA {format_eta(self.eta_s(step, data.get('elapsed_s')))}")
        last = self.steps_in_budget(step, data.get("elapsed_s"))
        if last is not None:
            figures.append(f"time budget ends the run at step ~{last} (estimate)")
        nxt = self.next_eval(step)
        if nxt is not None and last is not None and nxt > last:
            figures.append("next eval at the budget's end")
        elif nxt is not None:
            figures.append(f"next eval at step {nxt}")
        return " ".join(figures)

    def on_event(self, event: str, data: dict[str, Any]) -> None:
        if event == "step":
            self._step(data)
        elif event == "eval":
            self._eval(data)
        elif event == "checkpoint_failed":  # the previous checkpoint stays the resume point; the run goes on
            self.console.print(f"[red]checkpoint of step {data['step']} failed[/] (training goes on): "
                               + escape(str(data["error"])))
        elif event == "sft":
            if self.progress is not None:
                self.progress.update(self.sft, completed=data["step"], count=f"{data['step']}/{self.sft_steps}",
                                     info=f"nll {data['sft_nll']:.3f}")
            elif data["step"] in (1, self.sft_steps) or data["step"] % max(1, self.sft_steps // 5) == 0:
                self.console.print(f"sft warm-up {data['step']}/{self.sft_steps}: nll {data['sft_nll']:.3f}")
        elif event == "base_step":  # model.base is being built (once; then it comes from the cache)
            if self.progress is not None:
                self.progress.update(self.base, visible=True, total=data["of"], completed=data["step"],
                                     count=f"{data['step']}/{data['of']}", info=f"nll {data['sft_nll']:.3f}")
            elif data["step"] % max(1, data["of"] // 10) == 0 or data["step"] == data["of"]:
                self.console.print(f"base {self.base_name} build {data['step']}/{data['of']}: nll {data['sft_nll']:.3f}")

    def _eval(self, data: dict[str, Any]) -> None:
        """One line per evaluation, printed once (above the bars in a terminal, so it stays on screen)."""
        step = int(data["step"])
        if step in self.evals_shown:
            return
        self.evals_shown.add(step)
        self.console.print(escape(eval_line(data)))

    def _step(self, data: dict[str, Any]) -> None:
        step = int(data["step"])
        if isinstance(data.get("time_step_s"), (int, float)):
            self.recent.append(float(data["time_step_s"]))
        if "eval_failed" in data:  # an eval ran after this step: its figures came with the step's row
            self._eval(data)
        if self.progress is not None:
            self.progress.start_task(self.rl)
            self.progress.figures = self.status(data)
            last = self.steps_in_budget(step, data.get("elapsed_s"))
            self.progress.update(self.rl, completed=step, total=last or self.steps, count=self.count(step, data.get("elapsed_s")))
        elif step % self.every == 0 or step in (1, self.steps):
            self.console.print(escape(f"step {self.count(step, data.get('elapsed_s'))}: {self.status(data)}"))


def _std_streams() -> tuple[Any, ...]:
    import sys

    return (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
