"""One simulated training run on the virtual clock: colocate, async S, or async S with carried stragglers.

    result = simulate(costs, TrainerSection(mode="async", max_staleness=2, stragglers="carry", steps=20, ...))
    result.summary["steps_per_hour"], result.summary["data_wait_fraction"], result.summary["staleness_hist"]
    result.rows          # one dict per step, the keys of the controller's metrics rows
    result.log.digest()  # same costs + same trainer section (seed included) -> same digest, bit for bit

What runs for real and what is simulated (async mode, :mod:`.real_drive`):

- **real, unchanged**: the controller itself (:class:`~relax_gym.trainer.async_engine.controller.AsyncTrainer`:
  ``_supervised``, ``_loop``, ``_launch``, ``_rollout``, ``_carried_group``, ``_group``, ``_stream``, ``_step_row``,
  its sample ledger and metrics rows), recovery's ``Supervisor`` and replica registry, the staleness gate, the
  carry feeder and slots, the data bus (:class:`~relax_gym.trainer.databus.twin.InProcessBus` and its delivery
  ledger: partitions, seals, whole-group streaming micro-batches, leases, acks) and the advantages role.
- **simulated** (:mod:`.sim_roles`, timed by :mod:`.costs`): env workers, inference engines, the reference role,
  the actor's compute and the weight push, behind deployment-handle look-alikes; the controller's clocks read the
  loop's virtual time.
- not modelled: eval and checkpoint time, global restarts, Serve's random routing, CPU contention between roles,
  the lr schedule. Replica deaths and failing calls can be injected (:class:`~.real_drive.RoleFaults`).

Colocate mode has no bus and no roles: per step every engine plays the step's groups, the engines sleep and the
actor wakes (``sync.sleep_wake_s``), the actor trains on the step's micro-batches, the weights reload
(``sync.colocate_push_s``). Its data wait is the rollout (the actor has nothing to do meanwhile).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from relax_gym.trainer.config import RelaxConfig, TrainerSection
from relax_gym.trainer.plan.clock import run_virtual
from relax_gym.trainer.plan.costs import Costs
from relax_gym.trainer.plan.real_drive import (
    drive,
    engine_figures,
    episode_slots,
    groups_in_flight,
)
from relax_gym.trainer.plan.sim_roles import (
    EnginePool,
    EventLog,
    SimActor,
    SimEnvWorker,
    SimWeights,
)
from relax_gym.trainer.rollout.samples import sample_id

__all__ = ["SimResult", "episode_slots", "groups_in_flight", "simulate"]


@dataclass
class SimResult:
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    log: EventLog = field(repr=False)


def simulate(costs: Costs, trainer: TrainerSection | dict[str, Any], *, algorithm: dict[str, Any] | None = None) -> SimResult:
    """Run ``trainer.steps`` steps of ``trainer.mode`` on the virtual clock (see the module docstring).
    ``algorithm``: the advantages role's config (default GRPO)."""
    t = trainer if isinstance(trainer, TrainerSection) else TrainerSection.model_validate(trainer)
    sim = _Run(costs, t, algorithm or {})
    return run_virtual(sim.colocate()) if t.mode == "colocate" else sim.asynchronous()


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

    def _summary(self, engines: tuple[int, float, int], loop_s: float, waits: list[tuple[float, float]], steps: int,
                 extra: dict[str, Any]) -> dict[str, Any]:
        """``engines``: the engine pool's (engines, busy seconds, tokens made), read inside the loop."""
        count, busy_s, tokens = engines
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
            "engine_busy_share": busy_s / (loop_s * count) if loop_s > 0 else 0.0,  # >= 1 running
            "engine_throughput_share": (tokens  # tokens made / a saturated engine's
                                        / (self.costs.generation.peak_tokens_per_s * loop_s * count)
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
        summary = self._summary(engine_figures(pool), loop.time() - start, waits, t.steps,
                                {"samples_produced": n, "samples_consumed": n, "samples_discarded_stale": 0,
                                 "samples_lost": 0, "samples_duplicated": 0, "samples_unconsumed": 0})
        return SimResult(self.rows, summary, self.log)

    # -- async ---------------------------------------------------------------------------------------------------

    def asynchronous(self) -> SimResult:
        """The real controller on the virtual clock (:func:`~.real_drive.drive`), summarised as the planner reports
        a run."""
        cfg = RelaxConfig.model_validate({"trainer": self.t.model_dump(mode="json"), "algorithm": self.algorithm})
        res = drive(self.costs, cfg)
        topo = res.topology
        self.rows = res.rows
        self.stale = list(topo.staleness)
        loop_s = 3600.0 * res.summary["steps"] / res.summary["steps_per_hour"] if res.summary["steps_per_hour"] else 0.0
        waits = [(r["data_wait_s"], r["time_step_s"]) for r in self.rows]
        keep = ("samples_produced", "samples_consumed", "samples_duplicated", "samples_unconsumed", "samples_lost",
                "samples_discarded_stale", "restarts_level1", "restarts_level2")
        extra = {k: res.summary[k] for k in keep if k in res.summary}
        extra["carry_pool_groups"] = groups_in_flight(self.t) if self.t.stragglers == "carry" else None
        self.log = res.log
        summary = self._summary(topo.engine_figures, loop_s, waits, res.summary["steps"], extra)
        return SimResult(self.rows, summary, res.log)
