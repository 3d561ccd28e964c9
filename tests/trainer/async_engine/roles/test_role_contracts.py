"""The roles' answers and the bus rows against their typed contracts (trainer/async_engine/contracts.py), for the
real roles and the planner's simulated ones alike: the planner drives the real controller over the simulated roles,
so an answer that differs (a key the real role lacks, one it adds) would plan a run that cannot happen."""

from __future__ import annotations

import asyncio
import inspect

from relax_gym.trainer.async_engine.contracts import (
    ActorStepAnswer,
    AdvantagesAnswer,
    EpisodeAnswer,
    RolloutRow,
    StreamAnswer,
    TrainRow,
    contract_keys,
    mismatch,
)
from relax_gym.trainer.async_engine.roles.actor import ActorRole
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.async_engine.roles.critic import CriticRole
from relax_gym.trainer.async_engine.roles.env_worker import EnvWorkerRole
from relax_gym.trainer.async_engine.roles.reference import ReferenceRole
from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.plan.clock import run_virtual
from relax_gym.trainer.plan.costs import Costs, Dist
from relax_gym.trainer.plan.sim_roles import EnginePool, EventLog, SimActor, SimEnvWorker, SimReference, SimWeights
from relax_gym.trainer.rollout.samples import ROLLOUT_FIELDS, TRAIN_FIELDS, sample_id
from relax_gym.trainer.policy import build_policy
from tests.trainer.async_engine.roles.test_streaming_roles import (  # noqa: F401 - demos: a fixture
    G,
    ScriptedEngine,
    WeightSink,
    config,
    demos,
    rows_for,
)

COSTS = Costs.model_validate({
    "episode": {"turns": Dist.fixed(1), "completion_tokens": Dist.fixed(20), "prompt_tokens": Dist.fixed(50),
                "tool_s": Dist.fixed(0.0)},
    "generation": {"peak_tokens_per_s": 800.0, "half_batch": 4.0},
    "train": {"s_per_token": 1e-4, "step_overhead_s": 0.1, "micro_batch_size": 2 * G}, "sync": {"push_s": 0.1},
    "cluster": {"gpus": 2, "replicas": 1}})


def test_mismatch_names_missing_and_unknown_keys():
    """What the planner's actor once answered: ``staleness`` the real actor does not send, no ``tis_cap``."""
    answer = {k: 0 for k in contract_keys(ActorStepAnswer) - {"tis_cap"}} | {"staleness": [0, 1]}
    assert mismatch(ActorStepAnswer, answer) == ["missing 'tis_cap'", "unknown 'staleness'"]
    assert mismatch(StreamAnswer, {"rows": 3, "forwarded": 2}) == []


def test_real_and_simulated_actor_answer_the_same_contract(demos):
    """One step of the real actor role and one of the planner's SimActor on the same rows (stale, S = 2):
    both answers hold exactly ActorStepAnswer's keys, and the same truncated-IS cap."""
    cfg = config(max_staleness=2)
    rows = rows_for(1, demos, versions=(3, 4), failed={(0, 1)})
    n = len(rows)

    async def step(make_actor):
        bus = make_bus("inprocess")
        actor = make_actor(bus)
        advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
        await bus.open_partition(0, expected_rows=n, group_size=G)
        await bus.put(0, rows)
        await bus.seal(0, n)
        counts, res = await asyncio.gather(advantages.process(0, n, G), actor.train_step(0, n, G, max_staleness=2))
        return counts, res, actor

    def real(bus):
        actor = ActorRole(cfg.model_dump(mode="json"), bus, pusher=WeightSink())
        actor.version = 5
        return actor

    def simulated(bus):
        log = EventLog()
        actor = SimActor(COSTS, bus, SimWeights(EnginePool(1, COSTS.generation), COSTS, log), 1, log,
                         algorithm=cfg.algorithm, trainer=cfg.trainer)
        actor.version = 5
        return actor

    counts, res_real, _ = asyncio.run(step(real))
    _, res_sim, sim = run_virtual(step(simulated))
    assert mismatch(ActorStepAnswer, res_real) == [] and mismatch(ActorStepAnswer, res_sim) == []
    assert mismatch(AdvantagesAnswer, counts) == []
    assert res_real["tis_cap"] == res_sim["tis_cap"] == cfg.trainer.off_policy_tis_cap
    for key in ("staleness_max", "rollout_version_min", "rollout_version_max", "sample_ids", "trained_version"):
        assert res_real[key] == res_sim[key], key
    assert sim.staleness == [2] * n  # the planner's histogram keeps every consumed sample's staleness


def test_simulated_env_worker_answers_and_rows_follow_the_contracts():
    async def main():
        bus = make_bus("inprocess")
        worker = SimEnvWorker(COSTS, 0, EnginePool(1, COSTS.generation), EventLog(), bus=bus,
                              episodes=asyncio.Semaphore(8))
        await bus.open_partition(0, expected_rows=G, group_size=G)
        answers = await worker.run_group(0, 3, [0] * G, [sample_id(1, 3, m) for m in range(G)])
        batch = await bus.fetch(0, "check", ["tokens", "group_id"], G, whole_groups=True)
        return answers, batch

    answers, batch = run_virtual(main())
    assert all(mismatch(EpisodeAnswer, a) == [] for a in answers)
    assert {a["group_id"] for a in answers} == {3} and {a["partition"] for a in answers} == {0}
    assert sorted(batch.sample_ids) == sorted(a["sample_id"] for a in answers)


def test_real_env_worker_answers_follow_the_contract():
    """The real env worker's summaries (played, failed, eval) hold EpisodeAnswer's keys, as the simulated ones do."""

    async def main():
        bus = make_bus("inprocess")
        _, processor = build_policy()
        worker = EnvWorkerRole(config().model_dump(mode="json"), bus, ScriptedEngine(processor, fail_after=2),
                               pool_size=2, eval_pool_size=1)
        await bus.open_partition(0, expected_rows=G, group_size=G)
        played = await worker.run_group(0, 0, [11] * G, [sample_id(1, 0, m) for m in range(G)])
        return played, await worker.evaluate([500_000])

    played, evals = asyncio.run(main())
    assert {s["status"] for s in played} == {"ok", "engine_error"}
    assert all(mismatch(EpisodeAnswer, s) == [] for s in played + evals)


def test_bus_row_views_are_the_fields_the_roles_read_and_write():
    assert contract_keys(TrainRow) == set(TRAIN_FIELDS)
    assert contract_keys(RolloutRow) == set(ROLLOUT_FIELDS)
    assert set(SimActor.FIELDS) <= contract_keys(TrainRow)  # the simulated actor reads a part of the real view


def test_real_and_simulated_roles_declare_the_same_answers():
    """Each role call the controller makes returns its contract, in the real role and in its simulated twin."""
    pairs = [(ActorRole.train_step, SimActor.train_step, "ActorStepAnswer"),
             (ReferenceRole.process, SimReference.process, "StreamAnswer"),
             (EnvWorkerRole.run_group, SimEnvWorker.run_group, "list[EpisodeAnswer]"),
             (AdvantagesRole.process, None, "AdvantagesAnswer"),  # the planner runs the real advantages role
             (CriticRole.values, None, "StreamAnswer")]  # the planner has no critic
    for real, simulated, contract in pairs:
        assert inspect.signature(real).return_annotation == contract, real.__qualname__
        if simulated is not None:
            assert inspect.signature(simulated).return_annotation == contract, simulated.__qualname__
