"""The inference role: one engine per replica (``inference.engine``: the embedded engine, or a launched SGLang
server), answering SGLang's ``/generate`` over deployment-handle calls.

Env workers reach it with a :class:`~relax_gym.trainer.engines.serve_client.HandleEngineClient`: a request is
three hops -- the worker's client (coalescing the episodes' concurrent requests into one batch) → one handle call
:meth:`InferenceRole.generate` with the ``/generate`` body as a dict → the engine (``EmbeddedEngine.generate`` in
this process; an SGLang replica forwards the body to its server on loopback, mapped for SGLang). Nothing is
JSON-encoded between the worker and the embedded engine: Ray pickles the dicts.
The engine's loopback HTTP server still runs, for agents inside sandboxes and for the DCS weight pushes (pause →
load → flush → continue over SGLang's protocol); its URL is registered with the run's DCS coordinator when the
replica starts, and the embedded engine receives the actor's broadcasts through the DCS's ``GroupReceiver``. A
replica that starts after weights were pushed (Serve replaced a dead one) serves nothing until
it holds the version the other engines serve: its first request asks the actor to push that version again
(:meth:`~relax_gym.trainer.async_engine.roles.actor.ActorRole.catch_up`, through the actor's deployment handle).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator
from typing import Any

from relax_gym.trainer.engines.settings import InferenceSection
from relax_gym.trainer.engines.client import EngineHTTPError
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.policy import PolicyConfig
from relax_gym.trainer.faults.hooks import EngineFaults
from relax_gym.trainer.async_engine.replica import announce_replica, replica_name, setup_replica
from relax_gym.trainer.dcs.group import GroupReceiver
from relax_gym.trainer.dcs.service import register_engine

__all__ = ["InferenceRole"]

log = logging.getLogger(__name__)

_END = object()  # a streamed request's end, after its last token


class InferenceRole:
    def __init__(self, model: dict[str, Any], inference: dict[str, Any], *, coordinator: Any = None,
                 torch_threads: int | None = None, registry: Any = None, actor_app: str | None = None) -> None:
        """``coordinator``: the run's DCS coordinator actor; ``registry``: its replica registry; ``actor_app``: the
        actor's Serve application (asked for the current weights when this replica starts late)."""
        setup_replica(torch_threads)
        cfg = InferenceSection.model_validate(inference)
        # the DCS's engine side: an embedded engine receives the actor's tcp (gloo) pushes through it
        self.host = start_engine(cfg, PolicyConfig.model_validate(model), weight_receiver=GroupReceiver())
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

    async def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        """One ``/generate`` body (a dict; a batch request for coalesced calls): ``(200, response dict or list)``,
        or ``(status, message)`` for a refused request (4xx) or an engine failure (500; injected engine faults
        included) -- the replica itself never fails a request."""
        if self._behind:
            await self._catch_up()
        loop = asyncio.get_running_loop()
        try:
            return 200, await loop.run_in_executor(self._threads, self.host.generate, body)
        except Exception as exc:  # noqa: BLE001 - a refusal or an engine failure is an answer, never a dead replica
            return self._failure(exc)

    def _failure(self, exc: Exception) -> tuple[int, str]:
        """``(status, message)`` of a failed generate: a refused request's 4xx, else the engine's failure (500)."""
        if isinstance(exc, EngineHTTPError):
            return exc.status_code, exc.message
        log.warning("inference replica %s: generate failed: %s: %s", self.name, type(exc).__name__, exc)
        return int(getattr(exc, "status_code", 500) or 500), f"{type(exc).__name__}: {exc}"

    async def generate_stream(self, body: dict[str, Any]) -> AsyncIterator[tuple[Any, ...]]:
        """One ``/generate`` body streamed (a Serve streaming call: ``handle.options(stream=True)``): ``("token",
        id)`` for each token as the embedded engine samples it, then ``("done", status, response or message)`` as
        :meth:`generate` answers. An SGLang replica answers once (its tokens come with the answer)."""
        if self._behind:
            await self._catch_up()
        loop = asyncio.get_running_loop()
        tokens: asyncio.Queue[Any] = asyncio.Queue()
        on_token = lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t)  # noqa: E731 - from the engine's thread
        done = loop.run_in_executor(self._threads, self.host.generate, body, on_token)
        done.add_done_callback(lambda _: tokens.put_nowait(_END))
        while (token := await tokens.get()) is not _END:
            yield ("token", token)
        try:
            yield ("done", 200, done.result())
        except Exception as exc:  # noqa: BLE001 - a refusal or an engine failure is an answer, never a dead replica
            yield ("done", *self._failure(exc))

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
