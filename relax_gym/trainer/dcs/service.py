"""Weight pushes in an async run, through the DCS (:mod:`relax_gym.trainer.dcs`).

The run's :class:`~relax_gym.trainer.dcs.coordinator.DCSCoordinator` lives in a small Ray actor
(:func:`start_coordinator`): each inference replica registers its engine's loopback URL there when it starts
(:func:`register_engine`), and the actor role pushes with a :class:`~relax_gym.trainer.dcs.push.DCSPush` whose
coordinator is that shared actor (:class:`SharedCoordinator`; :func:`~relax_gym.trainer.dcs.push.make_pusher`). A push pauses every engine, loads, flushes and
continues them, and returns only when all of them serve the new version, so "version v is trained" always means
"the engines serve v".
"""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.dcs.coordinator import DCSCoordinator

__all__ = ["SharedCoordinator", "advertised_url", "register_engine", "start_coordinator"]


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
