"""Recovery in the async engine: what the controller uses to survive dying replicas (level 1) and a dying actor
(level 2). See docs/architecture.md, "Recovery".

- :class:`ReplicaRegistry` (a zero-CPU Ray actor per topology): every role replica announces itself when it starts
  (:func:`~relax_gym.trainer.async_engine.replica.announce_replica`), so the controller knows how often each role was replaced,
  whatever replaced it (a Serve health check, a crash, an injected kill). :meth:`Supervisor.watch` waits on it
  (an awaited call that returns on change, no polling) and asks for a global restart when a role with training
  state (:data:`STATEFUL_ROLES`: the actor, PPO's critic) was replaced or a role went over ``roles.restart_budget``.
- :meth:`Supervisor.call`: one handle call to a role, retried while the replica that should answer is being
  replaced (Ray reports the dead replica as a ``RayActorError``; the call sent next waits in Serve's router until
  the new replica is up). A failing call to a stateful role is not retried: it raises :class:`GlobalRestart`, as
  does a role that stays unreachable for ``roles.replica_wait_s``.
- :func:`kill_replica`: ends one Serve replica of a deployment with ``ray.kill`` (fault injection);
  :func:`kill_rank`: ends one rank of the actor's megatron rank group.
- :func:`sample_step`: the step a sample id belongs to (the controller's ledger keeps the ids of steps up to the
  checkpoint when it rolls back).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["STATEFUL_ROLES", "GlobalRestart", "RecoveryError", "ReplacedActorError", "ReplicaRegistry", "Supervisor",
           "is_replica_failure", "kill_rank", "kill_replica", "sample_step"]

#: Roles whose replica holds training state (weights and optimizer moved on since the last checkpoint): a replaced
#: one cannot pick up where the dead one was, so losing one restarts the run from its last checkpoint (level 2).
STATEFUL_ROLES = ("actor", "critic")

log = logging.getLogger(__name__)

T = TypeVar("T")


class GlobalRestart(Exception):
    """The topology must be torn down and the run resumed from its last checkpoint (level 2); says why."""


class ReplacedActorError(RuntimeError):
    """Raised by a replica of a stateful role (the actor, PPO's critic) that Serve started in place of a dead one:
    its training state is gone, so it refuses work (a train step or a checkpoint from fresh weights would be wrong)
    until the controller restarts the topology from the last checkpoint."""


class RecoveryError(RuntimeError):
    """Recovery gave up: the run needed more global restarts than ``roles.max_global_restarts``."""


def is_replica_failure(exc: BaseException) -> bool:
    """The replica that was handling (or about to handle) a call died or became unreachable."""
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover - the async engine always has Ray
        return False
    return isinstance(exc, RayActorError)


def sample_step(sid: str) -> int:
    """``"s000003-g0002-01"`` → 3 (see :func:`~relax_gym.trainer.rollout.samples.sample_id`)."""
    return int(sid[1:sid.index("-")])


class ReplicaRegistry:
    """Body of the registry actor: replica starts per role. ``replicas``: each role's configured replica count
    (the starts that are not restarts)."""

    def __init__(self, replicas: dict[str, int]) -> None:
        self.replicas = dict(replicas)
        self.starts: Counter[str] = Counter()
        self.names: list[tuple[str, str]] = []
        self._changed = asyncio.Event()

    async def started(self, role: str, name: str) -> int:
        """Record a replica start; returns the role's starts so far (a replica beyond the role's count is a
        replacement)."""
        self.starts[role] += 1
        self.names.append((role, name))
        self._changed.set()
        return self.starts[role]

    async def restarts(self) -> dict[str, int]:
        return {role: max(0, self.starts[role] - n) for role, n in self.replicas.items()}

    async def wait_change(self, seen: int) -> tuple[int, dict[str, int]]:
        """Return once more than ``seen`` replicas have started in all: ``(starts, restarts by role)``."""
        while len(self.names) <= seen:
            self._changed.clear()
            await self._changed.wait()
        return len(self.names), await self.restarts()


async def _cancelling(response: Awaitable[T]) -> T:
    """Await a handle call; if the awaiting task is cancelled (the run ends, fails or restarts), cancel the request in
    its replica too. Serve does not do that by itself, and a replica being stopped first waits for its requests in
    flight: an uncancelled one (an env-worker group waiting on a dead engine) would hold the replica until Serve kills
    it, so that its ``__del__`` (its sandboxes removed) never runs."""
    try:
        return await response
    except asyncio.CancelledError:
        cancel = getattr(response, "cancel", None)
        if cancel is not None:
            cancel()
        raise


class Supervisor:
    """Level-1 recovery for one topology: retried role calls and the restart watch.

    ``registry``: the :class:`ReplicaRegistry` actor handle; ``budget``: replacements allowed per role;
    ``wait_s``: how long a call keeps retrying while its role is replaced, on ``clock`` (the planner hands in its
    virtual one)."""

    def __init__(self, registry: Any, *, budget: int, wait_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry, self.clock = registry, clock
        self.budget = int(budget)
        self.wait_s = float(wait_s)
        self.failed_calls: Counter[str] = Counter()  # calls that hit a dying replica, by role

    async def call(self, role: str, make: Callable[[], Awaitable[T]], what: str) -> T:
        """``await make()`` (one handle call), again while the replica that should answer is being replaced."""
        deadline = self.clock() + self.wait_s
        delay = 0.2
        while True:
            try:
                return await _cancelling(make())
            except Exception as exc:
                if isinstance(exc, ReplacedActorError) or isinstance(getattr(exc, "cause", None), ReplacedActorError):
                    raise GlobalRestart(f"{what} reached a replacement actor replica: {exc}") from exc
                if not is_replica_failure(exc):
                    raise
                self.failed_calls[role] += 1
                if role in STATEFUL_ROLES:
                    raise GlobalRestart(f"the {role} replica died during {what}: {type(exc).__name__}") from exc
                if self.clock() + delay > deadline:
                    raise GlobalRestart(f"{what}: the {role} role stayed unreachable for {self.wait_s:g} s "
                                        f"(roles.replica_wait_s): {type(exc).__name__}: {exc}") from exc
                log.warning("%s: a %s replica died (%s); retrying once it is replaced", what, role, type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(2 * delay, 5.0)

    async def watch(self) -> None:
        """Return never; raise :class:`GlobalRestart` once a stateful role was replaced or a role went over budget."""
        seen = 0
        while True:
            seen, restarts = await self.registry.wait_change.remote(seen)
            for role in STATEFUL_ROLES:
                if restarts.get(role, 0) > 0:
                    raise GlobalRestart(f"the {role} replica was replaced (its training state is gone)")
            over = {role: n for role, n in restarts.items() if n > self.budget}
            if over:
                role, n = next(iter(over.items()))
                raise GlobalRestart(f"the {role} role was replaced {n} times, more than roles.restart_budget={self.budget}")

    async def restarts(self) -> dict[str, int]:
        return await self.registry.restarts.remote()


def kill_rank(group_name: str, rank: int) -> str:
    """End rank ``rank`` of the actor's megatron rank group ``group_name`` (``ray.kill``, no restart): the group
    fails as a whole and the run restarts from its last checkpoint. Returns the rank's actor name."""
    import ray

    name = f"{group_name}-rank{rank}"  # as relax_gym.trainer.actors.megatron.group.rank_actor_name names it
    found = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == name]
    if not found:  # the group lives in the namespace of the replica that made it
        raise RecoveryError(f"no actor rank named {name!r} to kill (is actor.parallel larger than rank {rank}?)")
    ray.kill(ray.get_actor(name, namespace=found[0]["namespace"]), no_restart=True)
    return name


def kill_replica(app: str, deployment: str, rng: random.Random | None = None) -> str:
    """End one running replica of ``deployment`` in Serve application ``app`` (``ray.kill``, no restart by Ray:
    Serve notices and starts a replacement). Returns the replica's actor name."""
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))
    if not names:
        raise RecoveryError(f"no running replica of {deployment!r} in application {app!r} to kill")
    name = (rng or random.Random(0)).choice(names)
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return name
