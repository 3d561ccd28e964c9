"""Deterministic replays of the real async controller (AsyncTrainer with recovery's Supervisor) on the virtual clock:
the orderings that real runs reach only by chance -- a replica dying mid-group, mid-stream, the actor dying, a role
replaced past its budget, a group that keeps failing -- replayed exactly, with the sample ledger checked."""

from __future__ import annotations

import pytest

from relax_gym.trainer.async_engine.recovery import GlobalRestart
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.plan.costs import Costs, Dist
from relax_gym.trainer.plan.real_drive import RoleFaults, drive

P, G = 4, 2


def costs() -> Costs:
    return Costs.model_validate({
        "episode": {"turns": Dist.fixed(2), "completion_tokens": Dist.lognormal(60, 0.5, 200),
                    "prompt_tokens": Dist.fixed(100), "tool_s": Dist.lognormal(1.0, 1.2, 30.0)},
        "generation": {"peak_tokens_per_s": 800.0, "half_batch": 4.0},
        "train": {"s_per_token": 2e-4, "step_overhead_s": 0.2, "micro_batch_size": 4},
        "sync": {"push_s": 0.1}, "cluster": {"gpus": 2, "replicas": 1}})


def config(**trainer) -> RelaxConfig:
    return RelaxConfig.model_validate({"trainer": {"mode": "async", "steps": 6, "prompts_per_step": P, "group_size": G,
                                                   "max_staleness": 2, "seed": 0, **trainer},
                                       "roles": {"restart_budget": 3, "replica_wait_s": 60.0}})


def ledger_ok(summary: dict, steps: int = 6) -> None:
    assert summary["samples_consumed"] == steps * P * G
    assert summary["samples_lost"] == 0 and summary["samples_duplicated"] == 0


def test_the_same_faults_replay_the_same_run():
    faults = lambda: RoleFaults().fail("env_worker", "run_group", after=5).fail("advantages", "process", after=2)
    a, b = drive(costs(), config(), faults=faults()), drive(costs(), config(), faults=faults())
    assert a.log.lines() == b.log.lines() and a.rows == b.rows
    assert a.topology.faults.fired == b.topology.faults.fired


@pytest.mark.parametrize("stragglers", ["wait", "carry"])
def test_an_env_worker_dying_mid_group_is_replaced_and_its_group_lands_once(stragglers):
    faults = RoleFaults().fail("env_worker", "run_group", after=6, hang_s=0.5)
    r = drive(costs(), config(stragglers=stragglers), faults=faults)
    ledger_ok(r.summary)
    assert r.summary["restarts_level1"] == {"env_worker": 1} and r.summary["restarts_level2"] == 0
    (fired,) = r.topology.faults.fired
    died_at = fired[0]
    # the group the dead call was playing started before the death and was played again after it
    before = {f["first"] for t, f in r.log.kinds("group_start") if t <= died_at}
    after = {f["first"] for t, f in r.log.kinds("group_start") if t > died_at}
    assert before & after


@pytest.mark.parametrize("role", ["advantages", "reference"])
def test_a_streaming_role_dying_mid_step_gives_its_leases_back_and_the_rows_are_processed_once(role):
    with_ref = costs().with_updates(train={"ref_s_per_token": 5e-5})  # a reference forward: the role is deployed
    cfg = config() if role == "advantages" else RelaxConfig.model_validate({**config().model_dump(), "algorithm": {"kl_coef": 0.05}})
    plain = drive(with_ref, cfg)
    faults = RoleFaults().fail(role, "process", after=2, hang_s=3.0)  # step 3's stream dies after 3 s
    r = drive(with_ref, cfg, faults=faults)
    ledger_ok(r.summary)
    assert r.summary["restarts_level1"] == {role: 1} and len(r.topology.faults.fired) == 1
    assert [row["samples_consumed"] for row in r.rows] == [P * G] * 6
    # the rows are the same rows; only the time changes (the stream was cut and sent again)
    assert [row["episodes_trained"] for row in r.rows] == [row["episodes_trained"] for row in plain.rows]


def test_the_actor_dying_asks_for_a_global_restart():
    faults = RoleFaults().fail("actor", "train_step", after=2)
    with pytest.raises(GlobalRestart, match="the actor replica (died during step 3|was replaced)"):
        drive(costs(), config(), faults=faults)


def test_a_role_replaced_past_its_budget_asks_for_a_global_restart():
    faults = RoleFaults().fail("env_worker", "run_group", after=1, times=4)
    with pytest.raises(GlobalRestart, match=r"env_worker role was replaced 4 times, more than roles.restart_budget=3"):
        drive(costs(), config(), faults=faults)


@pytest.mark.parametrize("stragglers", ["wait", "carry"])
def test_a_group_that_keeps_failing_is_masked_and_the_step_goes_on(stragglers):
    one_group = lambda partition, group, seeds, sids, **kw: sids[0].startswith("s000002-g0001")
    faults = RoleFaults().fail("env_worker", "run_group", times=3, kind="error", match=one_group)  # its every attempt
    r = drive(costs(), config(stragglers=stragglers), faults=faults)
    assert r.summary["samples_consumed"] == 6 * P * G and r.summary["samples_duplicated"] == 0
    # masked rows take the group's place (every step is full); the ledger counts them as lost, nothing else
    assert sum(row["episodes_masked"] for row in r.rows) == G and r.summary["samples_lost"] == G
    assert r.summary["restarts_level1"] == {} and len(r.topology.faults.fired) == 3


def test_carry_discards_stay_within_the_bound_and_are_counted_once():
    r = drive(costs().with_updates(episode={"tool_s": Dist.lognormal(2.0, 1.5, 60.0)}), config(stragglers="carry", steps=8))
    ledger_ok(r.summary, steps=8)
    assert all(row["staleness_max"] <= 2 for row in r.rows)
    assert r.summary["samples_discarded_stale"] % G == 0


def test_what_the_drive_cannot_simulate_is_refused_by_name():
    with pytest.raises(ValueError, match="not 'colocate'"):
        drive(costs(), config(mode="colocate", max_staleness=0))
    with pytest.raises(ValueError, match="PPO's critic"):
        drive(costs(), RelaxConfig.model_validate({"trainer": {"mode": "async"}, "algorithm": {"name": "ppo"}}))
    with pytest.raises(ValueError, match="'replica' or 'error', not 'crash'"):
        RoleFaults().fail("env_worker", "run_group", kind="crash")


@pytest.mark.parametrize("s", [0, 2])
def test_a_spent_time_budget_stops_the_run_after_its_step_with_a_checkpoint_and_an_eval(s):
    """The time budget on the virtual clock (what tests/integration/test_modes_agree.py checks for colocate mode):
    spent during step 1 (each step takes seconds here, the budget is one), the run stops after that step, with the
    step's eval and checkpoint although neither is due (every 2 steps), and its ledger whole; at S = 2 the groups
    launched ahead for later steps are counted unconsumed, not lost."""
    r = drive(costs(), config(max_staleness=s, time_budget_s=1.0, checkpoint_every=2, eval_every=2), keep_schedule=True)
    assert r.summary["steps"] == 1 and r.summary["elapsed_s"] >= 1.0
    assert [row["step"] for row in r.rows] == [1] and "eval_reward" in r.rows[0]
    assert [step for step, _ in r.topology.actor.checkpoints] == [1]
    assert r.summary["samples_consumed"] == P * G and r.summary["samples_lost"] == 0
    assert r.summary["samples_duplicated"] == 0
    assert r.summary["samples_unconsumed"] == (P * G * s if s else 0)
    # without a budget the same schedule evaluates and checkpoints every 2 steps to the end
    r = drive(costs(), config(max_staleness=s, checkpoint_every=2, eval_every=2), keep_schedule=True)
    assert r.summary["steps"] == 6 and [step for step, _ in r.topology.actor.checkpoints] == [2, 4, 6]
    assert [row["step"] for row in r.rows if "eval_reward" in row] == [2, 4, 6]
