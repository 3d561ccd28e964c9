"""Weight pushes in an async run, through the DCS (:mod:`relax_gym.trainer.dcs`).

The run's :class:`~relax_gym.trainer.dcs.coordinator.DCSCoordinator` lives in a small Ray actor
(:func:`start_coordinator`): each inference replica registers its engine's loopback URL there when it starts
(:func:`register_engine`), and the actor role pushes with a :class:`~relax_gym.trainer.dcs.client.DCSClient` whose
coordinator is that shared actor (:class:`SharedCoordinator`). A push pauses every engine, loads, flushes and
continues them, and returns only when all of them serve the new version, so "version v is trained" always means
"the engines serve v".
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, DCSPushError, checkpoint_names
from relax_gym.trainer.engines.client import EngineClient

log = logging.getLogger(__name__)

MAX_DEAD_ENGINES = 4  # engines dropped (and pushes retried) within one push at most

__all__ = ["DCSPusher", "SharedCoordinator", "advertised_url", "register_engine", "start_coordinator"]


def start_coordinator(name: str, *, transport: str = "tcp", bucket_mb: float = 256.0) -> Any:
    """The run's coordinator as a named Ray actor (no CPU reserved)."""
    import ray

    return ray.remote(num_cpus=0)(DCSCoordinator).options(name=name).remote(transport=transport, bucket_mb=bucket_mb)


def register_engine(coordinator: Any, url: str) -> None:
    """Called by an inference replica when its engine is up (a replica restarted in place registers again). An
    engine bound to every interface (``inference.host: 0.0.0.0``, multi-node runs) registers under its node's IP."""
    import ray

    ray.get(coordinator.add_engine.remote(advertised_url(url)))


def advertised_url(url: str) -> str:
    """``url`` with a wildcard bind address (``0.0.0.0`` / ``::``) replaced by this Ray node's IP address."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname not in ("0.0.0.0", "::"):
        return url
    import ray

    return f"{parts.scheme}://{ray.util.get_node_ip_address()}:{parts.port}"


class SharedCoordinator:
    """The coordinator methods a DCSClient calls, forwarded to the coordinator actor (blocking: the client runs
    its push in a worker thread)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref)

    def push_plan(self, bucket_mb: float | None = None) -> Any:
        return self._get(self.handle.push_plan.remote(bucket_mb))

    def set_weights(self, meta: Any) -> None:
        self._get(self.handle.set_weights.remote(meta))

    def commit(self, version: Any, engines: Any = None) -> None:
        self._get(self.handle.commit.remote(version, engines))


class DCSPusher:
    """``await pusher.push(state_dict, version)`` for the actor role: a DCS push in a worker thread.

    An engine that cannot be reached when the push starts (its replica died; Serve restarts it under a new URL,
    which registers itself) is removed from the coordinator and the push is tried again: nothing was sent yet,
    so the retry is safe. Any other failure is raised as the DCS reports it."""

    def __init__(self, coordinator: Any, model: torch.nn.Module, *, disk_dir: str | None = None) -> None:
        from relax_gym.trainer.engines.factory import push_transport

        self.coordinator = coordinator
        shared = coordinator if isinstance(coordinator, DCSCoordinator) else SharedCoordinator(coordinator)
        # nccl (SGLang engines) falls back to disk (``disk_dir``: a directory the engines see) when it cannot be used
        transport = push_transport(shared.push_plan().transport, disk_dir=disk_dir)
        self.client = DCSClient(shared, names=checkpoint_names(model), transport=transport, disk_dir=disk_dir)

    async def push(self, state: dict[str, torch.Tensor], version: int) -> Any:
        for _ in range(MAX_DEAD_ENGINES):
            try:
                return await asyncio.to_thread(self.client.push, state, version)
            except DCSPushError as exc:
                if exc.step != "pause_generation" or await asyncio.to_thread(_reachable, exc.url):
                    raise
                log.warning("engine %s is gone; removed from the DCS coordinator, pushing version %s again", exc.url, version)
                await self._remove(exc.url)
        return await asyncio.to_thread(self.client.push, state, version)

    async def _remove(self, url: str) -> None:
        if isinstance(self.coordinator, DCSCoordinator):
            self.coordinator.remove_engine(url)
        else:
            await self.coordinator.remove_engine.remote(url)

    def close(self) -> None:
        self.client.close()


def _reachable(url: str) -> bool:
    with EngineClient(url, timeout=5.0, retries=1) as client:
        return client.health()
