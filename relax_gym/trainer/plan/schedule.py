"""One simulated training run on the virtual clock: colocate, async S, or async S with carried stragglers.

    result = simulate(costs, TrainerSection(mode="async", max_staleness=2, stragglers="carry", steps=20, ...))
    result.summary["steps_per_hour"], result.summary["data_wait_fraction"], result.summary["staleness_hist"]
    result.rows          # one dict per step, the keys of the controller's metrics rows
    result.log.digest()  # same costs + same trainer section (seed included) -> same digest, bit for bit

What runs for real and what is simulated (async mode):

- **real, unchanged**: the staleness gate (:class:`~relax_gym.trainer.async_engine.staleness.StalenessGate`), the
  carry feeder and slots (:class:`~relax_gym.trainer.async_engine.carry.CarryFeeder`,
  :class:`~relax_gym.trainer.async_engine.carry.CarrySlots`, ``claim_slot``), the data bus
  (:class:`~relax_gym.trainer.databus.twin.InProcessBus` and its delivery ledger: partitions, seals, whole-group
  streaming micro-batches, leases, acks), the advantages role
  (:class:`~relax_gym.trainer.async_engine.roles.advantages.AdvantagesRole`), the controller's sample ledger
  (:class:`~relax_gym.trainer.async_engine.ledger.SampleLedger`: produced, consumed, placed, discarded, lost),
  ``staleness`` / ``staleness_stats`` and ``sample_id``.
- **re-implemented here, line for line**: the controller's drive (:class:`~relax_gym.trainer.async_engine.controller.
  AsyncTrainer`'s ``_loop``, ``_launch``, ``_rollout``, ``_carried_group``, ``_groups_in_flight``, and the
  env-worker pool size of :func:`~relax_gym.trainer.async_engine.deploy.plan_roles`). The controller's loop cannot
  run as it is: it is bound to Ray Serve handles, the topology, eval, checkpoints and metrics files. What it does
  per step is kept: wait on the gate, open the partition, start the rollout (or take the carry feeder's) and one
  streaming call per role, train, advance the gate and poke the feeder, gather, drop the partition; the step time,
  data wait and summary shares are computed as it computes them.
- **simulated** (:mod:`.sim_roles`, timed by :mod:`.costs`): env workers, inference engines, the reference role,
  the actor's compute and the weight push.
- not modelled: recovery (replica restarts, global restarts), eval, checkpoints, lease timeouts, Serve's random
  routing, CPU contention between roles, the lr schedule.

Colocate mode has no bus and no roles: per step every engine plays the step's groups, the engines sleep and the
actor wakes (``sync.sleep_wake_s``), the actor trains on the step's micro-batches, the weights reload
(``sync.colocate_push_s``). Its data wait is the rollout (the actor has nothing to do meanwhile).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from relax_gym.trainer.async_engine.carry import CarryFeeder, CarrySlots
from relax_gym.trainer.async_engine.ledger import SampleLedger
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.async_engine.staleness import StalenessGate
from relax_gym.trainer.config import TrainerSection
from relax_gym.trainer.databus import InProcessBus
from relax_gym.trainer.plan.clock import run_virtual
from relax_gym.trainer.plan.costs import Costs
from relax_gym.trainer.plan.sim_roles import (
    EnginePool,
    EventLog,
    SimActor,
    SimEnvWorker,
    SimReference,
    SimWeights,
)
from relax_gym.trainer.rollout.samples import sample_id

__all__ = ["SimResult", "episode_slots", "groups_in_flight", "simulate"]


@dataclass
class SimResult:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    log: EventLog = field(repr=False)


def groups_in_flight(t: TrainerSection) -> int:
    """Carry's pool of running groups (the controller's ``_groups_in_flight``): colocate's per-step episode budget."""
    return max(1, min(t.concurrency, t.prompts_per_step * t.group_size) // t.group_size)


def episode_slots(t: TrainerSection, env_workers: int = 1) -> int:
    """Episodes the env workers can play at once (their pools, as :func:`~relax_gym.trainer.async_engine.deploy.
    plan_roles` sizes them): colocate's per-step budget, times S + 1 in async ``wait`` mode."""
    in_flight = min(t.concurrency, t.prompts_per_step * t.group_size)
    if t.mode == "async" and t.stragglers == "wait":
        in_flight *= t.max_staleness + 1
    return math.ceil(in_flight / env_workers) * env_workers


def simulate(costs: Costs, trainer: TrainerSection | dict[str, Any], *, algorithm: dict[str, Any] | None = None) -> SimResult:
    """Run ``trainer.steps`` steps of ``trainer.mode`` on the virtual clock (see the module docstring).
    ``algorithm``: the advantages role's config (default GRPO)."""
    t = trainer if isinstance(trainer, TrainerSection) else TrainerSection.model_validate(trainer)
    sim = _Run(costs, t, algorithm or {})
    return run_virtual(sim.colocate() if t.mode == "colocate" else sim.asynchronous())


def _share(pairs: list[tuple[float, float]]) -> float:
    total = sum(step for _, step in pairs)
    return sum(wait for wait, _ in pairs) / total if total > 0 else 0.0


class _Run:
    def __init__(self, costs: Costs, t: TrainerSection, algorithm: dict[str, Any]) -> None:
        self.costs, self.t, self.algorithm = costs, t, algorithm
        self.log = EventLog()
        self.replicas, self.actor_gpus = costs.cluster.split(t.mode, costs.generation.gpus_per_replica)
        self.rows: list[dict[str, Any]] = []
        self.stale: list[int] = []

    def _n(self) -> int:
        return self.t.prompts_per_step * self.t.group_size

    def _sids(self, step: int, prompt: int) -> list[str]:
        return [sample_id(step, prompt, m) for m in range(self.t.group_size)]

    def _summary(self, pool: EnginePool, loop_s: float, waits: list[tuple[float, float]], steps: int,
                 extra: dict[str, Any]) -> dict[str, Any]:
        t, rows = self.t, self.rows
        mean = lambda key: sum(r[key] for r in rows) / len(rows) if rows else 0.0
        fill = (t.max_staleness if t.mode == "async" else 0) + 1  # steps before the pipeline is full
        steady = [r["time_step_s"] for r in rows[fill:]]
        return {
            "mode": t.mode, "max_staleness": t.max_staleness if t.mode == "async" else 0,
            "stragglers": t.stragglers if t.mode == "async" else "wait", "steps": steps,
            "replicas": self.replicas, "actor_gpus": self.actor_gpus, "loop_s": loop_s,
            "steps_per_hour": 3600.0 * steps / loop_s if loop_s > 0 else 0.0,
            # once the pipeline is full (the first S + 1 steps left out; colocate: the first): what a long run gets
            "steps_per_hour_steady": 3600.0 * len(steady) / sum(steady) if steady and sum(steady) > 0 else 0.0,
            "step_s_mean": loop_s / steps if steps else 0.0,
            "data_wait_fraction": _share(waits),
            "data_wait_fraction_steady": _share(waits[fill:]),
            "rollout_s_mean": mean("time_rollout_s"), "train_s_mean": mean("time_train_s"),
            "sync_s_mean": mean("time_sync_s"),
            "staleness_hist": {str(k): v for k, v in sorted(Counter(self.stale).items())},
            "staleness_max": max(self.stale, default=0),
            "engine_busy_share": pool.busy_s() / (loop_s * len(pool.engines)) if loop_s > 0 else 0.0,  # >= 1 running
            "engine_throughput_share": (sum(e.tokens for e in pool.engines)  # tokens made / a saturated engine's
                                        / (self.costs.generation.peak_tokens_per_s * loop_s * len(pool.engines))
                                        if loop_s > 0 else 0.0),
            **extra, "events": len(self.log.rows), "log_digest": self.log.digest(),
        }

    # -- colocate ------------------------------------------------------------------------------------------------

    async def colocate(self) -> SimResult:
        t, c, loop = self.t, self.costs, asyncio.get_running_loop()
        pool = EnginePool(self.replicas, c.generation)
        worker = SimEnvWorker(c, t.seed, pool, self.log,
                              episodes=asyncio.Semaphore(c.cluster.episode_slots or episode_slots(t)))
        actor = SimActor(c, None, SimWeights(pool, c, self.log), self.actor_gpus, self.log)
        batch = max(1, c.train.micro_batch_size // t.group_size)  # groups per micro-batch
        start = previous = loop.time()
        waits = []
        for k in range(t.steps):
            t0 = loop.time()
            self.log.add("rollout_start", step=k)
            played = await asyncio.gather(*(worker.play(self._sids(k + 1, p)) for p in range(t.prompts_per_step)))
            t1 = loop.time()
            self.log.add("rollout_end", step=k)
            await asyncio.sleep(c.sync.sleep_wake_s)
            t_sw = loop.time()
            compute = 0.0
            for i in range(0, len(played), batch):
                tokens = sum(d.tokens for draws, _, rewards in played[i:i + batch] if len(set(rewards)) > 1 for d in draws)
                compute += actor.compute_s(tokens)
            live = [len(draws) for draws, _, rewards in played if len(set(rewards)) > 1]
            compute += c.train.step_overhead_s * actor.factor
            await asyncio.sleep(compute)
            t2 = loop.time()
            self.log.add("train_end", step=k)
            await asyncio.sleep(c.sync.colocate_seconds())
            pool.set_version(k + 1)
            now = loop.time()
            self.log.add("step_done", step=k)
            self.stale.extend([0] * self._n())
            row = {"step": k + 1, "time_rollout_s": t1 - t0, "time_sleep_wake_s": t_sw - t1, "time_train_s": t2 - t_sw,
                   "time_sync_s": now - t2, "time_step_s": now - previous, "data_wait_s": t1 - t0,
                   "staleness_avg": 0.0, "staleness_max": 0, "elapsed_s": now - start,
                   "samples_consumed": self._n(), "samples_forwarded": float(sum(live)),
                   "zero_adv_group_share": 1.0 - len(live) / len(played)}
            row["data_wait_fraction"] = row["data_wait_s"] / row["time_step_s"] if row["time_step_s"] > 0 else 0.0
            self.rows.append(row)
            waits.append((row["data_wait_s"], row["time_step_s"]))
            previous = now
        n = self._n() * t.steps
        summary = self._summary(pool, loop.time() - start, waits, t.steps,
                                {"samples_produced": n, "samples_consumed": n, "samples_discarded_stale": 0,
                                 "samples_lost": 0, "samples_duplicated": 0, "samples_unconsumed": 0})
        return SimResult(self.rows, summary, self.log)

    # -- async ---------------------------------------------------------------------------------------------------

    async def asynchronous(self) -> SimResult:
        """The controller's drive (``AsyncTrainer._loop``) with a failure of any background task stopping the run
        (its ``_spawn`` / ``_supervised``)."""
        self._failure = asyncio.get_running_loop().create_future()
        main = asyncio.ensure_future(self._async_loop())
        done, _ = await asyncio.wait({main, self._failure}, return_when=asyncio.FIRST_COMPLETED)
        if main in done:
            return main.result()
        main.cancel()
        await asyncio.gather(main, return_exceptions=True)
        return self._failure.result()  # raises the background task's error

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coro)

        def report(done: asyncio.Task) -> None:
            if not done.cancelled() and done.exception() is not None and not self._failure.done():
                self._failure.set_exception(done.exception())

        task.add_done_callback(report)
        return task

    async def _async_loop(self) -> SimResult:
        t, c, loop = self.t, self.costs, asyncio.get_running_loop()
        n = self._n()
        pool = EnginePool(self.replicas, c.generation)
        bus = InProcessBus(lease_timeout=None)
        gate = StalenessGate(t.max_staleness)
        ledger = SampleLedger(t)
        slots = CarrySlots(t.prompts_per_step, t.max_staleness, first=0, end=t.steps) if t.stragglers == "carry" else None
        self.worker = SimEnvWorker(c, t.seed, pool, self.log, bus=bus, slots=slots,
                                   episodes=asyncio.Semaphore(c.cluster.episode_slots or episode_slots(t)))
        self.ledger = ledger
        advantages = AdvantagesRole(self.algorithm, bus)
        reference = SimReference(c, bus, self.actor_gpus) if c.train.ref_s_per_token > 0 else None
        actor = SimActor(c, bus, SimWeights(pool, c, self.log), self.actor_gpus, self.log)
        feeder = None
        if slots is not None:
            feeder = CarryFeeder(gate, groups_per_step=t.prompts_per_step, max_in_flight=groups_in_flight(t), first=0,
                                 end=t.steps, cursor=0, run_group=self._carried_group,
                                 seal=lambda j: bus.seal(j, n), placed=ledger.placed, discarded=ledger.discarded,
                                 spawn=self._spawn)
        launched = {k: asyncio.Event() for k in range(t.steps)}
        rollouts: dict[int, asyncio.Task] = {}
        streams: dict[int, list[asyncio.Task]] = {}

        async def launch() -> None:  # the controller's _launch
            for k in range(t.steps):
                await gate.wait_for(k)
                await bus.open_partition(k, expected_rows=n, group_size=t.group_size)
                self.log.add("step_open", step=k, trained=gate.trained)
                rollouts[k] = self._spawn(feeder.rollout(k) if feeder is not None else self._rollout(bus, k))
                calls = [advantages.process(k, n, t.group_size)]
                if reference is not None:
                    calls.append(reference.process(k, n))
                streams[k] = [self._spawn(call) for call in calls]
                launched[k].set()

        feeding = self._spawn(feeder.run()) if feeder is not None else None
        launcher = self._spawn(launch())
        start = previous = loop.time()
        waits: list[tuple[float, float]] = []
        steps_done = 0
        try:
            for k in range(t.steps):
                await launched[k].wait()
                res = await actor.train_step(k, n, t.group_size, max_staleness=t.max_staleness,
                                             with_reference=reference is not None)
                await gate.advance(k + 1)
                self.log.add("gate", trained=k + 1)
                if feeder is not None:
                    feeder.poke()
                await rollouts.pop(k)
                await asyncio.gather(*streams.pop(k))
                await bus.drop_partition(k)
                now = loop.time()
                ledger.consumed.extend(res["sample_ids"])
                self.stale.extend(res["staleness"])
                step_s = now - previous
                row = {"step": k + 1, "policy_version": res["version"], "trained_version": res["trained_version"],
                       "rollout_version_min": res["rollout_version_min"], "rollout_version_max": res["rollout_version_max"],
                       "staleness_avg": res["staleness_avg"], "staleness_max": res["staleness_max"],
                       "data_wait_s": res["data_wait_s"], "data_wait_fraction": res["data_wait_s"] / step_s if step_s > 0 else 0.0,
                       "samples_consumed": len(res["sample_ids"]), "episodes_trained": res["episodes_trained"],
                       "time_rollout_s": self._span(k), "time_train_s": res["time_train_s"],
                       "time_sync_s": res["time_sync_s"], "time_step_s": step_s, "elapsed_s": now - start}
                self.rows.append(row)
                self.log.add("step_done", step=k, consumed=len(res["sample_ids"]), wait=res["data_wait_s"])
                waits.append((row["data_wait_s"], step_s))
                previous = now
                steps_done = k + 1
        finally:
            await gate.close()
            launcher.cancel()
            others = [launcher] + ([feeding] if feeding is not None else [])
            if feeding is not None:
                feeding.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            if feeder is not None:
                await feeder.stop()
            for k in sorted(set(rollouts) | set(streams)):  # the controller's _abandon
                tasks = [x for x in [rollouts.pop(k, None), *streams.pop(k, [])] if x is not None]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        summary = self._summary(pool, loop.time() - start, waits, steps_done, {
            **ledger.figures(), "samples_lost": ledger.lost(steps_done),
            "samples_discarded_stale": len(ledger.discarded), "carry_pool_groups": groups_in_flight(t) if feeder else None})
        return SimResult(self.rows, summary, self.log)

    def _span(self, k: int) -> float:
        """Step k's rollout time: from the first start to the last end of the groups it trains on (the controller
        measures the same from the launch, or with carry from the first group's start, to the seal)."""
        first, last = self.worker.spans.pop(k, (0.0, 0.0))
        return last - first

    async def _rollout(self, bus: Any, k: int) -> dict[str, Any]:
        """The controller's ``_rollout``: every group of step k, then the seal."""
        t = self.t
        t0 = asyncio.get_running_loop().time()
        groups = await asyncio.gather(*(self.worker.run_group(k, p, [0] * t.group_size, self._sids(k + 1, p))
                                        for p in range(t.prompts_per_step)))
        await bus.seal(k, self._n())
        episodes = [e for g in groups for e in g]
        self.ledger.produced.extend(e["sample_id"] for e in episodes)
        return {"episodes": episodes, "time_rollout_s": asyncio.get_running_loop().time() - t0}

    async def _carried_group(self, i: int, born: int) -> list[dict[str, Any]]:
        """The controller's ``_carried_group``: launch i is prompt i % P of step i // P + 1 (colocate's order)."""
        t = self.t
        launch_step, prompt = divmod(i, t.prompts_per_step)
        sids = self._sids(launch_step + 1, prompt)
        answers = await self.worker.run_group(None, i, [0] * t.group_size, sids, born=born)
        if answers and answers[0]["partition"] is not None:
            self.ledger.produced.extend(sids)
        else:
            self.log.add("discard", group=i, first=sids[0], born=born)
        return answers
