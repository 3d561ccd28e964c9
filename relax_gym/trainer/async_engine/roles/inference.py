"""The inference role: one engine per replica (``inference.engine``: the embedded engine, or a launched SGLang
server), answering SGLang's protocol over deployment-handle calls.

Env workers reach it with an :class:`~relax_gym.trainer.engines.client.AsyncEngineClient` whose transport is a
:class:`~relax_gym.trainer.engines.handle_transport.ServeHandleTransport`: every request goes through
:meth:`InferenceRole.http` into the engine server's own router, so no HTTP request is made to our own endpoint
(an SGLang replica forwards it to its server on loopback, mapping ``/generate`` bodies for SGLang).
The engine's loopback HTTP server still runs, for agents inside sandboxes and for the DCS weight pushes (pause →
load → flush → continue over SGLang's protocol); its URL is registered with the run's DCS coordinator when the
replica starts. A replica that starts after weights were pushed (Serve replaced a dead one) serves nothing until
it holds the version the other engines serve: its first request asks the actor to push that version again
(:meth:`~relax_gym.trainer.async_engine.roles.actor.ActorRole.catch_up`, through the actor's deployment handle).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from relax_gym.trainer.config import InferenceSection
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.policy import PolicyConfig
from relax_gym.trainer.faults.hooks import EngineFaults
from relax_gym.trainer.async_engine.replica import announce_replica, replica_name, setup_replica
from relax_gym.trainer.dcs.service import register_engine

__all__ = ["InferenceRole"]


class InferenceRole:
    def __init__(self, model: dict[str, Any], inference: dict[str, Any], *, coordinator: Any = None,
                 torch_threads: int | None = None, registry: Any = None, actor_app: str | None = None) -> None:
        """``coordinator``: the run's DCS coordinator actor; ``registry``: its replica registry; ``actor_app``: the
        actor's Serve application (asked for the current weights when this replica starts late)."""
        setup_replica(torch_threads)
        cfg = InferenceSection.model_validate(inference)
        self.host = start_engine(cfg, PolicyConfig.model_validate(model))
        # a generate blocks its thread until its batch is done: enough threads for every request of a full batch
        self._threads = ThreadPoolExecutor(max_workers=max(64, 4 * cfg.max_batch), thread_name_prefix="inference")
        self.name = replica_name()
        self._behind = False
        if coordinator is not None:
            register_engine(coordinator, self.host.url)
            import ray

            committed = ray.get(coordinator.push_plan.remote()).version  # what the other engines serve
            self._behind = actor_app is not None and str(committed) != "0"
        self._actor_app = actor_app
        self._catching_up = asyncio.Lock()
        self._engine_faults: EngineFaults | None = None
        announce_replica(registry, "inference")

    async def http(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """One request of SGLang's protocol: ``(status, content type, body)`` as the HTTP server would answer."""
        if self._behind:
            await self._catch_up()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.host.dispatch, method, path, body)

    async def _catch_up(self) -> None:
        async with self._catching_up:
            if self._behind:
                from ray import serve

                await serve.get_app_handle(self._actor_app).catch_up.remote(self.host.url)
                self._behind = False

    async def url(self) -> str:
        return self.host.url

    async def arm_fault(self, kind: str, count: int) -> str:
        """Fault injection (``faults:``): ``engine_error`` makes this replica's engine raise on its next ``count``
        generate calls. Answers the replica's name."""
        if kind != "engine_error":
            raise ValueError(f"the inference role injects engine_error faults, not {kind!r}")
        if self._engine_faults is None:
            self._engine_faults = EngineFaults(getattr(self.host, "engine", None))
        self._engine_faults.arm(count)
        return self.name

    async def weight_version(self) -> str | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.host.weight_version)

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine scheduler died is restarted in place."""
        if not self.host.alive:
            raise RuntimeError(f"inference replica {self.name}: the {self.host.kind} engine is not running")

    def __del__(self) -> None:
        try:
            self.host.close()
            self._threads.shutdown(wait=False, cancel_futures=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
