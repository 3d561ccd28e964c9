"""What both training modes share about an RL step (relax_gym.trainer.run): the seeds, the eval / checkpoint / stop
schedule, the metrics row built from episode summaries (reward components by whatever names the env reports), the
eval row and the summary's start / end fields."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.rollout.samples import masked_summary, summary_dict
from relax_gym.trainer.run.checkpoint import data_cursor
from relax_gym.trainer.run.schedule import Schedule
from relax_gym.trainer.run.seeds import (
    eval_seeds,
    prompt_seed,
    step_seed_base,
    train_seeds,
)
from relax_gym.trainer.run.step_row import (
    bus_bytes,
    episodes_masked,
    eval_row,
    rollout_row,
    summary_end,
    summary_start,
)


def episode(reward, status="ok", breakdown=None, tokens=10, tool_calls=0, mask=(0, 1, 1)):
    traj = Trajectory(group_id=0, seed=1, input_ids=[1, 2, 3], loss_mask=list(mask), rollout_logprobs=[0.0] * 3,
                      reward=reward, status=status, reward_breakdown=dict(breakdown or {}), completion_tokens=tokens,
                      info={"tool_calls": tool_calls})
    return summary_dict(traj, "s000001-g0000-00", [1])


def test_seeds_are_the_formula_both_modes_used():
    assert step_seed_base(3, 2) == 3 * 10_000_019 + 2 * 1_000
    assert prompt_seed(3, 2, 5) == 3 * 10_000_019 + 2_005
    assert train_seeds(0, 1, prompts_per_step=2, group_size=3) == [(1000, 0)] * 3 + [(1001, 1)] * 3
    assert eval_seeds(3) == [500_000, 500_001, 500_002]
    trainer = SimpleNamespace(seed=3, prompts_per_step=4, group_size=2)
    assert data_cursor(trainer, 5)["next_seed_base"] == step_seed_base(3, 6)


def test_step_row_logs_every_reward_component_under_its_own_name():
    eps = [episode(1.0, breakdown={"correct": 1.0, "brevity": 0.5}, tokens=4),
           episode(0.0, breakdown={"correct": 0.0}, tokens=6),  # a component it lacks counts 0
           episode(0.0, status="engine_error", breakdown={"correct": 1.0, "brevity": 1.0}, mask=(0, 0, 0), tokens=10)]
    row = rollout_row(eps, rollout_s=2.0)
    assert row["reward_mean"] == 0.5  # the masked episode is left out of the means
    assert row["correct_mean"] == 0.5 and row["brevity_mean"] == 0.25
    assert row["status_ok"] == 2 and row["status_engine_error"] == 1
    assert row["rollout_tokens_per_s"] == 10.0  # every episode's completion tokens count
    assert episodes_masked(eps) == 1
    assert "accuracy_mean" not in row and "format_mean" not in row  # nothing hard-coded


def test_builtin_component_names_keep_their_metric_names():
    eps = [episode(1.0, breakdown={"accuracy": 1.0, "format": 1.0}), episode(0.2, breakdown={"accuracy": 0.0, "format": 1.0})]
    row = rollout_row(eps, rollout_s=1.0)
    assert row["accuracy_mean"] == 0.5 and row["format_mean"] == 1.0
    ev = eval_row(eps)
    assert ev["eval_accuracy"] == 0.5 and ev["eval_format"] == 1.0 and ev["eval_reward"] == pytest.approx(0.6)
    assert summary_start(ev) == {"eval_reward_start": ev["eval_reward"], "eval_accuracy_start": 0.5, "eval_format_start": 1.0}
    assert summary_end(ev)["eval_accuracy_end"] == 0.5


def test_eval_row_counts_failures_and_tool_calls():
    eps = [episode(1.0, breakdown={"correct": 1.0}, tool_calls=2), episode(0.0, breakdown={"correct": 0.0}, tool_calls=0),
           masked_summary("s1", 0, "boom")]
    ev = eval_row(eps)
    assert ev == {"eval_reward": 0.5, "eval_correct": 0.5, "eval_failed": 1, "eval_tool_calls": 1.0}
    assert eval_row([]) == {"eval_reward": 0.0, "eval_failed": 0, "eval_tool_calls": 0.0}
    # the summary fields name the reward and its components only (not the failure count or the policy version)
    assert summary_end({**ev, "eval_policy_version": 3}) == {"eval_reward_end": 0.5, "eval_correct_end": 0.5}


def test_masked_summary_is_an_episode_summary():
    s = masked_summary("s000001-g0001-00", 1, "RuntimeError: gone", partition=0)
    assert s["status"] == "env_error" and not s["trainable"] and s["reward_breakdown"] == {} and s["partition"] == 0
    assert set(s) - {"partition"} == set(episode(0.0))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def trainer(**kw):
    base = dict(steps=6, eval_every=2, checkpoint_every=3, time_budget_s=None)
    return SimpleNamespace(**{**base, **kw})


def test_schedule_evals_and_checkpoints_on_their_periods_and_at_the_end():
    s = Schedule(trainer(), clock=Clock())
    s.start()
    plans = {k: s.after(k) for k in range(1, 7)}
    assert [k for k, p in plans.items() if p.eval] == [2, 4, 6]
    assert [k for k, p in plans.items() if p.checkpoint] == [3, 6]
    assert not any(p.stop for p in plans.values())


def test_a_time_budget_stop_evaluates_and_checkpoints_the_step_it_stops_at():
    clock = Clock()
    s = Schedule(trainer(time_budget_s=10.0), clock=clock)
    s.start(already_s=4.0)  # a resumed run: its clock goes on from the checkpoint's
    clock.now += 5.0
    assert s.elapsed() == 9.0 and s.after(1) == s.after(1) and not s.after(1).stop
    clock.now += 2.0
    plan = s.after(1)
    assert plan.stop and plan.eval and plan.checkpoint  # step 1 is neither an eval nor a checkpoint step otherwise
    tiny = Schedule(trainer(time_budget_s=0.001), clock=clock)
    tiny.start()
    clock.now += 0.01  # any step takes longer than 1 ms: the first one stops the run
    assert tiny.after(1).stop


def test_a_component_seen_once_stays_in_every_later_row():
    """A batch whose episodes all ended without a breakdown (truncated) still logs the run's components, at 0.0,
    and the summary's end fields match its start fields."""
    from relax_gym.trainer.run.step_row import RewardComponents

    seen = RewardComponents()
    answered = [{"reward": 1.0, "status": "ok", "trainable": True, "completion_tokens": 3,
                 "reward_breakdown": {"accuracy": 1.0, "format": 1.0}}]
    truncated = [{"reward": 0.0, "status": "truncated", "trainable": True, "completion_tokens": 9, "reward_breakdown": {}}]
    first = eval_row(answered, seen.observe(answered))
    assert first["eval_accuracy"] == 1.0
    later = rollout_row(truncated, 1.0, seen.observe(truncated))
    assert later["accuracy_mean"] == 0.0 and later["format_mean"] == 0.0
    last = eval_row(truncated)  # a row built without the run's memory has no components ...
    assert "eval_accuracy" not in last
    assert summary_end(last, first) == {"eval_reward_end": 0.0, "eval_accuracy_end": 0.0, "eval_format_end": 0.0}


def test_bus_bytes_are_summed_in_async_rows_only():
    base = {"reward": 1.0, "status": "ok", "trainable": True, "completion_tokens": 3}
    async_eps = [{**base, "bus_bytes": 1000, "media_bytes_saved": 3000}, {**base, "bus_bytes": 40, "media_bytes_saved": 0}]
    assert bus_bytes(async_eps) == {"bus_bytes_put": 1040, "bus_media_bytes_saved": 3000}
    assert bus_bytes([base]) == {}  # colocate: no bus


def test_tool_metrics_and_the_crash_warning(caplog):
    from relax_gym.trainer.run.step_row import tool_metrics, warn_on_tool_crashes

    quiet = [{"tool_calls": 0}] * 3
    assert tool_metrics(quiet) == {}
    eps = [{"tool_calls": 2, "tool_errors": 1, "tool_crashes": 1}, {"tool_calls": 3, "tool_errors": 0, "tool_crashes": 0},
           {"tool_calls": 1, "tool_errors": 1, "tool_crashes": 0}, {"tool_calls": 0}]
    row = tool_metrics(eps)
    assert row == {"tool_calls": 6, "tool_errors": 2, "tool_crash_episodes": 1}
    with caplog.at_level("WARNING"):
        assert "a tool raised in 1 of 4 episodes" in warn_on_tool_crashes(row, 4, step=7)
        assert warn_on_tool_crashes(row, 20, step=8) is None  # 1 in 20 is under the 10% share
        assert warn_on_tool_crashes({}, 4, step=9) is None
    assert [r.getMessage()[:6] for r in caplog.records] == ["step 7"]
