"""The inference role: one embedded engine per replica, answering SGLang's protocol over deployment-handle calls.

Env workers reach it with an :class:`~relax_gym.trainer.engines.client.AsyncEngineClient` whose transport is a
:class:`~relax_gym.trainer.engines.handle_transport.ServeHandleTransport`: every request goes through
:meth:`InferenceRole.http` into the engine server's own router, so no HTTP request is made to our own endpoint.
The engine's loopback HTTP server still runs, for agents inside sandboxes and for the DCS weight pushes (pause →
load → flush → continue over SGLang's protocol); its URL is registered with the run's DCS coordinator when the
replica starts.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from relax_gym.trainer.config import InferenceSection
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.handle_transport import dispatch_http
from relax_gym.trainer.engines.http_server import serve
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.replica import replica_name, setup_replica
from relax_gym.trainer.weights import register_engine

__all__ = ["InferenceRole"]


class InferenceRole:
    def __init__(self, model: dict[str, Any], inference: dict[str, Any], *, coordinator: Any = None,
                 torch_threads: int | None = None) -> None:
        setup_replica(torch_threads)
        cfg = InferenceSection.model_validate(inference)
        policy, processor = build_policy(PolicyConfig.model_validate(model))
        self.engine = EmbeddedEngine(policy, processor, max_batch=cfg.max_batch)
        self.server = serve(self.engine, host=cfg.host, port=0)
        # a generate blocks its thread until its batch is done: enough threads for every request of a full batch
        self._threads = ThreadPoolExecutor(max_workers=max(64, 4 * cfg.max_batch), thread_name_prefix="inference")
        self.name = replica_name()
        if coordinator is not None:
            register_engine(coordinator, self.server.url)

    async def http(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """One request of SGLang's protocol: ``(status, content type, body)`` as the HTTP server would answer."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, dispatch_http, self.server, method, path, body)

    async def url(self) -> str:
        return self.server.url

    async def weight_version(self) -> str:
        return self.engine.weight_version

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine scheduler died is restarted in place."""
        if not self.engine.alive:
            raise RuntimeError(f"inference replica {self.name}: the engine scheduler is not running")

    def __del__(self) -> None:
        try:
            self.server.close()
            self.engine.close()
            self._threads.shutdown(wait=False, cancel_futures=True)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
