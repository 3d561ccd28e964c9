"""The RL learning-rate schedule: shapes, floors, and progress by steps or by the time budget."""

from __future__ import annotations

import pytest

from relax_gym.trainer.config import load_recipe
from relax_gym.trainer.run.lr_schedule import DecayGate, decayed_fraction, lr_at, progress


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


def test_decay_gate_holds_the_peak_until_the_reward_leaves_its_plateau():
    gate = DecayGate(threshold=0.35, window=3)
    started = []
    for step, reward in enumerate([0.50, 0.28, 0.20, 0.30, 0.29, 0.50, 0.20], start=1):
        gate.observe(reward, fraction=step / 10)
        started.append(gate.decay_from)
    # step 1 alone is above 0.35 but the window is not full; the 3-step means are then 0.327, 0.26, 0.263, 0.363
    assert started == [None] * 5 + [pytest.approx(0.6)] * 2  # starts once, at the progress after step 6
    assert decayed_fraction(0.5, gate.decay_from) == 0.0 and decayed_fraction(0.8, gate.decay_from) == pytest.approx(0.5)
    assert decayed_fraction(0.9, None) == 0.0 and decayed_fraction(0.9, 1.0) == 1.0
    assert lr_at(1e-3, "cosine", decayed_fraction(0.9, None), 0.1) == pytest.approx(1e-3)  # held: the peak rate


def test_decay_gate_without_threshold_is_the_plain_schedule_and_survives_a_checkpoint():
    plain = DecayGate(None)
    plain.observe(0.0, 0.5)
    assert plain.decay_from == 0.0 and decayed_fraction(0.6, plain.decay_from) == 0.6
    gate = DecayGate(0.5, window=2)
    gate.observe(0.9, 0.1)
    saved = gate.state()
    again = DecayGate.from_state(saved, 0.5, 2)
    again.observe(0.9, 0.2)
    assert again.decay_from == pytest.approx(0.2)  # the saved reward counts towards the window
    assert DecayGate.from_state(saved, 0.6, 2).recent == type(gate.recent)()  # another threshold: a fresh gate
    assert DecayGate.from_state(None, 0.5, 2).decay_from is None
    with pytest.raises(ValueError, match="lr_hold_window"):
        DecayGate(0.5, window=0)


def test_hold_knobs_are_config_fields():
    cfg = load_recipe(None, ["actor.lr_hold_until_reward=0.35", "actor.lr_hold_window=20"])
    assert (cfg.actor.lr_hold_until_reward, cfg.actor.lr_hold_window) == (0.35, 20)
    with pytest.raises(Exception, match="lr_hold_window"):
        load_recipe(None, ["actor.lr_hold_window=0"])
