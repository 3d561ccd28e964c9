"""The simulated schedule: the real staleness gate, carry feeder/slots, bus and advantages role on the virtual
clock. Same seed, same event log; staleness bounded; carry never drops a fresh group; closed forms hold."""

from __future__ import annotations

from collections import Counter

import pytest

from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.plan.costs import (
    Cluster,
    Costs,
    Dist,
    EpisodeCost,
    GenerationCost,
    SyncCost,
    TrainCost,
)
from relax_gym.trainer.plan.schedule import episode_slots, groups_in_flight, simulate

BASE = {"steps": 6, "prompts_per_step": 4, "group_size": 2, "concurrency": 64, "seed": 0}
MODES = {
    "colocate": {"mode": "colocate"},
    "async-S0": {"mode": "async", "max_staleness": 0},
    "async-S2": {"mode": "async", "max_staleness": 2},
    "async-S2-carry": {"mode": "async", "max_staleness": 2, "stragglers": "carry"},
}


def long_tail(**parts) -> Costs:
    """A small long-tail agentic workload: 1-4 turns, tool waits with a heavy tail, a KL reference role."""
    c = Costs(
        episode=EpisodeCost(turns=Dist(kind="lognormal", value=2.0, sigma=0.6, min=1, max=4),
                            completion_tokens=Dist.lognormal(60, 0.7, 200), prompt_tokens=Dist.fixed(200),
                            observation_tokens=Dist.fixed(30), tool_s=Dist.lognormal(1.0, 1.2, 30.0),
                            reset_s=Dist.fixed(0.1), zero_adv_group_share=0.3),
        generation=GenerationCost(peak_tokens_per_s=600.0, half_batch=4.0, max_batch=16, prefill_cost=0.05),
        train=TrainCost(s_per_token=3e-4, s_per_micro_batch=0.05, step_overhead_s=0.2, ref_s_per_token=5e-5,
                        micro_batch_size=4),
        sync=SyncCost(push_s=0.3, sleep_wake_s=0.5),
        cluster=Cluster(gpus=2, replicas=1, colocate_replicas=1, colocate_actor_gpus=1),
    )
    return c.with_updates(**parts) if parts else c


@pytest.mark.parametrize("mode", list(MODES))
def test_same_seed_same_event_log_other_seed_other_log(mode):
    costs, trainer = long_tail(), {**BASE, **MODES[mode]}
    a, b = simulate(costs, trainer), simulate(costs, trainer)
    assert a.log.lines() == b.log.lines() and a.rows == b.rows
    assert a.summary["log_digest"] == b.summary["log_digest"]
    c = simulate(costs, {**trainer, "seed": 1})
    assert c.summary["log_digest"] != a.summary["log_digest"]


@pytest.mark.parametrize("stragglers", ["wait", "carry"])
@pytest.mark.parametrize("s", [0, 1, 2])
def test_staleness_of_every_consumed_sample_is_within_the_bound(s, stragglers):
    r = simulate(long_tail(), {**BASE, "mode": "async", "max_staleness": s, "stragglers": stragglers})
    hist = {int(k): v for k, v in r.summary["staleness_hist"].items()}
    assert max(hist) <= s and all(row["staleness_max"] <= s for row in r.rows)
    n = BASE["prompts_per_step"] * BASE["group_size"]
    assert sum(hist.values()) == r.summary["samples_consumed"] == BASE["steps"] * n  # every step full
    assert r.summary["samples_duplicated"] == 0 and r.summary["samples_lost"] == 0
    if stragglers == "wait":
        assert r.summary["samples_produced"] == BASE["steps"] * n and r.summary["samples_discarded_stale"] == 0
    # the gate: step k's partition opens only once k - trained <= S
    for _, f in r.log.kinds("step_open"):
        assert f["step"] - f["trained"] <= s


@pytest.mark.parametrize("s", [0, 1])
def test_carry_discards_only_groups_too_stale_for_the_partition_being_filled(s):
    trainer = {**BASE, "steps": 8, "mode": "async", "max_staleness": s, "stragglers": "carry"}
    r = simulate(long_tail(), trainer)
    born = {f["first"]: f["born"] for _, f in r.log.kinds("group_start")}
    placed = 0  # groups placed so far: the partition being filled is placed // P
    dropped = 0
    for _, f in r.log.kinds("group_end"):
        filling = placed // trainer["prompts_per_step"]
        if f["partition"] is None:
            dropped += 1
            assert filling - born[f["first"]] > s or filling >= trainer["steps"]
        else:
            assert f["partition"] == filling and filling - born[f["first"]] <= s
            placed += 1
    assert dropped * trainer["group_size"] == r.summary["samples_discarded_stale"]
    assert Counter(f["partition"] for _, f in r.log.kinds("group_end") if f["partition"] is not None) == {
        j: trainer["prompts_per_step"] for j in range(trainer["steps"])}


def test_fast_generation_and_no_tool_wait_leave_the_actor_no_data_wait():
    costs = long_tail(generation={"peak_tokens_per_s": 1e6}, episode={"tool_s": Dist.fixed(0), "reset_s": Dist.fixed(0)})
    r = simulate(costs, {**BASE, "mode": "async", "max_staleness": 1})
    assert r.summary["data_wait_fraction_steady"] < 0.02
    colocate = simulate(costs, {**BASE, "mode": "colocate"})
    assert colocate.summary["data_wait_fraction"] < 0.02


def test_compute_bound_async_runs_at_the_actor_speed():
    costs = long_tail(generation={"peak_tokens_per_s": 1e6}, episode={"tool_s": Dist.fixed(0), "reset_s": Dist.fixed(0)})
    r = simulate(costs, {**BASE, "steps": 10, "mode": "async", "max_staleness": 2})
    steady = r.rows[3:]
    actor_s = sum(row["time_train_s"] + row["time_sync_s"] for row in steady) / len(steady)
    assert sum(row["time_step_s"] for row in steady) / len(steady) == pytest.approx(actor_s, rel=0.02)


def test_colocate_step_is_rollout_sleep_wake_train_and_sync_in_closed_form():
    P, G, tokens, peak = 4, 2, 100, 1000.0
    costs = Costs(episode=EpisodeCost(completion_tokens=Dist.fixed(tokens), prompt_tokens=Dist.fixed(0)),
                  generation=GenerationCost(peak_tokens_per_s=peak, half_batch=0.0),
                  train=TrainCost(s_per_token=1e-3, s_per_micro_batch=0.1, step_overhead_s=0.5, micro_batch_size=4),
                  sync=SyncCost(push_s=2.0, sleep_wake_s=10.0, colocate_push_s=1.0))
    r = simulate(costs, {**BASE, "prompts_per_step": P, "group_size": G, "mode": "colocate", "steps": 3})
    rollout = P * G * tokens / peak  # every sequence shares the one engine's throughput
    # no zero-advantage group (share 0, pairs never tie): 2 micro-batches of 2 groups, then the optimiser step
    train = 2 * (0.1 + 1e-3 * tokens * G * 2) + 0.5
    for row in r.rows:
        assert row["time_rollout_s"] == pytest.approx(rollout) and row["time_train_s"] == pytest.approx(train)
        assert row["time_sleep_wake_s"] == pytest.approx(10.0) and row["time_sync_s"] == pytest.approx(1.0)
        assert row["time_step_s"] == pytest.approx(rollout + 10.0 + train + 1.0)
    assert r.summary["data_wait_fraction"] == pytest.approx(rollout / (rollout + 11.0 + train))
    assert r.summary["steps_per_hour"] == pytest.approx(3600 / (rollout + 11.0 + train))


def test_async_on_policy_overlaps_nothing_but_off_policy_pipelines():
    costs = long_tail()
    s0 = simulate(costs, {**BASE, "steps": 8, "mode": "async", "max_staleness": 0}).summary
    s2 = simulate(costs, {**BASE, "steps": 8, "mode": "async", "max_staleness": 2}).summary
    assert s0["staleness_hist"].keys() == {"0"}
    assert s2["steps_per_hour"] > 1.2 * s0["steps_per_hour"]


@pytest.mark.parametrize("mode", ["colocate", "async-S2", "async-S2-carry"])
def test_pool_sizes_mirror_the_deployed_topology(mode):
    from relax_gym.trainer.async_engine.deploy import plan_roles

    cfg = RelaxConfig.model_validate({"trainer": {**BASE, "concurrency": 6, **MODES[mode], "mode": "async"}})
    t = cfg.trainer
    env_worker = next(s for s in plan_roles(cfg, None, None, "x") if s.name == "env_worker")
    assert env_worker.kwargs["pool_size"] == episode_slots(t)
    assert groups_in_flight(t) == max(1, min(t.concurrency, t.prompts_per_step * t.group_size) // t.group_size)


@pytest.mark.slow(reason="replays the simulation in a fresh interpreter with another hash seed")
def test_the_event_log_is_the_same_in_another_process_with_another_hash_seed():
    import os
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'tests/trainer/plan'); from test_schedule import BASE, MODES, long_tail; "
            "from relax_gym.trainer.plan.schedule import simulate; "
            "print(simulate(long_tail(), {**BASE, **MODES['async-S2-carry']}).summary['log_digest'])")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**os.environ, "PYTHONHASHSEED": "12345"},
                         capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.strip() == simulate(long_tail(), {**BASE, **MODES["async-S2-carry"]}).summary["log_digest"]
