"""The RL learning-rate schedule: shapes, floors, and progress by steps or by the time budget."""

from __future__ import annotations

import pytest

from relax_gym.trainer.config import load_recipe
from relax_gym.trainer.lr_schedule import lr_at, progress


def test_shapes_start_at_lr_and_end_at_the_floor():
    assert lr_at(1e-3, "constant", 0.7) == 1e-3
    assert lr_at(1e-3, "linear", 0.0) == pytest.approx(1e-3) and lr_at(1e-3, "linear", 0.25) == pytest.approx(7.5e-4)
    assert lr_at(1e-3, "cosine", 0.5) == pytest.approx(5e-4) and lr_at(1e-3, "cosine", 1.0) == pytest.approx(0.0)
    assert lr_at(1e-3, "cosine", 1.0, min_ratio=0.1) == pytest.approx(1e-4)
    assert lr_at(1e-3, "linear", 3.0, min_ratio=0.1) == pytest.approx(1e-4)  # clamped past the end
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_at(1e-3, "step", 0.5)  # type: ignore[arg-type]


def test_progress_is_the_further_of_steps_and_time():
    assert progress(50, 100) == 0.5
    assert progress(50, 100, elapsed_s=80, budget_s=100) == 0.8  # the budget runs out first
    assert progress(90, 100, elapsed_s=10, budget_s=100) == 0.9
    assert progress(500, 100) == 1.0 and progress(0, 0) == 1.0


def test_config_knobs_are_validated():
    cfg = load_recipe(None, ["actor.lr_schedule=cosine", "actor.min_lr_ratio=0.1"])
    assert (cfg.actor.lr_schedule, cfg.actor.min_lr_ratio) == ("cosine", 0.1)
    with pytest.raises(Exception, match="lr_schedule"):
        load_recipe(None, ["actor.lr_schedule=sawtooth"])
