"""SGLang's HTTP protocol without a socket: an httpx transport that hands each request to a Ray Serve deployment.

In the async engine the env workers talk to the inference role with the same :class:`AsyncEngineClient` (same
request and response schemas, same errors) as against a real server, but a request travels as a deployment-handle
call instead of an HTTP request to our own endpoint::

    client = AsyncEngineClient("http://inference", transport=ServeHandleTransport(inference_handle))

The inference replica answers with :func:`dispatch_http`, which feeds the request into the engine server's own
router (``EngineServer.dispatch``) and encodes the answer or the error exactly as the HTTP handler does, so a
request behaves the same whichever way it arrives. The engine's loopback HTTP server keeps running next to it for
agents inside sandboxes.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["ServeHandleTransport", "dispatch_http"]

logger = logging.getLogger(__name__)


def _error(status: int, message: str, kind: str | None = None) -> tuple[int, str, bytes]:
    body = {"object": "error", "message": message, "type": kind or HTTPStatus(status).phrase.replace(" ", ""),
            "param": None, "code": status}
    return status, "application/json", json.dumps(body).encode()


def dispatch_http(server: Any, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
    """Answer one request with ``server`` (an :class:`~relax_gym.trainer.engines.http_server.EngineServer`):
    ``(status, content type, body bytes)``. Blocking (a generate waits for its batch): call it from a thread."""
    from relax_gym.trainer.engines.http_server import _encode, _HTTPError

    path = urlsplit(path).path.rstrip("/") or "/"
    body: Any = None
    if raw.strip():
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"the body is not valid JSON: {exc}")
    try:
        response = server.dispatch(method, path, body)
        return response.status, response.content_type, _encode(response)
    except _HTTPError as exc:
        return _error(exc.status, exc.message, exc.kind)
    except Exception as exc:  # noqa: BLE001 - an engine failure is a 500 answer, never a dead replica
        logger.exception("engine request %s %s failed", method, path)
        status = int(getattr(exc, "status_code", 500) or 500)
        return _error(status, f"{type(exc).__name__}: {exc}")


class ServeHandleTransport(httpx.AsyncBaseTransport):
    """httpx transport whose requests are ``handle.http.remote(method, path, body)`` calls on a deployment that
    answers with :func:`dispatch_http`'s triple. Connection-level failures (the replica died, the call could not
    be delivered) surface as ``httpx.ConnectError`` so the client's retry logic treats them like a refused
    connection; the answer itself is returned as the server wrote it."""

    def __init__(self, handle: Any, method_name: str = "http") -> None:
        self.handle = handle
        self.method_name = method_name

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raw = await request.aread()
        call = getattr(self.handle, self.method_name)
        try:
            status, content_type, payload = await call.remote(request.method, request.url.raw_path.decode(), raw)
        except Exception as exc:  # noqa: BLE001 - Serve / Ray errors: the replica could not answer
            if _is_ray_failure(exc):
                raise httpx.ConnectError(f"inference deployment unreachable: {type(exc).__name__}: {exc}", request=request) from exc
            raise
        return httpx.Response(status, headers={"content-type": content_type}, content=payload, request=request)


def _is_ray_failure(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith("ray.")
