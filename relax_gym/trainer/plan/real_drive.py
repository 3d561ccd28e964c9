"""The real async controller on the virtual clock: :class:`~relax_gym.trainer.async_engine.controller.AsyncTrainer`
driving the simulated roles.

    result = drive(costs, RelaxConfig(trainer={"mode": "async", "max_staleness": 2, "stragglers": "carry", ...}))
    result.summary            # the controller's own summary.json (steps/hour, data wait, samples, restarts...)
    result.rows               # its metrics rows (metrics.jsonl)
    result.log.digest()       # the simulated roles' event log: same inputs, same digest

What runs is the controller's code as a run executes it -- ``_supervised``, ``_loop`` (``_prepare``: warm-up call,
eval; ``_step`` per step), ``_launch``, ``_rollout``, ``_carried_group``, ``_group`` (re-sends and masking),
``_stream``, ``_step_row``, ``evaluate``, ``_abandon``, the run driver's step tail, its sample ledger and metrics
files -- with recovery's
:class:`~relax_gym.trainer.async_engine.recovery.Supervisor` (retried calls, the restart watch on a
:class:`~relax_gym.trainer.async_engine.recovery.ReplicaRegistry`), the staleness gate, the carry feeder and slots,
the in-process bus and the advantages role. Only the deployment is replaced: :class:`SimTopology` hands the
controller deployment-handle look-alikes (``handle.method.remote(...)``) of the simulated env worker, actor and
reference (:mod:`.sim_roles`), and the controller is handed the loop's virtual clock (``clock=``, also its
supervisor's and carry feeder's) and a staleness gate that logs (``gate=``). Faults are the simulated
roles' own (:class:`RoleFaults`): a call that fails the way a dying Serve replica fails (``RayActorError``), after
which the registry counts a replacement, so the recovery paths run as in a real run.

Not simulated: the time a checkpoint or an eval takes (the actor keeps each checkpoint's controller state; eval
episodes answer at once), the fault schedule of ``faults:`` (it kills Ray actors; :class:`RoleFaults` instead), a
global restart (a dead actor ends the drive with :class:`~relax_gym.trainer.async_engine.recovery.GlobalRestart`),
the critic (PPO), the genrm role.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.trainer.async_engine.bus_source import in_process_bus
from relax_gym.trainer.async_engine.carry import CarrySlots
from relax_gym.trainer.async_engine.contracts import EpisodeAnswer
from relax_gym.trainer.async_engine.controller import AsyncTrainer
from relax_gym.trainer.async_engine.recovery import ReplicaRegistry, Supervisor
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.async_engine.staleness import StalenessGate
from relax_gym.trainer.config import RelaxConfig, TrainerSection
from relax_gym.trainer.plan.clock import loop_time, run_virtual
from relax_gym.trainer.plan.costs import Costs
from relax_gym.trainer.plan.sim_roles import (
    EnginePool,
    EventLog,
    SimActor,
    SimEnvWorker,
    SimReference,
    SimWeights,
    episode_answer,
)

__all__ = ["DriveResult", "RoleFaults", "SimHandle", "SimTopology", "drive", "engine_figures", "episode_slots", "groups_in_flight"]


def engine_figures(pool: EnginePool) -> tuple[int, float, int]:
    """(engines, busy seconds, tokens made) of a pool, read on its loop (its clock)."""
    return len(pool.engines), pool.busy_s(), sum(e.tokens for e in pool.engines)


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


@dataclass
class DriveResult:
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    log: EventLog = field(repr=False)
    topology: SimTopology = field(repr=False)


class RoleFaults:
    """Role calls that fail. ``fail("env_worker", "run_group", times=1, after=3)`` makes the 4th ``run_group`` call
    fail (once) as a dying replica's call does: ``RayActorError``, and the role's registry then records a
    replacement (Serve would have started one). ``kind="error"``: the call raises an ordinary error instead (the
    replica lives; a role's bug or a refused request). ``hang_s``: the call first runs that long and is then cut off
    (the replica died mid-call: what it had fetched from the bus stays leased, what it wrote stays written)."""

    def __init__(self) -> None:
        self._plans: dict[tuple[str, str], list[dict[str, float]]] = {}
        self.calls: dict[tuple[str, str], int] = {}
        self.fired: list[tuple[float, str, str, int]] = []

    def fail(self, role: str, method: str, *, times: int = 1, after: int = 0, hang_s: float = 0.0,
             kind: str = "replica", match: Callable[..., bool] | None = None) -> RoleFaults:
        """``match(*args, **kwargs)``: only the calls it accepts count (and fail), e.g. one group's every attempt:
        ``match=lambda partition, group, *a, **k: group == 2``."""
        if kind not in ("replica", "error"):
            raise ValueError(f"a role fault is 'replica' or 'error', not {kind!r}")
        self._plans.setdefault((role, method), []).append({"after": after, "times": times, "hang_s": hang_s,
                                                          "kind": kind, "match": match, "seen": 0})
        return self

    def due(self, role: str, method: str, args: tuple = (), kwargs: dict | None = None) -> dict[str, Any] | None:
        """Count this call; the plan it fails under, if any."""
        key = (role, method)
        self.calls[key] = self.calls.get(key, 0) + 1
        for plan in self._plans.get(key, []):
            if plan["match"] is not None and not plan["match"](*args, **(kwargs or {})):
                continue
            n = plan["seen"]
            plan["seen"] = n + 1
            if plan["after"] <= n < plan["after"] + plan["times"]:
                return plan
        return None


class _Remote:
    """``method.remote(*args)`` of a handle look-alike: ``call(*args)`` (a coroutine) as a task."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call

    def remote(self, *args: Any, **kwargs: Any) -> asyncio.Task:
        return asyncio.ensure_future(self.call(*args, **kwargs))


class SimHandle:
    """A deployment handle's look-alike over a simulated role object: ``handle.method.remote(*args)`` runs
    ``role.method(*args)`` as a task (a coroutine function's result is awaited; a plain one is returned)."""

    def __init__(self, role: str, target: Any, topology: SimTopology) -> None:
        self.role, self.target, self.topology = role, target, topology

    def __getattr__(self, name: str) -> _Remote:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Remote(functools.partial(self._call, name))

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        faults = self.topology.faults
        plan = faults.due(self.role, name, args, kwargs)
        if plan is not None:
            from ray.exceptions import RayActorError

            if plan["hang_s"] > 0:
                work = asyncio.ensure_future(self._run(name, args, kwargs))
                await asyncio.wait({work}, timeout=plan["hang_s"])
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
            faults.fired.append((asyncio.get_running_loop().time(), self.role, name, faults.calls[(self.role, name)]))
            if plan["kind"] == "error":
                self.topology.log.add("call_failed", role=self.role, method=name)
                raise RuntimeError(f"simulated failure of {self.role}.{name}")
            self.topology.log.add("replica_died", role=self.role, method=name)
            await self.topology.registry.body.started(self.role, f"{self.role}-replacement-{len(faults.fired)}")
            raise RayActorError()
        return await self._run(name, args, kwargs)

    async def _run(self, name: str, args: tuple, kwargs: dict) -> Any:
        result = getattr(self.target, name)(*args, **kwargs)
        if asyncio.iscoroutine(result):
            result = await result
        return result


class _Actor:
    """The actor role's calls the controller makes besides ``train_step``."""

    def __init__(self, sim: SimActor) -> None:
        self.sim = sim
        self.checkpoints: list[tuple[int, dict[str, Any]]] = []  # (step, the controller's extra state)

    async def checkpoint(self, step: int, run_dir: str, extra: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
        """Writing takes no simulated time; the controller's state (sample ledger, carry cursor) is kept."""
        self.checkpoints.append((step, extra))
        return {"error": ""}

    async def warmup(self) -> dict[str, Any]:
        return {"rows": [], "version": self.sim.version}

    async def save_reference(self, path: str) -> str:
        return path

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)


class _EnvWorker:
    """The env-worker role: groups as :class:`~.sim_roles.SimEnvWorker` plays them; eval answers at once (the
    drive measures the loop between the first and last step, as the controller does)."""

    def __init__(self, sim: SimEnvWorker) -> None:
        self.sim = sim

    async def evaluate(self, seeds: list[int], *, step: int | None = None, first_index: int = 0) -> list[EpisodeAnswer]:
        return [episode_answer(f"eval-{s}", first_index + i, 0.0, 0, []) for i, s in enumerate(seeds)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)


class _Registry:
    """The replica registry's actor handle look-alike (``registry.wait_change.remote(seen)`` ...)."""

    def __init__(self, body: ReplicaRegistry) -> None:
        self.body = body

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.body, name))


class SimTopology:
    """What :class:`~relax_gym.trainer.async_engine.deploy.Topology` gives the controller (``handles``, ``bus``,
    ``supervisor``, ``slots``, ``prefix``), over the simulated roles of ``costs``."""

    def __init__(self, costs: Costs, cfg: RelaxConfig, *, faults: RoleFaults | None = None) -> None:
        self.cfg, self.costs, self.faults = cfg, costs, faults or RoleFaults()
        self.log = EventLog()
        self.prefix = "sim"
        self.replicas, self.actor_gpus = costs.cluster.split("async", costs.generation.gpus_per_replica)
        self.pool: EnginePool | None = None
        self.bus: Any = None
        self.handles: dict[str, Any] = {}
        self.supervisor: Supervisor | None = None
        self.slots: CarrySlots | None = None
        self.registry: _Registry | None = None
        self.engine_figures: tuple[int, float, int] = (0, 0.0, 0)  # read when the drive ends

    async def start(self) -> None:
        """Build the roles (inside the virtual loop: their events and semaphores belong to it); each announces its
        replica, as a real one does when it starts."""
        c, t, r = self.costs, self.cfg.trainer, self.cfg.roles
        self.pool = EnginePool(self.replicas, c.generation)
        self.bus = in_process_bus(lease_timeout=None, clock=loop_time)  # fetch timeouts in sim time
        self.slots = (CarrySlots(t.prompts_per_step, t.max_staleness, first=0, end=t.steps)
                      if t.stragglers == "carry" else None)
        worker = SimEnvWorker(c, t.seed, self.pool, self.log, bus=self.bus, slots=self.slots,
                              episodes=asyncio.Semaphore(c.cluster.episode_slots or episode_slots(t)))
        actor = SimActor(c, self.bus, SimWeights(self.pool, c, self.log), self.actor_gpus, self.log,
                         algorithm=self.cfg.algorithm, trainer=t)
        roles = {"env_worker": _EnvWorker(worker), "actor": _Actor(actor),
                 "advantages": AdvantagesRole(self.cfg.algorithm.model_dump(mode="json"), self.bus)}
        if c.train.ref_s_per_token > 0:
            roles["reference"] = SimReference(c, self.bus, self.actor_gpus)
        self.actor = roles["actor"]
        self.handles = {name: SimHandle(name, role, self) for name, role in roles.items()}
        self.registry = _Registry(ReplicaRegistry({name: 1 for name in roles}))
        self.supervisor = Supervisor(self.registry, budget=r.restart_budget, wait_s=r.replica_wait_s, clock=loop_time)
        for name in roles:
            await self.registry.body.started(name, f"{name}-0")

    @property
    def staleness(self) -> list[int]:
        return self.actor.sim.staleness if self.handles else []

    async def close_bus(self) -> None:
        pass

    def close(self, shutdown_ray: bool = False) -> None:
        pass


def _logging_gate(log: EventLog) -> type:
    class LoggedGate(StalenessGate):
        """The controller's gate, unchanged, saying when it lets a step's partition open (and how far training was)."""

        async def wait_for(self, step: int) -> None:
            await super().wait_for(step)
            log.add("step_open", step=step, trained=self.trained)

        async def advance(self, trained: int) -> None:
            await super().advance(trained)
            log.add("gate", trained=trained)

    return LoggedGate


def drive(costs: Costs, cfg: RelaxConfig | dict[str, Any], *, faults: RoleFaults | None = None,
          run_dir: str | Path | None = None, keep_schedule: bool = False) -> DriveResult:
    """Run the controller for ``cfg.trainer.steps`` steps against the simulated roles (see the module docstring).
    ``run_dir``: where its files go (config, metrics.jsonl, summary.json); a temporary directory by default.
    ``keep_schedule``: keep the config's eval and checkpoint steps and its time budget (on the virtual clock);
    by default the drive has none of them (no SFT warm-up either way)."""
    cfg = cfg if isinstance(cfg, RelaxConfig) else RelaxConfig.model_validate(cfg)
    t = cfg.trainer
    if t.mode != "async":
        raise ValueError(f"the controller drive simulates trainer.mode=async, not {t.mode!r}")
    if cfg.algorithm.needs_critic or cfg.judge is not None or cfg.faults.inject:
        raise ValueError("the controller drive simulates neither PPO's critic, a judge, nor faults: (use RoleFaults)")
    unscheduled = {} if keep_schedule else {"checkpoint_every": t.steps + 1, "eval_every": t.steps + 1,
                                            "time_budget_s": None}
    t = t.model_copy(update={**unscheduled, "sft_warmup_steps": 0})
    cfg = cfg.model_copy(update={"trainer": t, "metrics": cfg.metrics.model_copy(update={"tensorboard": False})})
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="relax-plan-"))
        topology = SimTopology(costs, cfg, faults=faults)
        built: list[AsyncTrainer] = []

        async def main() -> dict[str, Any]:
            await topology.start()
            # built inside the virtual loop: its schedule reads the loop's clock from the start
            trainer = AsyncTrainer(cfg, Path(run_dir), clock=loop_time, gate=_logging_gate(topology.log), topology=topology)
            built.append(trainer)
            try:
                return await trainer._supervised(trainer._loop())
            finally:
                topology.engine_figures = engine_figures(topology.pool)

        try:
            summary = run_virtual(main())
        finally:
            for trainer in built:
                trainer.driver.metrics.close()
        rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return DriveResult(summary, [r for r in rows if r.get("step", 0) >= 1 and "time_step_s" in r], topology.log, topology)
