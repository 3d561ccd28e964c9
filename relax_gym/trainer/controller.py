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

1. the launcher waits on the :class:`~relax_gym.trainer.staleness.StalenessGate` until ``k - v_trained <= S``,
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
``samples_consumed``, ``samples_duplicated``, ``samples_unconsumed``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from relax_gym.trainer.bus_link import BusHost, BusLink
from relax_gym.trainer.config import RelaxConfig, RoleSection
from relax_gym.trainer.metrics import MetricsWriter
from relax_gym.trainer.samples import masked_row, sample_id
from relax_gym.trainer.staleness import StalenessGate
from relax_gym.trainer.weights import start_coordinator

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


def plan_roles(cfg: RelaxConfig, bus: Any, coordinator: Any, app_prefix: str) -> list[RoleSpec]:
    """The deployments of an async run, from the config (pure: no Ray calls)."""
    t, roles = cfg.trainer, cfg.roles
    plain = cfg.model_dump(mode="json")
    per_step = t.prompts_per_step * t.group_size
    in_flight = min(t.concurrency, per_step) * (t.max_staleness + 1)  # colocate's per-step budget, S + 1 steps at once
    workers = roles.env_worker.replicas
    specs = [
        RoleSpec("inference", "relax_gym.trainer.roles.inference:InferenceRole", (plain["model"], plain["inference"]),
                 {"coordinator": coordinator, "torch_threads": roles.inference.torch_threads}, roles.inference),
        RoleSpec("env_worker", "relax_gym.trainer.roles.env_worker:EnvWorkerRole", (plain, bus, f"{app_prefix}-inference"),
                 {"pool_size": _ceil_div(in_flight, workers), "eval_pool_size": _ceil_div(min(t.concurrency, t.eval_episodes), workers),
                  "torch_threads": roles.env_worker.torch_threads}, roles.env_worker),
        RoleSpec("advantages", "relax_gym.trainer.roles.advantages:AdvantagesRole", (plain["algorithm"], bus), {}, roles.advantages),
        RoleSpec("actor", "relax_gym.trainer.roles.actor:ActorRole", (plain, bus, coordinator),
                 {"torch_threads": roles.actor.torch_threads}, roles.actor),
    ]
    if cfg.algorithm.kl_coef > 0:
        specs.append(RoleSpec("reference", "relax_gym.trainer.roles.reference:ReferenceRole", (plain, bus),
                              {"torch_threads": roles.reference.torch_threads}, roles.reference))
    return specs


def _import(path: str) -> type:
    import importlib

    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def ensure_ray(cfg: RelaxConfig) -> bool:
    """Start a local Ray instance unless one is running (tests start their own); True when this call started it.
    Logical CPUs: the machine's, or what the roles reserve plus room for Serve's own actors if that is more."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("TQ_NUM_THREADS", "2")
    r = cfg.roles
    reserved = sum(s.num_cpus * s.replicas for s in (r.env_worker, r.inference, r.reference, r.advantages, r.actor))
    ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(reserved) + 4), include_dashboard=False,
             log_to_driver=False, configure_logging=False, namespace="relax-gym")
    return True


class AsyncTrainer:
    """The async-mode counterpart of :class:`~relax_gym.trainer.colocate.ColocateTrainer` (same constructor, same
    ``run`` / ``close``, same run-directory layout)."""

    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, progress=None) -> None:
        if cfg.trainer.mode != "async":
            raise ValueError(f"AsyncTrainer needs trainer.mode=async (got {cfg.trainer.mode!r}); use ColocateTrainer")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        self.progress = progress or (lambda event, data: None)
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.metrics.tensorboard)
        self.prefix = f"relax-{uuid.uuid4().hex[:8]}"
        self.handles: dict[str, Any] = {}
        self.apps: list[str] = []
        self.actors: list[Any] = []
        self.bus: Any = None
        self.version = 0
        self.base_version = 0
        self.produced: list[str] = []
        self.consumed: list[str] = []
        self._tq_owner: Any = None
        self._started_ray = False
        self._closed = False

    # -- deployment --------------------------------------------------------------------------------------------

    def _start(self) -> None:
        from ray import serve
        from ray.serve.api import RunTarget

        serve.start(proxy_location="Disabled")
        coordinator = start_coordinator(f"{self.prefix}-dcs")
        self.actors.append(coordinator)
        link = self._bus_link()
        specs = plan_roles(self.cfg, link, coordinator, self.prefix)
        targets = []
        for spec in specs:
            s = spec.section
            deployment = serve.deployment(
                _import(spec.cls_path), name=spec.name, num_replicas=s.replicas, max_ongoing_requests=s.max_ongoing_requests,
                ray_actor_options={"num_cpus": s.num_cpus}, health_check_period_s=10.0, health_check_timeout_s=60.0,
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
        self._tq_owner = make_bus("transferqueue", start=True, scope=self.prefix)
        return BusLink("transferqueue", options={"scope": self.prefix})

    # -- the run -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._started_ray = ensure_ray(self.cfg)  # in the main thread: Ray installs its signal handlers there
        return asyncio.run(self._run())

    async def _run(self) -> dict[str, Any]:
        try:
            await asyncio.to_thread(self._start)
            return await self._loop()
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
        warm = await actor.warmup.remote()
        for i, row in enumerate(warm["rows"]):
            self.progress("sft", {"step": i + 1, "of": t.sft_warmup_steps, **row})
            self.metrics.write(-t.sft_warmup_steps + i, row)
        self.version = self.base_version = int(warm["version"])
        self.reference_path = None
        if "reference" in self.handles:
            self.reference_path = await actor.save_reference.remote(str(self.run_dir / "reference"))
        last_eval = await self._evaluate()
        self.metrics.write(0, {**last_eval, "policy_version": self.version})
        self.progress("eval", {"step": 0, **last_eval})
        summary: dict[str, Any] = {"eval_reward_start": last_eval["eval_reward"], "eval_accuracy_start": last_eval["eval_accuracy"]}
        gate = StalenessGate(t.max_staleness)
        launched: dict[int, asyncio.Event] = {k: asyncio.Event() for k in range(t.steps)}
        rollouts: dict[int, asyncio.Task] = {}
        streams: dict[int, list[asyncio.Task]] = {}
        launcher = asyncio.create_task(self._launch(gate, launched, rollouts, streams))
        loop_start = time.perf_counter()
        previous = loop_start
        steps_done, waits = 0, []
        try:
            for k in range(t.steps):
                await launched[k].wait()
                res = await actor.train_step.remote(k, self._rows_per_step(), t.group_size, max_staleness=t.max_staleness,
                                                    with_reference="reference" in self.handles)
                self.version = int(res["version"])
                await gate.advance(k + 1)
                roll = await rollouts.pop(k)
                stream_answers = await asyncio.gather(*streams.pop(k))
                await self.bus.drop_partition(k)
                now = time.perf_counter()
                row = self._step_row(k, res, roll, stream_answers[0], step_s=now - previous, elapsed=now - start)
                previous = now
                steps_done = k + 1
                waits.append((row["data_wait_s"], row["time_step_s"]))
                over_budget = t.time_budget_s is not None and time.perf_counter() - start > t.time_budget_s
                if steps_done % t.eval_every == 0 or steps_done == t.steps or over_budget:
                    last_eval = await self._evaluate()
                    row.update(last_eval)
                self.metrics.write(steps_done, row)
                self.progress("step", {"step": steps_done, "of": t.steps, **row, "eval_reward": last_eval["eval_reward"]})
                if steps_done % t.checkpoint_every == 0 or steps_done == t.steps:
                    await actor.checkpoint.remote(steps_done, str(self.run_dir))
                if over_budget:
                    if steps_done % t.checkpoint_every and steps_done != t.steps:
                        await actor.checkpoint.remote(steps_done, str(self.run_dir))
                    break
        finally:
            await gate.close()
            launcher.cancel()
            await asyncio.gather(launcher, return_exceptions=True)
            await self._abandon(rollouts, streams)
        loop_s = time.perf_counter() - loop_start
        dup = sum(n - 1 for n in Counter(self.consumed).values() if n > 1)
        summary.update({
            "eval_reward_end": last_eval["eval_reward"], "eval_accuracy_end": last_eval["eval_accuracy"],
            "steps": steps_done, "elapsed_s": time.perf_counter() - start, "mode": "async", "max_staleness": t.max_staleness,
            "steps_per_hour": 3600.0 * steps_done / loop_s if loop_s > 0 else 0.0,
            "data_wait_fraction": _share(waits),  # actor waiting for data / wall time of its steps
            "data_wait_fraction_steady": _share(waits[t.max_staleness + 1 :]),  # once the pipeline is full
            "samples_produced": len(self.produced), "samples_consumed": len(self.consumed), "samples_duplicated": dup,
            "samples_unconsumed": len(set(self.produced) - set(self.consumed)), "policy_version": self.version,
        })
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _rows_per_step(self) -> int:
        return self.cfg.trainer.prompts_per_step * self.cfg.trainer.group_size

    async def _launch(self, gate: StalenessGate, launched: dict[int, asyncio.Event], rollouts: dict[int, asyncio.Task],
                      streams: dict[int, list[asyncio.Task]]) -> None:
        """Start each step's rollout (and its streaming consumers) as soon as the staleness gate allows."""
        t = self.cfg.trainer
        n = self._rows_per_step()
        for k in range(t.steps):
            await gate.wait_for(k)
            await self.bus.open_partition(k, expected_rows=n, group_size=t.group_size)
            rollouts[k] = asyncio.create_task(self._rollout(k))
            calls = [self.handles["advantages"].process.remote(k, n, t.group_size)]
            if "reference" in self.handles:
                calls.append(self.handles["reference"].process.remote(k, n, self.reference_path))
            streams[k] = [asyncio.ensure_future(_awaitable(c)) for c in calls]
            launched[k].set()

    async def _rollout(self, k: int) -> dict[str, Any]:
        t = self.cfg.trainer
        t0 = time.perf_counter()
        base_seed = t.seed * 10_000_019 + (k + 1) * 1_000  # the colocate trainer's seeds for step k + 1
        groups = await asyncio.gather(*(self._group(k, p, base_seed + p) for p in range(t.prompts_per_step)))
        await self.bus.seal(k, self._rows_per_step())
        episodes = [e for g in groups for e in g]
        self.produced.extend(e["sample_id"] for e in episodes)
        return {"episodes": episodes, "time_rollout_s": time.perf_counter() - t0}

    async def _group(self, k: int, group: int, seed: int) -> list[dict[str, Any]]:
        t = self.cfg.trainer
        sids = [sample_id(k + 1, group, m) for m in range(t.group_size)]
        error: Exception | None = None
        for attempt in range(GROUP_ATTEMPTS):
            try:
                return await self.handles["env_worker"].run_group.remote(k, group, [seed] * t.group_size, sids)
            except Exception as exc:  # noqa: BLE001 - a dead replica: Serve restarts it, the group goes to another
                error = exc
                log.warning("step %d group %d: env worker call failed (attempt %d of %d): %s", k + 1, group, attempt + 1,
                            GROUP_ATTEMPTS, exc)
        await self.bus.put(k, [masked_row(sid, group, seed) for sid in sids])  # the step completes without them
        return [{"sample_id": sid, "group_id": group, "reward": 0.0, "status": "env_error", "trainable": False, "accuracy": 0.0,
                 "format": 0.0, "completion_tokens": 0, "turns": 0, "tool_calls": 0, "error": f"{type(error).__name__}: {error}",
                 "policy_versions": []} for sid in sids]

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
        answers = await asyncio.gather(*(worker.evaluate.remote(c) for c in chunks))
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


async def _awaitable(response: Any) -> Any:
    return await response
