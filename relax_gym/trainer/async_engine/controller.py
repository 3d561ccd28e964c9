"""The async engine's controller (``trainer.mode: async``): builds the topology, deploys the roles with Ray Serve,
and drives the run through deployment handles.

    trainer = AsyncTrainer(cfg, run_dir)
    summary = trainer.run()          # same metrics.jsonl / TensorBoard / checkpoints / eval as ColocateTrainer
    trainer.close()

Topology (``roles:`` in the config): env workers, inference, advantages, actor (one replica), and a reference
role when ``algorithm.kl_coef > 0``; each is a Serve application of one deployment, HTTP proxy off; roles that
mostly wait reserve no CPU. Next to them the run starts small Ray actors: the DCS coordinator (the inference
replicas register their engines there; the actor pushes weights through it) and, for ``roles.bus: inprocess``, the
bus host (for ``transferqueue``, TransferQueue's own actors).

The drive, per step k (counted from 0; metrics rows use k + 1 like the colocate trainer):

1. the launcher waits on the :class:`~relax_gym.trainer.async_engine.staleness.StalenessGate` until ``k - v_trained <= S``,
   opens partition k on the bus and sends one ``run_group`` call per prompt group to the env workers (the seeds
   are the colocate trainer's, so both modes see the same prompts), plus one ``process`` call per streaming
   role (advantages, reference) for that partition;
2. the trainer loop calls ``actor.train_step(k)``, which trains on micro-batches as they become ready and
   returns once the step's weights are in the engines; then the gate advances, which may start a rollout;
3. the step's metrics are gathered from the answers (rewards and statuses from the env workers, group counts from
   the advantages role, losses, staleness and data wait from the actor), evaluated / checkpointed on the same
   schedule as colocate, and written in step order.

Every call is awaited; nothing polls. The controller keeps a ledger of sample ids: produced (answered by env
workers) and consumed (named by the actor), reported in the summary (``samples_produced``,
``samples_consumed``, ``samples_duplicated``, ``samples_unconsumed``, ``samples_lost``).

Recovery (:mod:`~relax_gym.trainer.async_engine.recovery`; docs/architecture.md, "Recovery"). Level 1: Serve health-checks and
replaces a failed replica in place; the controller re-sends the calls it lost (a group to the env workers, a
streaming call to the advantages / reference role after giving the dead call's bus leases of that partition back),
an inference replica fetches the current weights through the actor before serving, env workers resend engine
calls. Level 2: when the actor dies, or a role is replaced more than ``roles.restart_budget`` times, the whole
topology is torn down and started again from the last checkpoint (weights, optimizer, random states, data cursor,
the sample ledger; metrics.jsonl rewound to it); ``relax-gym train --resume RUN_DIR`` does the same by hand.
Faults (``faults:``) are fired when a step's rollout starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.trainer.databus.link import BusHost, BusLink
from relax_gym.trainer.async_engine.carry import CarryFeeder, CarrySlots, claim_slot
from relax_gym.trainer.run.checkpoint import REFERENCE_DIR, CheckpointError, ResumePoint, eval_history, resume_point
from relax_gym.trainer.config import RelaxConfig, RoleSection
from relax_gym.trainer.engines.factory import weight_transport
from relax_gym.trainer.faults.schedule import FaultSchedule
from relax_gym.trainer.run.lr_schedule import DecayGate, progress
from relax_gym.trainer.run.metrics import MetricsWriter
from relax_gym.trainer.policy.moe import routing_dims
from relax_gym.trainer.async_engine.recovery import (GlobalRestart, RecoveryError, ReplicaRegistry, Supervisor, is_replica_failure,
                                        kill_replica, sample_step)
from relax_gym.trainer.rollout.samples import masked_row, sample_id
from relax_gym.trainer.async_engine.staleness import StalenessGate
from relax_gym.trainer.dcs.service import start_coordinator

__all__ = ["AsyncTrainer", "RoleSpec", "plan_roles"]

log = logging.getLogger(__name__)

GROUP_ATTEMPTS = 3  # a group whose env worker fails is re-sent (to any replica) this many times in all
EVAL_CHUNK = 8  # eval episodes per env-worker call


@dataclass
class RoleSpec:
    """One role to deploy: its class (imported by path in the replica), constructor arguments and sizing."""

    name: str
    cls_path: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    section: RoleSection = field(default_factory=RoleSection)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_roles(cfg: RelaxConfig, bus: Any, coordinator: Any, app_prefix: str, *, registry: Any = None,
               resume_from: str | None = None, slots: Any = None) -> list[RoleSpec]:
    """The deployments of an async run, from the config (pure: no Ray calls). ``registry``: the replica registry
    every role announces itself to; ``resume_from``: the checkpoint the actor starts from; ``slots``: the run's
    carry slots (``trainer.stragglers: carry``), given to the env workers."""
    t, roles = cfg.trainer, cfg.roles
    plain = cfg.model_dump(mode="json")
    per_step = t.prompts_per_step * t.group_size
    in_flight = min(t.concurrency, per_step)  # colocate's per-step budget: all that carried stragglers keep running
    if t.stragglers == "wait":
        in_flight *= t.max_staleness + 1  # S + 1 steps at once
    workers = roles.env_worker.replicas
    specs = [
        RoleSpec("inference", "relax_gym.trainer.async_engine.roles.inference:InferenceRole", (plain["model"], plain["inference"]),
                 {"coordinator": coordinator, "torch_threads": roles.inference.torch_threads}, roles.inference),
        RoleSpec("env_worker", "relax_gym.trainer.async_engine.roles.env_worker:EnvWorkerRole", (plain, bus, f"{app_prefix}-inference"),
                 {"pool_size": _ceil_div(in_flight, workers), "eval_pool_size": _ceil_div(min(t.concurrency, t.eval_episodes), workers),
                  "torch_threads": roles.env_worker.torch_threads, "slots": slots}, roles.env_worker),
        RoleSpec("advantages", "relax_gym.trainer.async_engine.roles.advantages:AdvantagesRole", (plain["algorithm"], bus), {}, roles.advantages),
        RoleSpec("actor", "relax_gym.trainer.async_engine.roles.actor:ActorRole", (plain, bus, coordinator),
                 {"torch_threads": roles.actor.torch_threads}, roles.actor),
    ]
    if cfg.algorithm.kl_coef > 0:
        specs.append(RoleSpec("reference", "relax_gym.trainer.async_engine.roles.reference:ReferenceRole", (plain, bus),
                              {"torch_threads": roles.reference.torch_threads}, roles.reference))
    for spec in specs:  # recovery: restart counts, late inference replicas catching up, the actor's checkpoint
        spec.kwargs["registry"] = registry
        if spec.name == "inference":
            spec.kwargs["actor_app"] = f"{app_prefix}-actor"
        if spec.name == "actor":
            spec.kwargs["resume_from"] = resume_from
    return specs


def _import(path: str) -> type:
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def ensure_ray(cfg: RelaxConfig) -> bool:
    """Start a local Ray instance unless one is running (tests start their own); True when this call started it.
    Logical CPUs: the machine's, or what the roles reserve plus room for Serve's own actors if that is more.
    With ``RAY_ADDRESS`` set (``auto`` or ``host:port``), join that cluster instead: its nodes bring their own
    CPUs and GPUs."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("TQ_NUM_THREADS", "2")
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False, configure_logging=False, namespace="relax-gym")
        return True
    r = cfg.roles
    reserved = sum(s.num_cpus * s.replicas for s in (r.env_worker, r.inference, r.reference, r.advantages, r.actor))
    ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(reserved) + 4), include_dashboard=False,
             log_to_driver=False, configure_logging=False, namespace="relax-gym")
    return True


class AsyncTrainer:
    """The async-mode counterpart of :class:`~relax_gym.trainer.colocate.ColocateTrainer` (same constructor, same
    ``run`` / ``close``, same run-directory layout)."""

    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, progress=None, resume: bool = False) -> None:
        """``resume``: continue ``run_dir`` from its latest checkpoint (``relax-gym train --resume``)."""
        if cfg.trainer.mode != "async":
            raise ValueError(f"AsyncTrainer needs trainer.mode=async (got {cfg.trainer.mode!r}); use ColocateTrainer")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resume: ResumePoint | None = resume_point(self.run_dir, cfg.trainer) if resume else None  # rewinds metrics
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        self.progress = progress or (lambda event, data: None)
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.metrics.tensorboard,
                                     purge_step=self.resume.step + 1 if self.resume else None)
        self.faults = FaultSchedule(cfg.faults, self.run_dir)
        self.supervisor: Supervisor | None = None
        self.level1: Counter[str] = Counter()  # replicas replaced in topologies already torn down, by role
        self.level2 = 0  # global restarts
        self.given_up: list[str] = []  # samples masked because their env worker never answered
        self.regenerated = 0  # samples produced after a checkpoint and discarded by a global restart
        self.restarted_from: list[int] = []  # the checkpoint step each global restart resumed from
        self._side_tasks: list[asyncio.Task] = []  # fault injections in flight
        self._failure: asyncio.Future | None = None  # the first failure of a background task (see _spawn)
        self.prefix = f"relax-{uuid.uuid4().hex[:8]}"
        self.handles: dict[str, Any] = {}
        self.apps: list[str] = []
        self.actors: list[Any] = []
        self.bus: Any = None
        self.version = 0
        self.base_version = 0
        self.produced: list[str] = []
        self.consumed: list[str] = []
        self.placed: dict[str, int] = {}  # stragglers: carry — the partition each produced sample joined
        self.discarded: list[str] = []  # stragglers: carry — samples too stale for any partition (never put)
        self.carry_cursor = 0  # stragglers: carry — groups launched so far (the next launch number)
        self.feeder: CarryFeeder | None = None
        self._restore_ledger()
        self._tq_owner: Any = None
        self._started_ray = False
        self._closed = False

    # -- deployment --------------------------------------------------------------------------------------------

    def _start(self) -> None:
        from ray import serve
        from ray.serve.api import RunTarget

        serve.start(proxy_location="Disabled")
        import ray

        coordinator = start_coordinator(f"{self.prefix}-dcs", transport=weight_transport(self.cfg.inference))
        self.actors.append(coordinator)
        link = self._bus_link()
        r = self.cfg.roles
        replicas = {"env_worker": r.env_worker.replicas, "inference": r.inference.replicas, "advantages": r.advantages.replicas,
                    "actor": 1, **({"reference": r.reference.replicas} if self.cfg.algorithm.kl_coef > 0 else {})}
        registry = ray.remote(num_cpus=0)(ReplicaRegistry).options(name=f"{self.prefix}-replicas").remote(replicas)
        self.actors.append(registry)
        self.supervisor = Supervisor(registry, budget=r.restart_budget, wait_s=r.replica_wait_s)
        resume_from = str(self.resume.path) if self.resume is not None and self.resume.path is not None else None
        self.slots = None
        t = self.cfg.trainer
        if t.stragglers == "carry":
            first = self.resume.step if self.resume is not None else 0
            self.slots = ray.remote(num_cpus=0)(CarrySlots).options(name=f"{self.prefix}-slots").remote(
                t.prompts_per_step, t.max_staleness, first=first, end=t.steps)
            self.actors.append(self.slots)
        specs = plan_roles(self.cfg, link, coordinator, self.prefix, registry=registry, resume_from=resume_from,
                           slots=self.slots)
        targets = []
        for spec in specs:
            s = spec.section
            deployment = serve.deployment(
                _import(spec.cls_path), name=spec.name, num_replicas=s.replicas, max_ongoing_requests=s.max_ongoing_requests,
                ray_actor_options={"num_cpus": s.num_cpus, "num_gpus": s.num_gpus}, health_check_period_s=r.health_check_period_s,
                health_check_timeout_s=max(60.0, 2 * r.health_check_period_s),
                graceful_shutdown_timeout_s=5.0, logging_config={"log_level": "WARNING", "enable_access_log": False})
            app = f"{self.prefix}-{spec.name}"
            targets.append(RunTarget(deployment.bind(*spec.args, **spec.kwargs), name=app, route_prefix=None))
            self.apps.append(app)
        handles = serve.run_many(targets)
        self.handles = {spec.name: handle for spec, handle in zip(specs, handles)}
        self.bus = link.connect()

    def _bus_link(self) -> BusLink:
        import ray

        kind = self.cfg.roles.bus
        if kind == "inprocess":
            host = ray.remote(num_cpus=0)(BusHost).options(name=f"{self.prefix}-bus", max_concurrency=100_000).remote()
            self.actors.append(host)
            return BusLink("hosted", host=host)
        from relax_gym.trainer.databus import make_bus

        # TransferQueue's actors start once per Ray session (or are reused); the run's rows live in its own scope
        # (a new one after a global restart, while the actors started first stay up)
        if self._tq_owner is None:
            self._tq_owner = make_bus("transferqueue", start=True, scope=self.prefix)
        return BusLink("transferqueue", options={"scope": self.prefix})

    # -- the run -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._started_ray = ensure_ray(self.cfg)  # in the main thread: Ray installs its signal handlers there
        return asyncio.run(self._run())

    async def _run(self) -> dict[str, Any]:
        try:
            while True:
                try:
                    await asyncio.to_thread(self._start)
                    return await self._supervised(self._loop())
                except GlobalRestart as exc:
                    await self._global_restart(exc)
        finally:
            await self._close_bus()

    async def _close_bus(self) -> None:
        """The controller's bus connection, then (for TransferQueue) the actors this run started."""
        bus, self.bus = self.bus, None
        owner, self._tq_owner = self._tq_owner, None
        for one in (bus, owner):
            if one is not None:
                try:
                    await one.close()
                except Exception:  # noqa: BLE001 - never mask the run's own error
                    log.warning("closing the data bus failed", exc_info=True)

    async def _loop(self) -> dict[str, Any]:
        cfg, t = self.cfg, self.cfg.trainer
        start = time.perf_counter()
        actor = self.handles["actor"]
        resumed = self.resume.state if self.resume is not None else None  # None: from the start (warm-up, eval)
        warm = await self._actor(lambda: actor.warmup.remote(), "the warm-up")
        for i, row in enumerate(warm["rows"]):
            self.progress("sft", {"step": i + 1, "of": t.sft_warmup_steps, **row})
            self.metrics.write(-t.sft_warmup_steps + i, row)
        self.version = self.base_version = int(warm["version"])
        self.reference_path = None
        if "reference" in self.handles:
            ref = self.run_dir / REFERENCE_DIR
            if resumed is None:
                self.reference_path = await self._actor(lambda: actor.save_reference.remote(str(ref)), "saving the reference")
            elif not (ref / "config.json").is_file():
                raise CheckpointError(f"{ref}: the run's reference policy is missing; it cannot resume with kl_coef > 0")
            else:
                self.reference_path = str(ref)
        if resumed is None:
            last_eval = first_eval = await self._evaluate()
            self.metrics.write(0, {**last_eval, "policy_version": self.version})
            self.progress("eval", {"step": 0, **last_eval})
        else:  # continue after the checkpoint: its step, its clock
            last_eval, first_eval = eval_history(self.run_dir)
            start -= float(resumed.extra.get("elapsed_s", resumed.elapsed_s))
        summary: dict[str, Any] = {"eval_reward_start": first_eval["eval_reward"], "eval_accuracy_start": first_eval["eval_accuracy"]}
        first = resumed.step if resumed is not None else 0
        gate = StalenessGate(t.max_staleness, trained=first)
        launched: dict[int, asyncio.Event] = {k: asyncio.Event() for k in range(first, t.steps)}
        rollouts: dict[int, asyncio.Task] = {}
        streams: dict[int, list[asyncio.Task]] = {}
        if t.stragglers == "carry":
            self.feeder = CarryFeeder(gate, groups_per_step=t.prompts_per_step, max_in_flight=self._groups_in_flight(),
                                      first=first, end=t.steps, cursor=max(self.carry_cursor, first * t.prompts_per_step),
                                      run_group=self._carried_group, seal=lambda j: self.bus.seal(j, self._rows_per_step()),
                                      placed=self.placed, discarded=self.discarded, spawn=self._spawn)
        feeder = self._spawn(self.feeder.run()) if self.feeder is not None else None
        launcher = self._spawn(self._launch(gate, launched, rollouts, streams, first))
        loop_start = time.perf_counter()
        previous = loop_start
        steps_done, waits = first, []
        self._start_time = start
        try:
            for k in range(first, t.steps):
                await launched[k].wait()
                res = await self._actor(lambda: actor.train_step.remote(
                    k, self._rows_per_step(), t.group_size, max_staleness=t.max_staleness,
                    with_reference="reference" in self.handles, lr_decay_from=self.lr_gate.decay_from), f"step {k + 1}")
                self.version = int(res["version"])
                await gate.advance(k + 1)
                if self.feeder is not None:
                    self.feeder.poke()
                roll = await rollouts.pop(k)
                stream_answers = await asyncio.gather(*streams.pop(k))
                await self.bus.drop_partition(k)
                now = time.perf_counter()
                row = self._step_row(k, res, roll, stream_answers[0], step_s=now - previous, elapsed=now - start)
                previous = now
                steps_done = k + 1
                waits.append((row["data_wait_s"], row["time_step_s"]))
                self.lr_gate.observe(row["reward_mean"], progress(steps_done, t.steps, now - start, t.time_budget_s))
                over_budget = t.time_budget_s is not None and time.perf_counter() - start > t.time_budget_s
                if steps_done % t.eval_every == 0 or steps_done == t.steps or over_budget:
                    last_eval = await self._evaluate()
                    row.update(last_eval)
                self.metrics.write(steps_done, row)
                self.progress("step", {"step": steps_done, "of": t.steps, **row, "eval_reward": last_eval["eval_reward"]})
                if steps_done % t.checkpoint_every == 0 or steps_done == t.steps:
                    await self._checkpoint(steps_done)
                if over_budget:
                    if steps_done % t.checkpoint_every and steps_done != t.steps:
                        await self._checkpoint(steps_done)
                    break
        finally:
            await gate.close()
            launcher.cancel()
            for task in self._side_tasks + ([feeder] if feeder is not None else []):
                task.cancel()
            await asyncio.gather(launcher, *self._side_tasks, *([feeder] if feeder is not None else []), return_exceptions=True)
            if self.feeder is not None:
                await self.feeder.stop()
            await self._abandon(rollouts, streams)
        loop_s = time.perf_counter() - loop_start
        dup = sum(n - 1 for n in Counter(self.consumed).values() if n > 1)
        summary.update({
            "eval_reward_end": last_eval["eval_reward"], "eval_accuracy_end": last_eval["eval_accuracy"],
            "steps": steps_done, "elapsed_s": time.perf_counter() - start, "mode": "async", "max_staleness": t.max_staleness,
            "steps_per_hour": 3600.0 * (steps_done - first) / loop_s if loop_s > 0 else 0.0,
            "data_wait_fraction": _share(waits),  # actor waiting for data / wall time of its steps
            "data_wait_fraction_steady": _share(waits[t.max_staleness + 1 :]),  # once the pipeline is full
            "samples_produced": len(self.produced), "samples_consumed": len(self.consumed), "samples_duplicated": dup,
            "samples_unconsumed": len(set(self.produced) - set(self.consumed)), "policy_version": self.version,
            "stragglers": t.stragglers, "samples_discarded_stale": len(self.discarded),
            **await self._recovery_figures(steps_done),
        })
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _rows_per_step(self) -> int:
        return self.cfg.trainer.prompts_per_step * self.cfg.trainer.group_size

    async def _launch(self, gate: StalenessGate, launched: dict[int, asyncio.Event], rollouts: dict[int, asyncio.Task],
                      streams: dict[int, list[asyncio.Task]], first: int = 0) -> None:
        """Start each step's rollout (and its streaming consumers) as soon as the staleness gate allows, then fire
        the faults due at that step."""
        t = self.cfg.trainer
        n = self._rows_per_step()
        for k in range(first, t.steps):
            await gate.wait_for(k)
            await self.bus.open_partition(k, expected_rows=n, group_size=t.group_size)
            rollouts[k] = self._spawn(self.feeder.rollout(k) if self.feeder is not None else self._rollout(k))
            calls = [self._stream("advantages", k, lambda k=k: self.handles["advantages"].process.remote(k, n, t.group_size))]
            if "reference" in self.handles:
                calls.append(self._stream("reference", k, lambda k=k: self.handles["reference"].process.remote(k, n, self.reference_path)))
            streams[k] = [self._spawn(c) for c in calls]
            launched[k].set()
            if self.faults.section.inject:
                self._side_tasks.append(self._spawn(self._inject(k)))

    async def _rollout(self, k: int) -> dict[str, Any]:
        t = self.cfg.trainer
        t0 = time.perf_counter()
        base_seed = t.seed * 10_000_019 + (k + 1) * 1_000  # the colocate trainer's seeds for step k + 1
        groups = await asyncio.gather(*(self._group(k, p, base_seed + p) for p in range(t.prompts_per_step)))
        await self.bus.seal(k, self._rows_per_step())
        episodes = [e for g in groups for e in g]
        self.produced.extend(e["sample_id"] for e in episodes)
        return {"episodes": episodes, "time_rollout_s": time.perf_counter() - t0}

    def _groups_in_flight(self) -> int:
        """Carry: groups kept running — colocate's per-step budget of episodes (``trainer.concurrency``, at most a
        step's worth), refilled as groups end. Not S + 1 steps' worth: every running group competes for the same
        engine, and a deeper queue makes each group slower, so more of them end too stale (docs/benchmarks.md)."""
        t = self.cfg.trainer
        return max(1, min(t.concurrency, self._rows_per_step()) // t.group_size)

    async def _carried_group(self, i: int, born: int) -> list[dict[str, Any]]:
        """Launch number i of a carry run: the colocate trainer's prompt order (step i // P + 1, prompt i % P), its
        sample ids; the group claims its partition when it ends."""
        t = self.cfg.trainer
        launch_step, prompt = divmod(i, t.prompts_per_step)
        seed = t.seed * 10_000_019 + (launch_step + 1) * 1_000 + prompt
        sids = [sample_id(launch_step + 1, prompt, m) for m in range(t.group_size)]
        answers = await self._group(None, i, seed, sids=sids, born=born)
        if answers and answers[0]["partition"] is not None:
            self.produced.extend(sids)
        return answers

    async def _group(self, k: int | None, group: int, seed: int, *, sids: list[str] | None = None,
                     born: int | None = None) -> list[dict[str, Any]]:
        """One group on the env workers (re-sent on failure), its rows on partition k — or, for a carried group
        (k None), on the partition it claims when it ends."""
        t = self.cfg.trainer
        sids = sids or [sample_id(k + 1, group, m) for m in range(t.group_size)]
        what = f"step {k + 1} group {group}" if k is not None else f"group {sids[0][:-3]}"
        error: Exception | None = None
        for attempt in range(GROUP_ATTEMPTS):
            try:  # a replica dying under the call: the supervisor re-sends it once Serve has replaced the replica
                return await self.supervisor.call("env_worker", lambda: self.handles["env_worker"].run_group.remote(
                    k, group, [seed] * t.group_size, sids, born=born), what)
            except GlobalRestart:
                raise
            except Exception as exc:  # noqa: BLE001 - the call itself failed: try again, then mask the group
                error = exc
                log.warning("%s: env worker call failed (attempt %d of %d): %s", what, attempt + 1, GROUP_ATTEMPTS, exc)
        routing = routing_dims(self.cfg.model)
        if k is None:  # carried: the masked rows take the slot the group would have claimed
            k = await claim_slot(self.slots, sids[0], born)
        if k is not None:
            await self.bus.put(k, [masked_row(sid, group, seed, routing) for sid in sids])  # the step completes without them
            self.given_up.extend(sids)
        return [{"sample_id": sid, "group_id": group, "reward": 0.0, "status": "env_error", "trainable": False, "accuracy": 0.0,
                 "format": 0.0, "completion_tokens": 0, "turns": 0, "tool_calls": 0, "error": f"{type(error).__name__}: {error}",
                 "policy_versions": [], "partition": k} for sid in sids]

    async def _abandon(self, rollouts: dict[int, asyncio.Task], streams: dict[int, list[asyncio.Task]]) -> None:
        """A stopped run (time budget, failure): cancel the steps still in flight and drop their partitions (their
        samples were produced for steps that will not be trained; the summary counts them as unconsumed)."""
        for k in sorted(set(rollouts) | set(streams)):
            tasks = [t for t in [rollouts.pop(k, None), *streams.pop(k, [])] if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self.bus.drop_partition(k)
            except Exception:  # noqa: BLE001 - best effort while stopping
                log.debug("dropping partition %d failed", k, exc_info=True)

    def _step_row(self, k: int, res: dict[str, Any], roll: dict[str, Any], adv: dict[str, int], *, step_s: float,
                  elapsed: float) -> dict[str, Any]:
        episodes = roll["episodes"]
        self.consumed.extend(res["sample_ids"])
        ok = [e for e in episodes if e["status"] not in ("env_error", "engine_error")]
        statuses = Counter(e["status"] for e in episodes)
        valid = sum(1 for e in episodes if e["trainable"])
        row: dict[str, Any] = {"episodes_masked": len(episodes) - valid}
        if valid:
            row["zero_adv_group_share"] = adv["zero_adv_groups"] / max(adv["valid_groups"], 1)
            row["episodes_trained"] = res["episodes_trained"]
        row.update(res["metrics"])
        completion = sum(e["completion_tokens"] for e in episodes)
        row.update({
            "reward_mean": float(np.mean([e["reward"] for e in ok])) if ok else 0.0,
            "accuracy_mean": float(np.mean([e["accuracy"] for e in ok])) if ok else 0.0,
            "format_mean": float(np.mean([e["format"] for e in ok])) if ok else 0.0,
            **{f"status_{s}": n for s, n in statuses.items()},
            "policy_version": res["version"], "trained_version": res["trained_version"],
            "rollout_version_min": res["rollout_version_min"], "rollout_version_max": res["rollout_version_max"],
            "staleness_avg": res["staleness_avg"], "staleness_max": res["staleness_max"],
            "data_wait_s": res["data_wait_s"], "data_wait_fraction": res["data_wait_s"] / step_s if step_s > 0 else 0.0,
            "partial_groups": res["partial_groups"], "samples_consumed": len(res["sample_ids"]),
            "time_rollout_s": roll["time_rollout_s"], "time_train_s": res["time_train_s"], "time_sync_s": res["time_sync_s"],
            "time_step_s": step_s, "rollout_tokens_per_s": completion / max(roll["time_rollout_s"], 1e-9),
            "elapsed_s": elapsed,
        })
        return row

    async def _evaluate(self) -> dict[str, float]:
        """The colocate trainer's eval: greedy episodes on the eval split, seeds 500000 + i."""
        n = self.cfg.trainer.eval_episodes
        seeds = [500_000 + i for i in range(n)]
        worker = self.handles["env_worker"]
        chunks = [seeds[i : i + EVAL_CHUNK] for i in range(0, n, EVAL_CHUNK)]
        answers = await asyncio.gather(*(self.supervisor.call("env_worker", lambda c=c: worker.evaluate.remote(c), "eval")
                                         for c in chunks))
        trajs = [e for a in answers for e in a]
        ok = [e for e in trajs if e["status"] not in ("env_error", "engine_error")]
        return {
            "eval_reward": float(np.mean([e["reward"] for e in ok])) if ok else 0.0,
            "eval_accuracy": float(np.mean([e["accuracy"] for e in ok])) if ok else 0.0,
            "eval_format": float(np.mean([e["format"] for e in ok])) if ok else 0.0,
            "eval_failed": len(trajs) - len(ok),
            "eval_tool_calls": float(np.mean([e["tool_calls"] for e in ok])) if ok else 0.0,
            "eval_policy_version": self.version,
        }

    # -- recovery ------------------------------------------------------------------------------------------------

    async def _supervised(self, main: Any) -> dict[str, Any]:
        """Run the training loop until it returns, a background task fails, or the supervisor's watch asks for a
        global restart; the loop is cancelled (its steps in flight abandoned) in the last two cases."""
        self._failure = asyncio.get_running_loop().create_future()
        loop_task = asyncio.ensure_future(main)
        assert self.supervisor is not None
        watch = asyncio.ensure_future(self.supervisor.watch())
        try:
            done, _ = await asyncio.wait({loop_task, watch, self._failure}, return_when=asyncio.FIRST_COMPLETED)
            if loop_task in done:
                return loop_task.result()
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
            for stopped in (self._failure, watch):
                if stopped in done:
                    stopped.result()  # raises what stopped the run
            raise RuntimeError("the supervised loop stopped without a cause")  # pragma: no cover
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    def _spawn(self, coro: Any) -> asyncio.Task:
        """A background task of the loop (a rollout, a streaming call, a fault) whose failure stops the run at once
        instead of leaving the actor waiting for data that will not come."""
        task = asyncio.ensure_future(coro)

        def report(done: asyncio.Task) -> None:
            if not done.cancelled() and done.exception() is not None and self._failure is not None and not self._failure.done():
                self._failure.set_exception(done.exception())

        task.add_done_callback(report)
        return task

    async def _actor(self, call: Any, what: str) -> Any:
        """A call to the actor; its replica dying means a global restart (its training state is gone)."""
        assert self.supervisor is not None
        return await self.supervisor.call("actor", call, what)

    async def _stream(self, role: str, k: int, call: Any) -> Any:
        """A streaming role's call for partition k. If its replica dies, the rows it had fetched and not acked are
        given back (its bus task is the role's name) and the call is sent again once Serve has replaced it: rows
        the dead call finished stay done, the others are processed once."""
        assert self.supervisor is not None

        async def once() -> Any:
            try:
                return await call()
            except Exception as exc:
                if is_replica_failure(exc) and self.bus is not None:
                    freed = await self.bus.release_task(role, k)
                    log.warning("step %d: a %s replica died; %d leased row(s) given back", k + 1, role, freed)
                raise

        return await self.supervisor.call(role, once, f"step {k + 1} {role}")

    async def _inject(self, k: int) -> None:
        """Fire the faults due when step k + 1 starts (``faults:``)."""
        for fault in self.faults.due(k + 1):
            spec = fault.spec
            if spec.kind == "kill":
                if spec.delay_s:
                    await asyncio.sleep(spec.delay_s)
                self.faults.record(fault, topology=self.prefix)  # first: a replayed step must not fire it again
                rng = random.Random(f"{self.cfg.faults.seed}:{k + 1}:{spec.role}")
                name = await asyncio.to_thread(kill_replica, f"{self.prefix}-{spec.role}", spec.role, rng)
                log.warning("fault injection: killed %s at step %d", name, k + 1)
            else:
                role = "inference" if spec.kind == "engine_error" else "env_worker"
                await self.handles[role].arm_fault.remote(spec.kind, spec.count)
                self.faults.record(fault, topology=self.prefix)

    async def _checkpoint(self, step: int) -> None:
        """The actor writes the checkpoint; the controller adds its sample ledger, the bus cursor and its clock.
        Rows of partitions after ``step`` are not saved: a resumed run regenerates them from their seeds, under
        the same sample ids."""
        keep = lambda ids: [s for s in ids if self._trained_at(s) <= step]  # noqa: E731
        extra = {"produced": keep(self.produced), "consumed": keep(self.consumed), "given_up": keep(self.given_up),
                 "bus": {"next_partition": step, "partitions_done": step}, "lr_gate": self.lr_gate.state(),
                 "elapsed_s": time.perf_counter() - getattr(self, "_start_time", time.perf_counter())}
        if self.feeder is not None:  # carry: where each kept sample went, and the launch cursor (groups still
            # running or placed after this step are not resumed: a resumed run launches from the cursor on)
            extra["carry"] = {"cursor": self.feeder.cursor, "discarded": list(self.discarded),
                              "placed": {sid: j for sid, j in self.placed.items() if j < step}}
        actor = self.handles["actor"]
        await self._actor(lambda: actor.checkpoint.remote(step, str(self.run_dir), extra), f"checkpoint {step}")

    def _restore_ledger(self) -> None:
        """The sample ledger as the checkpoint being resumed saved it (empty when starting over)."""
        state = self.resume.state if self.resume is not None else None
        extra = state.extra if state is not None else {}
        dropped = [s for s in self.produced if state is None or self._trained_at(s) > state.step]
        self.regenerated += len(dropped)
        self.produced = list(extra.get("produced", []))
        self.consumed = list(extra.get("consumed", []))
        self.given_up = list(extra.get("given_up", []))
        carry = extra.get("carry", {})
        self.placed = {sid: int(j) for sid, j in carry.get("placed", {}).items()}
        self.discarded = list(carry.get("discarded", []))
        self.carry_cursor = int(carry.get("cursor", 0))
        a = self.cfg.actor
        self.lr_gate = DecayGate.from_state(extra.get("lr_gate"), a.lr_hold_until_reward, a.lr_hold_window)  # when the lr decay starts

    def _trained_at(self, sid: str) -> int:
        """The step (from 1) that trains sample ``sid``: its launch step, or with carried stragglers the partition
        it joined."""
        j = self.placed.get(sid)
        return j + 1 if j is not None else sample_step(sid)

    async def _global_restart(self, cause: GlobalRestart) -> None:
        """Level 2: tear the topology down and prepare to start it again from the latest checkpoint."""
        self.level2 += 1
        limit = self.cfg.roles.max_global_restarts
        if self.level2 > limit:
            raise RecoveryError(f"{cause}; the run already restarted {limit} time(s) (roles.max_global_restarts)") from cause
        log.warning("global restart %d (of at most %d): %s", self.level2, limit, cause)
        self.progress("restart", {"level": 2, "reason": str(cause)})
        await self._count_level1()
        await self._teardown()
        self.metrics.close()
        self.resume = resume_point(self.run_dir, self.cfg.trainer)  # rewinds metrics.jsonl to the checkpoint
        self.restarted_from.append(self.resume.step)
        self.metrics = MetricsWriter(self.run_dir, tensorboard=self.cfg.metrics.tensorboard, purge_step=self.resume.step + 1)
        self._restore_ledger()
        self.prefix = f"relax-{uuid.uuid4().hex[:8]}"

    async def _count_level1(self) -> None:
        """Add the current topology's replaced replicas to the run's level-1 count (before it is torn down)."""
        if self.supervisor is not None:
            try:
                self.level1.update(await self.supervisor.restarts())
            except Exception:  # noqa: BLE001 - the registry is gone with the topology
                log.debug("reading the replica registry failed", exc_info=True)
            self.supervisor = None

    async def _teardown(self) -> None:
        """Delete this topology's Serve applications and Ray actors (the TransferQueue actors stay up)."""
        import ray
        from ray import serve

        bus, self.bus = self.bus, None
        if bus is not None:
            try:
                await bus.close()
            except Exception:  # noqa: BLE001 - the bus may be gone with the topology
                log.debug("closing the bus connection failed", exc_info=True)
        apps, self.apps = self.apps, []

        def delete(app: str) -> None:
            try:
                serve.delete(app, _blocking=True)  # returns once its replicas are gone (their CPUs free again)
            except Exception:  # noqa: BLE001 - best effort
                log.debug("deleting %s failed", app, exc_info=True)

        await asyncio.gather(*(asyncio.to_thread(delete, app) for app in apps))
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors, self.handles, self._side_tasks = [], {}, []

    async def _recovery_figures(self, steps_done: int) -> dict[str, Any]:
        """Restarts by level, faults fired, and samples lost: ids the run should have trained (every step done)
        that the actor never consumed, or that were masked because their env worker never answered."""
        level1 = Counter(self.level1)
        if self.supervisor is not None:
            level1.update(await self.supervisor.restarts())
        t = self.cfg.trainer
        if t.stragglers == "carry":  # the samples placed in the steps done
            expected = {sid for sid, j in self.placed.items() if j < steps_done}
        else:
            expected = {sample_id(s, g, m) for s in range(1, steps_done + 1) for g in range(t.prompts_per_step)
                        for m in range(t.group_size)}
        lost = expected - set(self.consumed) | (set(self.given_up) & expected)
        return {"restarts_level1": {r: n for r, n in sorted(level1.items()) if n}, "restarts_level2": self.level2,
                "restarted_from_steps": list(self.restarted_from),
                "faults_injected": self.faults.counts(), "samples_lost": len(lost), "samples_regenerated": self.regenerated}

    # -- teardown ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.metrics.close()
        try:
            import ray
            from ray import serve

            if ray.is_initialized():
                for app in self.apps:
                    try:
                        serve.delete(app, _blocking=False)
                    except Exception:  # noqa: BLE001 - best effort
                        log.debug("deleting %s failed", app, exc_info=True)
                if self.bus is not None or self._tq_owner is not None:  # the run never got to close them
                    asyncio.run(self._close_bus())
                for actor in self.actors:
                    ray.kill(actor)
                if self._started_ray:
                    serve.shutdown()
                    ray.shutdown()
        except Exception:  # noqa: BLE001 - never mask the run's own error
            log.warning("async engine teardown failed", exc_info=True)


def _share(pairs: list[tuple[float, float]]) -> float:
    total = sum(step for _, step in pairs)
    return sum(wait for wait, _ in pairs) / total if total > 0 else 0.0
