"""Deploying an async run's topology: which roles (:func:`plan_roles`, pure), the local Ray instance
(:func:`ensure_ray`), and the running topology (:class:`Topology`): the Serve applications, the small Ray actors
beside them (replica registry, carry slots, bus host), the controller's bus connection, and their teardown.

The DCS coordinator is started by the controller and handed to :meth:`Topology.start`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from relax_gym.trainer.async_engine.carry import CarrySlots
from relax_gym.trainer.async_engine.recovery import ReplicaRegistry, Supervisor
from relax_gym.trainer.cluster.local_ray import start_local_ray
from relax_gym.trainer.config import RelaxConfig, RoleSection
from relax_gym.trainer.databus.link import BusHost, BusLink

__all__ = ["RoleSpec", "Topology", "ensure_ray", "plan_roles", "start_serve"]

log = logging.getLogger(__name__)


@dataclass
class RoleSpec:
    """One role to deploy: its class (imported by path in the replica), constructor arguments and sizing."""

    name: str
    cls_path: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    section: RoleSection = field(default_factory=RoleSection)
    shutdown_s: float = 5.0  # Serve's graceful_shutdown_timeout_s: the replica's __del__ runs within it


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_roles(cfg: RelaxConfig, bus: Any, coordinator: Any, app_prefix: str, *, registry: Any = None,
               resume_from: str | None = None, slots: Any = None, run_dir: str | None = None) -> list[RoleSpec]:
    """The deployments of an async run, from the config (pure: no Ray calls). ``registry``: the replica registry
    every role announces itself to; ``resume_from``: the checkpoint the actor starts from; ``slots``: the run's
    carry slots (``trainer.stragglers: carry``), given to the env workers; ``run_dir``: where the env workers write
    the rollout records of the episodes they play (None: none)."""
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
                  "torch_threads": roles.env_worker.torch_threads, "slots": slots, "run_dir": run_dir}, roles.env_worker,
                 shutdown_s=30.0),  # its __del__ removes the replica's sandbox containers
        RoleSpec("advantages", "relax_gym.trainer.async_engine.roles.advantages:AdvantagesRole", (plain["algorithm"], bus), {}, roles.advantages),
        RoleSpec("actor", "relax_gym.trainer.async_engine.roles.actor:ActorRole", (plain, bus, coordinator),
                 {"torch_threads": roles.actor.torch_threads}, roles.actor),
    ]
    if cfg.judge is not None:  # the LLM judge (frozen): env workers score pending rubric parts through it
        specs.append(RoleSpec("genrm", "relax_gym.trainer.async_engine.roles.genrm:GenRMRole", (plain["judge"],),
                              {"torch_threads": roles.genrm.torch_threads}, roles.genrm))
        next(s for s in specs if s.name == "env_worker").kwargs["judge_app"] = f"{app_prefix}-genrm"
    if cfg.algorithm.kl_coef > 0:
        specs.append(RoleSpec("reference", "relax_gym.trainer.async_engine.roles.reference:ReferenceRole", (plain, bus),
                              {"torch_threads": roles.reference.torch_threads}, roles.reference))
    if cfg.algorithm.needs_critic:  # ppo: the value model, one replica holding training state, like the actor
        specs.append(RoleSpec("critic", "relax_gym.trainer.async_engine.roles.critic:CriticRole", (plain, bus),
                              {"torch_threads": roles.critic.torch_threads, "resume_from": resume_from}, roles.critic))
    for spec in specs:  # recovery: restart counts, late inference replicas catching up, the actor's checkpoint
        spec.kwargs["registry"] = registry
        if spec.name == "inference":
            spec.kwargs["actor_app"] = f"{app_prefix}-actor"
        if spec.name == "actor":
            spec.kwargs["resume_from"] = resume_from
            spec.kwargs["group_name"] = f"{app_prefix}-actor"  # its rank group's Ray actors (actor.parallel)
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
    optional = ([r.critic] if cfg.algorithm.needs_critic else []) + ([r.genrm] if cfg.judge is not None else [])
    reserved = sum(s.num_cpus * s.replicas for s in (r.env_worker, r.inference, r.reference, r.advantages, r.actor, *optional))
    p = cfg.actor.parallel
    if cfg.actor.backend == "megatron" and (p.world > 1 or p.launcher == "ray"):
        reserved += p.world * p.num_cpus_per_rank  # the actor's rank group
    start_local_ray(num_cpus=max(os.cpu_count() or 1, math.ceil(reserved) + 4), include_dashboard=False,
                    log_to_driver=False, configure_logging=False, namespace="relax-gym")
    return True


def start_serve() -> None:
    """Ray Serve without its HTTP proxy: every call goes through deployment handles."""
    from ray import serve

    serve.start(proxy_location="Disabled")


def new_prefix() -> str:
    return f"relax-{uuid.uuid4().hex[:8]}"


class Topology:
    """One deployment of the run's roles. Its names start with ``prefix`` (a new one after each global restart);
    the TransferQueue actors (``roles.bus: transferqueue``) are started once and outlive a teardown."""

    def __init__(self, cfg: RelaxConfig, run_dir: str | None = None) -> None:
        self.cfg = cfg
        self.run_dir = run_dir  # the env workers write rollout records there
        self.prefix = new_prefix()
        self.handles: dict[str, Any] = {}
        self.apps: list[str] = []
        self.actors: list[Any] = []  # Ray actors of this topology (coordinator, registry, slots, bus host)
        self.bus: Any = None  # the controller's own bus connection
        self.slots: Any = None  # stragglers: carry — the run's CarrySlots actor
        self.supervisor: Supervisor | None = None
        self._tq_owner: Any = None

    def start(self, coordinator: Any, *, resume_from: str | None, first_step: int) -> None:
        """Deploy every role (``serve.start`` already called), with ``coordinator`` (the DCS coordinator's actor,
        owned by the topology from now on); ``resume_from``: the checkpoint the actor loads; ``first_step``: the
        steps already done."""
        import ray
        from ray import serve
        from ray.serve.api import RunTarget

        self.actors.append(coordinator)
        link = self._bus_link()
        r, t = self.cfg.roles, self.cfg.trainer
        replicas = {"env_worker": r.env_worker.replicas, "inference": r.inference.replicas, "advantages": r.advantages.replicas,
                    "actor": 1, **({"reference": r.reference.replicas} if self.cfg.algorithm.kl_coef > 0 else {}),
                    **({"genrm": r.genrm.replicas} if self.cfg.judge is not None else {}),
                    **({"critic": 1} if self.cfg.algorithm.needs_critic else {})}
        registry = ray.remote(num_cpus=0)(ReplicaRegistry).options(name=f"{self.prefix}-replicas").remote(replicas)
        self.actors.append(registry)
        self.supervisor = Supervisor(registry, budget=r.restart_budget, wait_s=r.replica_wait_s)
        self.slots = None
        if t.stragglers == "carry":
            self.slots = ray.remote(num_cpus=0)(CarrySlots).options(name=f"{self.prefix}-slots").remote(
                t.prompts_per_step, t.max_staleness, first=first_step, end=t.steps)
            self.actors.append(self.slots)
        specs = plan_roles(self.cfg, link, coordinator, self.prefix, registry=registry, resume_from=resume_from,
                           slots=self.slots, run_dir=self.run_dir)
        targets = []
        for spec in specs:
            s = spec.section
            deployment = serve.deployment(
                _import(spec.cls_path), name=spec.name, num_replicas=s.replicas, max_ongoing_requests=s.max_ongoing_requests,
                ray_actor_options={"num_cpus": s.num_cpus, "num_gpus": s.num_gpus}, health_check_period_s=r.health_check_period_s,
                health_check_timeout_s=max(60.0, 2 * r.health_check_period_s),
                graceful_shutdown_timeout_s=spec.shutdown_s, logging_config={"log_level": "WARNING", "enable_access_log": False})
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

    async def take_restarts(self) -> Counter[str]:
        """The replicas replaced in this topology, by role (read before it is torn down; then empty)."""
        counts: Counter[str] = Counter()
        if self.supervisor is not None:
            try:
                counts.update(await self.supervisor.restarts())
            except Exception:  # noqa: BLE001 - the registry is gone with the topology
                log.debug("reading the replica registry failed", exc_info=True)
            self.supervisor = None
        return counts

    async def teardown(self) -> None:
        """Delete this topology's Serve applications and Ray actors (the TransferQueue actors stay up); the next
        :meth:`start` uses a new prefix."""
        import ray

        bus, self.bus = self.bus, None
        if bus is not None:
            try:
                await bus.close()
            except Exception:  # noqa: BLE001 - the bus may be gone with the topology
                log.debug("closing the bus connection failed", exc_info=True)
        apps, self.apps = self.apps, []
        await asyncio.gather(*(asyncio.to_thread(_delete_app, app) for app in apps))
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors, self.handles = [], {}
        self.prefix = new_prefix()

    async def close_bus(self) -> None:
        """The controller's bus connection, then (for TransferQueue) the actors this run started."""
        bus, self.bus = self.bus, None
        owner, self._tq_owner = self._tq_owner, None
        for one in (bus, owner):
            if one is not None:
                try:
                    await one.close()
                except Exception:  # noqa: BLE001 - never mask the run's own error
                    log.warning("closing the data bus failed", exc_info=True)

    def close(self, *, shutdown_ray: bool) -> None:
        """At the end of the run, from outside its event loop: what is still deployed goes; ``shutdown_ray``: Serve
        and Ray too (this run started them)."""
        import ray
        from ray import serve

        if not ray.is_initialized():
            return

        apps, self.apps = self.apps, []
        if apps:
            with ThreadPoolExecutor(len(apps), thread_name_prefix="relax-gym-teardown") as pool:
                list(pool.map(_delete_app, apps))
        if self.bus is not None or self._tq_owner is not None:  # the run never got to close them
            asyncio.run(self.close_bus())
        for actor in self.actors:
            ray.kill(actor)
        if shutdown_ray:
            serve.shutdown()
            ray.shutdown()


def _delete_app(app: str) -> None:
    """Delete a Serve application and wait until its replicas are gone: their ``__del__`` has run (env workers
    remove their sandbox containers) and their CPUs are free again. Best effort: a failure is logged."""
    from ray import serve

    try:
        serve.delete(app, _blocking=True)
    except Exception:  # noqa: BLE001 - best effort
        log.debug("deleting %s failed", app, exc_info=True)
