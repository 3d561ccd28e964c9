"""The RL step's frame is written once (trainer/run/driver.py): each mode's loop is a short list of named calls, the
step tail (eval, metrics row, checkpoint, stop) and the summary are the driver's alone, and the learning-rate
formula has one home (run/lr_schedule.step_lr)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TRAINER = Path(__file__).resolve().parents[2] / "relax_gym" / "trainer"
LOOPS = {"colocate.py": "ColocateTrainer", "async_engine/controller.py": "AsyncTrainer"}
MAX_LOOP_LINES = 25
# what only the driver does: a mode that calls these itself has grown its own copy of the tail
DRIVER_ONLY = {"after", "summary_start", "summary_end", "warn_on_tool_crashes", "report_warmup_row", "eval_history",
               "lr_at", "decayed_fraction"}


def _method(path: Path, cls: str, name: str) -> ast.AsyncFunctionDef:
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _called(node: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("module", sorted(LOOPS))
def test_each_mode_loop_is_short_and_ends_each_step_in_the_driver(module):
    loop = _method(TRAINER / module, LOOPS[module], "_loop")
    body = loop.body[1:] if isinstance(loop.body[0], ast.Expr) and isinstance(loop.body[0].value, ast.Constant) else loop.body
    lines = body[-1].end_lineno - body[0].lineno + 1
    assert lines <= MAX_LOOP_LINES, f"{LOOPS[module]}._loop is {lines} lines of code (at most {MAX_LOOP_LINES})"
    assert "after_step" in _called(loop), f"{LOOPS[module]}._loop does not hand its steps to the driver"


@pytest.mark.parametrize("module", sorted(LOOPS) + ["async_engine/roles/actor.py"])
def test_the_step_tail_and_the_lr_formula_live_only_in_the_driver(module):
    copied = _called(ast.parse((TRAINER / module).read_text())) & DRIVER_ONLY
    assert not copied, f"{module} calls {sorted(copied)} itself: that is the driver's (run/driver.py)"
