"""The inference deployment's engine, reached from an env worker with deployment-handle calls.

In the async engine an env worker's request takes three hops: this client (which coalesces the episodes'
concurrent requests into one batch, as :class:`~relax_gym.trainer.engines.coalesce.CoalescingClient` does over
HTTP) → one Serve handle call ``InferenceRole.generate(body)`` → the replica's engine (``EmbeddedEngine.generate``,
or a launched SGLang server over its loopback HTTP). The request body is SGLang's ``/generate`` body as a dict and
the answer its response dicts; Ray pickles them, nothing is JSON-encoded on the way::

    client = HandleEngineClient(serve.get_app_handle("inference"), max_batch=cfg.inference.max_batch)
    out = await client.generate(input_ids, sampling_params={...})   # GenerateOutput, weight_version included

The role answers ``(status, data)``: 200 and the response dict(s), or an error status and its message, raised
here as :class:`~relax_gym.trainer.engines.client.EngineHTTPError` (so a 4xx batch falls back to single requests,
as over HTTP). A call the deployment could not answer (the replica died, Serve could not deliver it) never
reached an engine: it is resent ``retries`` times with backoff, then raised as
:class:`~relax_gym.trainer.engines.client.EngineConnectionError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from relax_gym.trainer.engines.client import (
    EngineConnectionError,
    EngineError,
    EngineHTTPError,
    GenerateOutput,
    generate_batch_body,
    generate_body,
)
from relax_gym.trainer.engines.coalesce import CoalescingClient

__all__ = ["HandleEngineClient"]


class HandleEngineClient(CoalescingClient):
    """``generate`` (token-id prompts, coalesced) and ``generate_batch`` against a deployment ``handle`` whose
    ``method_name`` takes a ``/generate`` body and answers ``(status, data)``. ``window_s`` / ``max_wait_s`` /
    ``max_batch``: the coalescing (see :class:`~relax_gym.trainer.engines.coalesce.CoalescingClient`);
    ``coalesce=False`` sends every call alone. A streamed call (``generate(..., on_token=)``) is a Serve streaming
    call of ``stream_method`` (:meth:`~relax_gym.trainer.async_engine.roles.inference.InferenceRole.generate_stream`),
    alone."""

    def __init__(self, handle: Any, *, method_name: str = "generate", stream_method: str = "generate_stream",
                 retries: int = 3, backoff_s: float = 0.2, coalesce: bool = True, window_s: float = 0.002,
                 max_wait_s: float = 0.02, max_batch: int = 256) -> None:
        super().__init__(None, window_s=window_s, max_wait_s=max_wait_s, max_batch=max_batch if coalesce else 1)  # type: ignore[arg-type]
        self.handle = handle
        self.method_name = method_name
        self.stream_method = stream_method  # a streamed call (``on_token``): the role's streaming generator
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)

    async def generate_batch(self, input_ids: Any = None, **kwargs: Any) -> list[GenerateOutput]:
        data = await self._call(generate_batch_body(input_ids, **kwargs))
        if not isinstance(data, list):
            raise EngineError("/generate answered a single result for a batch request")
        return [GenerateOutput.from_json(d) for d in data]

    async def _generate_batch(self, input_ids: list[list[int]], **kwargs: Any) -> list[GenerateOutput]:
        return await self.generate_batch(input_ids, **kwargs)

    async def _generate_one(self, input_ids: list[int], **kwargs: Any) -> GenerateOutput:
        on_token = kwargs.pop("on_token", None)
        if on_token is not None:
            return GenerateOutput.from_json(await self._stream(generate_body(input_ids, **kwargs), on_token))
        data = await self._call(generate_body(input_ids, **kwargs))
        if isinstance(data, list):
            raise EngineError(f"/generate answered a list of {len(data)} for a single request")
        return GenerateOutput.from_json(data)

    async def _stream(self, body: Mapping[str, Any], on_token: Callable[[int], None]) -> Any:
        """A Serve streaming call of ``stream_method``: each ``("token", id)`` to ``on_token``, then the
        ``("done", status, data)`` answer. Not resent once it reached a replica (tokens were handed out)."""
        call = getattr(self.handle.options(stream=True), self.stream_method)
        status, data = None, None
        try:
            async for item in call.remote(body):
                if item[0] == "token":
                    on_token(int(item[1]))
                else:
                    _, status, data = item
        except Exception as exc:
            if not _is_ray_failure(exc):
                raise
            raise EngineConnectionError(f"inference deployment lost a streamed request: {type(exc).__name__}: "
                                        f"{exc}") from exc
        if status is None:
            raise EngineError("the inference deployment's stream ended without an answer")
        if status >= 400:
            raise EngineHTTPError(status, str(data), "/generate", data)
        return data

    async def _call(self, body: Mapping[str, Any]) -> Any:
        call = getattr(self.handle, self.method_name)
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                status, data = await call.remote(body)
            except Exception as exc:
                if not _is_ray_failure(exc):
                    raise
                last = exc
            else:
                if status >= 400:
                    raise EngineHTTPError(status, str(data), "/generate", data)
                return data
            if attempt < self.retries:
                await asyncio.sleep(min(self.backoff_s * 2**attempt, 5.0))
        raise EngineConnectionError(f"inference deployment unreachable: {type(last).__name__}: {last} "
                                    f"(after {self.retries + 1} attempts)") from last

    async def aclose(self) -> None:
        pass


def _is_ray_failure(exc: BaseException) -> bool:
    return (type(exc).__module__ or "").startswith("ray.")
