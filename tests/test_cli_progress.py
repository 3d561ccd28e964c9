"""``relax-gym train``'s progress display (relax_gym/cli_progress.py): plain lines in a log that is not a terminal
(every N steps, with the figures, the ETA and the next eval; one line per eval), bars in a terminal with their
labels and a real bar at 80/100/120 columns, the figures wrapped below them, log records printed above them; the
step the time budget stops the run at, as an estimate; and no Hugging Face progress bars."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from relax_gym.cli_progress import TrainProgress, eval_line, format_eta


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=300), out


def _row(step: int, **extra) -> dict:
    return {"step": step, "reward_mean": 0.25, "accuracy_mean": 0.5, "eval_reward": 0.3, "time_step_s": 2.0,
            "elapsed_s": 2.0 * step, **extra}


def test_a_log_gets_one_line_every_n_steps_with_eta_and_next_eval():
    console, out = _log_console()
    with TrainProgress(console, steps=100, sft_steps=0, budget_s=None, eval_every=25) as shown:
        for step in range(1, 101):
            shown.on_event("step", _row(step))
            if step == 25:
                shown.on_event("eval", {"step": 25, "eval_reward": 0.41, "eval_accuracy": 0.4, "eval_failed": 0})
    lines = out.getvalue().splitlines()
    step_lines = [line for line in lines if line.startswith("step ")]
    assert [line.split(":")[0] for line in step_lines] == [f"step {s}/100" for s in (1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55,
                                                                                  60, 65, 70, 75, 80, 85, 90, 95, 100)]
    assert step_lines[1] == "step 5/100: reward 0.250 accuracy 0.500 eval 0.300 2.0 s/step ETA 3m10s next eval at step 25"
    assert "eval at step 25: reward 0.410 accuracy 0.400" in lines  # as it happens, between the step lines
    assert "\x1b" not in out.getvalue() and "━" not in out.getvalue()  # no colour codes, no bars


def test_the_eta_is_the_time_budget_when_that_ends_the_run_first():
    console, _ = _log_console()
    shown = TrainProgress(console, steps=1500, sft_steps=0, budget_s=600.0, eval_every=50)
    shown.on_event("step", _row(10, elapsed_s=100.0))  # 1490 steps x 2 s = 50 min, but 500 s of budget left
    assert shown.eta_s(10, 100.0) == 500.0 and format_eta(500.0) == "8m20s"
    assert format_eta(3 * 3600 + 65) == "3h01m" and format_eta(None) == "?"


def test_sft_and_base_progress_are_a_few_lines_in_a_log():
    console, out = _log_console()
    with TrainProgress(console, steps=10, sft_steps=40, budget_s=None, eval_every=5, base_name="tiny-omni") as shown:
        for step in range(1, 41):
            shown.on_event("sft", {"step": step, "sft_nll": 1.0 / step})
        for step in range(1, 101):
            shown.on_event("base_step", {"step": step, "of": 100, "sft_nll": 2.0})
    lines = out.getvalue().splitlines()
    assert len([line for line in lines if line.startswith("sft warm-up")]) == 6  # 1, 8, 16, 24, 32, 40
    assert len([line for line in lines if line.startswith("base tiny-omni build")]) == 10


def test_in_a_terminal_log_records_print_above_the_bars_and_handlers_come_back():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    root = logging.getLogger()
    before = list(root.handlers)
    with TrainProgress(console, steps=3, sft_steps=0, budget_s=None, eval_every=0) as shown:
        logging.getLogger("relax_gym.test").warning("a warning during the run")
        shown.on_event("step", _row(1))
    assert "a warning during the run" in out.getvalue()
    assert root.handlers == before


def test_hugging_face_bars_are_off_during_a_run():
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    console, _ = _log_console()
    with TrainProgress(console, steps=1, sft_steps=0, budget_s=None, eval_every=0):
        assert not hf_logging.is_progress_bar_enabled()


def test_eval_line_keeps_the_reward_and_its_components_only():
    assert eval_line({"step": 0, "eval_reward": 0.5, "eval_format": 1.0, "eval_policy_version": 3,
                      "eval_failed": 0, "eval_note": "x"}) == "eval at step 0: reward 0.500 format 1.000"


def test_a_failed_checkpoint_is_one_line_and_the_run_goes_on():
    console, out = _log_console()
    with TrainProgress(console, steps=4, sft_steps=0, budget_s=None, eval_every=0) as shown:
        shown.on_event("checkpoint_failed", {"step": 2, "error": "the checkpoint of step 2 could not be written [disk full]"})
        shown.on_event("step", _row(3))
    assert "checkpoint of step 2 failed (training goes on): the checkpoint of step 2 could not be written [disk full]" \
        in out.getvalue()


def _screen(width: int, *, steps: int, budget_s: float | None, until: int, pace: float = 1.2) -> tuple[str, str]:
    """What a terminal of ``width`` columns shows after ``until`` RL steps at ``pace`` s/step (a 60-step warm-up
    first, an eval every 50 steps): the bars and figures as drawn (no colour), and everything printed above them."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system=None)
    with TrainProgress(console, steps=steps, sft_steps=60, budget_s=budget_s, eval_every=50, base_name="tiny-omni") as shown:
        for step in range(1, 61):
            shown.on_event("sft", {"step": step, "sft_nll": 0.5})
        for step in range(1, until + 1):
            row = _row(step, time_step_s=pace, elapsed_s=pace * step)
            if step % 50 == 0:
                row.update(eval_failed=0, eval_accuracy=0.4)
            shown.on_event("step", row)
        drawn = io.StringIO()
        Console(file=drawn, width=width, color_system=None, force_terminal=False).print(shown.progress.get_renderable())
    return drawn.getvalue(), out.getvalue()


@pytest.mark.parametrize("width", [80, 100, 120])
def test_at_80_100_and_120_columns_the_bars_keep_their_labels_and_the_figures_wrap_below(width):
    drawn, _ = _screen(width, steps=1500, budget_s=600.0, until=250)
    lines = drawn.rstrip("\n").splitlines()
    assert all(cell_len(line) <= width for line in lines)
    sft, rl, *figures = lines
    assert sft.startswith("sft warm-up ") and "60/60" in sft and "nll 0.500" in sft
    assert sft.count("━") >= 30  # the finished warm-up's bar: drawn, not squeezed out by the figures
    assert rl.startswith("rl ") and "250/~501" in rl and rl.count("━") >= 15  # about half of the budget's steps
    assert " ".join(figures).split() == ("reward 0.250 accuracy 0.500 eval 0.300 1.2 s/step ETA 5m00s time budget "
                                         "ends the run at step ~501 (estimate) next eval at step 300").split()


def test_each_eval_prints_one_line_that_stays_above_the_bars():
    _, printed = _screen(100, steps=200, budget_s=None, until=200, pace=1.0)
    assert re.findall(r"eval at step \d+: [^\n\x1b]*", printed) == [
        f"eval at step {s}: reward 0.300 accuracy 0.400" for s in (50, 100, 150, 200)]


def test_an_eval_sent_as_an_event_and_in_the_step_row_prints_once():
    console, out = _log_console()
    with TrainProgress(console, steps=10, sft_steps=0, budget_s=None, eval_every=5) as shown:
        shown.on_event("eval", {"step": 0, "eval_reward": 0.28, "eval_failed": 0})
        shown.on_event("step", _row(5, eval_failed=0))
        shown.on_event("eval", {"step": 5, "eval_reward": 0.3, "eval_failed": 0})
    assert [line for line in out.getvalue().splitlines() if line.startswith("eval at step")] == [
        "eval at step 0: reward 0.280", "eval at step 5: reward 0.300"]


def test_when_the_time_budget_ends_the_run_the_count_and_next_eval_follow_it():
    console, out = _log_console()
    with TrainProgress(console, steps=1500, sft_steps=0, budget_s=600.0, eval_every=50, every=10) as shown:
        shown.on_event("step", _row(250, time_step_s=1.2, elapsed_s=300.0))  # 300 s left / 1.2 s = 250 more steps
        shown.on_event("step", _row(490, time_step_s=1.0, elapsed_s=595.0))  # 5 s left: ~495 < the eval at 500
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 250/~500: ") and "time budget ends the run at step ~500 (estimate)" in lines[0]
    assert "next eval at step 300" in lines[0]
    assert lines[1].startswith("step 490/~495: ") and lines[1].endswith("next eval at the budget's end")
    assert "/1500" not in out.getvalue() and "step 550" not in out.getvalue()


def test_without_a_binding_budget_the_count_is_the_step_budget():
    console, _ = _log_console()
    shown = TrainProgress(console, steps=100, sft_steps=0, budget_s=600.0, eval_every=50)
    shown.on_event("step", _row(10, time_step_s=2.0, elapsed_s=20.0))  # 90 steps x 2 s = 180 s < 580 s left
    assert shown.count(10, 20.0) == "10/100" and shown.steps_in_budget(10, 20.0) is None
