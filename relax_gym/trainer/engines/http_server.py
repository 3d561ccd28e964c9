"""SGLang's native HTTP endpoints in front of an :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine`, on
the stdlib ``ThreadingHTTPServer`` (one thread per connection; the engine batches across them).

    server = serve(engine)                     # 127.0.0.1, a free port
    client = EngineClient(server.url)
    ...
    server.close()

Endpoints (request bodies: :mod:`~relax_gym.trainer.engines.protocol`; responses as SGLang's):

==========================================  ======  ============================================================
``/generate``                               POST    ``GenerateResponse`` JSON, a list for a batch request
                                                    (PUT too, as SGLang)
``/health``                                 GET     200 while the scheduler thread lives (no generate)
``/health_generate``                        GET     200 after a 1-token greedy generate, else 503 (while paused:
                                                    200 without generating, as a generate would wait)
``/flush_cache``                            GET/    200, text (the prefix cache is emptied)
                                            POST
``/pause_generation``                       POST    ``{"mode": "abort" | "retract" | "in_place"}`` →
                                                    ``{"message": ..., "status": "ok"}``
``/continue_generation``                    POST    ``{"message": ..., "status": "ok"}``
``/update_weights_from_disk``               POST    ``{"success", "message", "num_paused_requests"}``
``/update_weights_from_tensor``             POST    ``{"success", "message"}``
``/init_weights_update_group``              POST    ``{"success", "message"}``
``/update_weights_from_distributed``        POST    ``{"success", "message"}`` (ours: with ``stage_id`` / ``seq``
                                                    the tensors are staged, the model left alone)
``/stage_weights_from_distributed``         POST    ours: ``{"group_name", "stage_id", "load_format", "calls": [{"names",
                                                    "dtypes", "shapes"}, ...]}`` → ``{"success", "message"}`` once
                                                    every call is staged (one request for a whole push)
``/apply_staged_weights``                   POST    ours: ``{"stage_id", "calls", "weight_version"}`` →
                                                    ``{"success", "message"}`` (the staged push goes live)
``/discard_staged_weights``                 POST    ours: ``{"stage_id"}`` → ``{"success", "message"}``
``/destroy_weights_update_group``           POST    ``{"success", "message"}``
``/update_weight_version``                  POST    ``{"success", "message", "new_version"}``
``/get_model_info``                         GET     ``{"model_path", "tokenizer_path", "is_generation",
                                                    "preferred_sampling_params", "weight_version"}``
``/get_weight_version``                     GET     ``{"weight_version"}``
``/get_server_info``                        GET     engine settings and batching statistics (our fields)
``/get_weights_checksum``                   GET/    ``{"weight_version", "algorithm": "sha256", "checksums":
                                            POST    {name: hex}}`` (ours; body ``{"names": [...]}`` or none)
``/v1/chat/completions``                    POST    OpenAI chat completion (tools; ``stream`` as SSE), recorded
                                                    by session (:mod:`~relax_gym.trainer.gateway.api`)
``/v1/models``                              GET     the served model
``/v1/relax/sessions``                      GET     recorded session ids and call counts
``/v1/relax/sessions/{id}``                 GET/    a session's recorded calls / drop it
                                            DELETE
==========================================  ======  ============================================================

Errors: invalid JSON or a body that fails its schema → 400 ``{"object": "error", "message": "<field>: <why>",
"type": "BadRequest", "code": 400}`` (the field path first); a refused request (media / prompt mismatch, an
unknown tensor name, ...) → 400 with the reason (weight endpoints answer ``{"success": false, "message"}`` with
400, as SGLang); an engine failure → 500 with the exception's message; an unknown path → 404, a known path with
another method → 405. A handler never lets an exception escape: the server keeps serving. The ``/v1`` routes
answer errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``. This module only routes;
the OpenAI logic lives in :mod:`~relax_gym.trainer.gateway.api` (``server.openai``).

Loopback by default. The server reads ``file://`` / path media items from its own filesystem. Binding another
interface takes a ``token``: then every request needs ``Authorization: Bearer <token>``, or an episode key issued
by ``server.openai.keys`` (those reach only ``/v1/chat/completions``, ``/v1/models`` and their own session);
without a token a non-loopback ``host`` is refused (``ValueError``).

:func:`serve_openai` serves only the ``/v1`` routes of an :class:`~relax_gym.trainer.gateway.api.OpenAIAPI`
(over any engine of its duck type), with the same routing code, authentication and streaming as
:class:`EngineServer`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

from relax_gym.omni.api_streams import sse
from relax_gym.trainer.engines.admin_protocol import (
    ApplyStagedWeightsReqInput,
    ContinueGenerationReqInput,
    DestroyWeightsUpdateGroupReqInput,
    DiscardStagedWeightsReqInput,
    FlushCacheReqInput,
    InitWeightsUpdateGroupReqInput,
    PauseGenerationReqInput,
    StageWeightsReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromTensorReqInput,
    UpdateWeightVersionReqInput,
    WeightsChecksumReqInput,
)
from relax_gym.trainer.engines.bearer import bearer_of, token_matches
from relax_gym.trainer.engines.client import engine_token
from relax_gym.trainer.engines.protocol import GenerateReqInput
from relax_gym.trainer.engines.token_stream import TextDeltas, TokenFeed, start_streamed
from relax_gym.trainer.engines.validation import parse_request

__all__ = ["EngineServer", "OpenAIServer", "serve", "serve_openai"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 31  # 2 GiB: a tensor payload can be large


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, *, kind: str | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or HTTPStatus(status).phrase.replace(" ", "")
        self.body = body


class _Response:
    """A response; ``stream`` (byte strings) goes out with chunked transfer encoding instead of ``body``."""

    def __init__(self, status: int, body: Any, content_type: str = "application/json",
                 headers: dict[str, str] | None = None, stream: Iterable[bytes] | None = None) -> None:
        self.status, self.body, self.content_type = status, body, content_type
        self.headers = headers or {}
        self.stream = stream


class GenerateEvents:
    """``/generate``'s Server-Sent Events for one streamed request, as SGLang sends them by default: each event the
    response so far (cumulative ``text`` and ``output_ids``, ``meta_info`` with ``completion_tokens`` and no
    ``finish_reason`` yet), the whole response last, then ``data: [DONE]``. A failure after the start is an event
    ``{"error": {...}}`` before ``[DONE]``."""

    live = True

    def __init__(self, feed: TokenFeed, engine: Any) -> None:
        self.feed = feed
        self.text = TextDeltas(lambda ids: engine.decode(ids, skip_special_tokens=True))

    def __iter__(self) -> Iterator[bytes]:
        ids: list[int] = []
        try:
            for token in self.feed:
                ids.append(token)
                self.text.push(token)
                yield sse({"text": self.text.given, "output_ids": list(ids),
                              "meta_info": {"completion_tokens": len(ids), "finish_reason": None}})
            yield sse(self.feed.wait().to_json())
        except Exception as exc:  # noqa: BLE001 - the headers are out: the failure goes as an event
            logger.exception("a streamed generate failed")
            yield sse({"error": {"message": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__}})
        yield b"data: [DONE]\n\n"


def _json(body: Any, status: int = 200) -> _Response:
    return _Response(status, body)


def _text(body: str, status: int = 200) -> _Response:
    return _Response(status, body, "text/plain; charset=utf-8")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    if str(host).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host).strip("[]")).is_loopback
    except ValueError:
        return False


class _HTTPService:
    """The HTTP server shared by :class:`EngineServer` and :class:`OpenAIServer`: ``.url``, ``.close()``, a
    context manager; ``.openai`` serves the ``/v1`` routes, :meth:`_build_routes` the others; ``token`` guards
    them all."""

    def __init__(self, api: Any, host: str, port: int, *, token: str | None, name: str) -> None:
        if token is not None and not (isinstance(token, str) and token.strip() == token and token):
            raise ValueError("token must be a non-empty string without surrounding whitespace")
        if token is None and not is_loopback(host):
            raise ValueError(f"host={host!r} is not a loopback address: serving it without a token would let anyone on "
                             "that network generate, read recorded sessions and (engine servers) replace weights; pass "
                             "token=... (clients then send 'Authorization: Bearer <token>')")
        self.openai = api
        self.token = token
        self._routes = self._build_routes()
        handler = type(f"{type(self).__name__}Handler", (_Handler,), {"server_ref": self})
        self._httpd = _Server((host, port), handler)
        self._httpd.daemon_threads = True
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{name}-http-{self.port}", daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def url(self) -> str:
        host = self.host if ":" not in str(self.host) else f"[{self.host}]"
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
        self._after_close()

    def _after_close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build_routes(self) -> dict[str, tuple[tuple[str, ...], Callable[[Any], _Response]]]:
        return {}

    def dispatch(self, method: str, path: str, body: Any, headers: Any = None) -> _Response:
        if path.startswith("/v1/"):
            return self._dispatch_openai(method, path, body, headers)
        if self.token is not None:
            sent = bearer_of(headers)
            if not token_matches(sent, self.token):
                raise (_HTTPError(403, f"{path} takes the server token; episode keys reach only /v1 routes")
                       if sent is not None and self.openai is not None and self.openai.keys.session_of(sent) is not None else
                       _HTTPError(401, "this server needs 'Authorization: Bearer <token>'"))
        route = self._routes.get(path)
        if route is None:
            raise _HTTPError(404, f"no endpoint {path!r}")
        methods, fn = route
        if method not in methods:
            raise _HTTPError(405, f"{path} takes {' or '.join(methods)}, not {method}")
        return fn(body)

    def _dispatch_openai(self, method: str, path: str, body: Any, headers: Any) -> _Response:
        if self.openai is None:
            raise _HTTPError(404, f"no endpoint {path!r}: this server has no agents' routes (relax_gym.trainer.gateway)")
        reply = self.openai.route(method, path, body, headers, self.token)
        return _Response(reply.status, reply.body, reply.content_type, headers=reply.headers, stream=reply.stream)


class OpenAIServer(_HTTPService):
    """Only the ``/v1`` routes of an :class:`~relax_gym.trainer.gateway.api.OpenAIAPI` (``.openai``):
    chat completions (streaming included), models, sessions. ``.url``, ``.close()``; a context manager."""

    def __init__(self, api: Any, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None) -> None:
        super().__init__(api, host, port, token=token, name="openai")


class EngineServer(_HTTPService):
    """A running server: ``.url`` (``http://host:port``), ``.close()``; a context manager. ``openai``: the agents'
    API to mount on the ``/v1`` routes (:class:`~relax_gym.trainer.gateway.api.OpenAIAPI`, which
    :func:`relax_gym.trainer.gateway.mount.serve_with_agents` builds; ``None``: inference only, ``/v1`` is 404), then
    ``.openai``; ``token``: the bearer token every request needs (required to bind a non-loopback host)."""

    def __init__(self, engine: Any, host: str = "127.0.0.1", port: int = 0, *, close_engine: bool = False,
                 openai: Any = None, token: str | None = None) -> None:
        self.engine = engine
        self.close_engine = close_engine
        super().__init__(openai, host, port, token=token, name="engine")

    def _after_close(self) -> None:
        if self.close_engine:
            self.engine.close()

    # ------------------------------------------------------------------------------------------ routes

    def _build_routes(self) -> dict[str, tuple[tuple[str, ...], Callable[[Any], _Response]]]:
        return {
            "/generate": (("POST", "PUT"), self._generate),
            "/health": (("GET", "POST"), self._health),
            "/health_generate": (("GET", "POST"), self._health_generate),
            "/flush_cache": (("GET", "POST"), self._flush_cache),
            "/pause_generation": (("POST",), self._pause),
            "/continue_generation": (("POST",), self._continue),
            "/update_weights_from_disk": (("POST",), self._update_from_disk),
            "/update_weights_from_tensor": (("POST",), self._update_from_tensor),
            "/init_weights_update_group": (("POST",), self._init_group),
            "/update_weights_from_distributed": (("POST",), self._update_from_distributed),
            "/stage_weights_from_distributed": (("POST",), self._stage_weights),
            "/apply_staged_weights": (("POST",), self._apply_staged),
            "/discard_staged_weights": (("POST",), self._discard_staged),
            "/destroy_weights_update_group": (("POST",), self._destroy_group),
            "/update_weight_version": (("POST",), self._update_weight_version),
            "/get_model_info": (("GET",), self._model_info),
            "/get_weight_version": (("GET",), self._weight_version),
            "/get_server_info": (("GET",), self._server_info),
            "/get_weights_checksum": (("GET", "POST"), self._weights_checksum),
        }

    @staticmethod
    def _parse(model: type, body: Any) -> Any:
        try:
            return parse_request(model, body)
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from None

    def _generate(self, body: Any) -> _Response:
        from relax_gym.trainer.engines.embedded import EngineRequestError

        req = self._parse(GenerateReqInput, body)
        if req.stream:
            return self._generate_streamed(req)
        try:
            out = self.engine.generate(req)
        except EngineRequestError as exc:
            raise _HTTPError(400, str(exc)) from None
        return _json([o.to_json() for o in out] if isinstance(out, list) else out.to_json())

    def _generate_streamed(self, req: Any) -> _Response:
        """``stream: true``: Server-Sent Events in SGLang's format as the tokens are sampled. A refused request is
        still a 400 (the stream starts with the first token or the end)."""
        from relax_gym.trainer.engines.embedded import EngineRequestError

        feed = start_streamed(lambda on_token: self.engine.generate(req, on_token=on_token), name="generate-stream")
        try:
            feed.first()
        except EngineRequestError as exc:
            raise _HTTPError(400, str(exc)) from None
        return _Response(200, None, "text/event-stream", stream=GenerateEvents(feed, self.engine))

    def _health(self, body: Any) -> _Response:
        return _text("", 200 if self.engine.alive else 503)

    def _health_generate(self, body: Any) -> _Response:
        return _text("", 200 if self.engine.health_check() else 503)

    def _flush_cache(self, body: Any) -> _Response:
        self._parse(FlushCacheReqInput, body)
        ok = self.engine.flush_cache()
        return _text("Cache flushed.\n", 200 if ok else 400)

    def _pause(self, body: Any) -> _Response:
        req = self._parse(PauseGenerationReqInput, body)
        self.engine.pause(req.mode)
        return _json({"message": "Generation paused successfully.", "status": "ok"})

    def _continue(self, body: Any) -> _Response:
        self._parse(ContinueGenerationReqInput, body)
        self.engine.resume()
        return _json({"message": "Generation continued successfully.", "status": "ok"})

    def _weights(self, fn: Callable[[], str], weight_version: str | None = None, **extra: Any) -> _Response:
        from relax_gym.trainer.engines.embedded import EngineRequestError

        try:
            message = fn()
        except EngineRequestError as exc:
            return _json({"success": False, "message": str(exc), **extra}, 400)
        if weight_version is not None:
            message += f" Weight version updated to {weight_version}."
        return _json({"success": True, "message": message, **extra})

    def _update_from_disk(self, body: Any) -> _Response:
        req = self._parse(UpdateWeightFromDiskReqInput, body)
        return self._weights(lambda: self.engine.update_from_disk(
            req.model_path, load_format=req.load_format, weight_version=req.weight_version,
            abort_all_requests=req.abort_all_requests), req.weight_version, num_paused_requests=0)

    def _update_from_tensor(self, body: Any) -> _Response:
        req = self._parse(UpdateWeightsFromTensorReqInput, body)
        return self._weights(lambda: self.engine.update_weights_from_tensor(
            req.serialized_named_tensors, load_format=req.load_format, weight_version=req.weight_version,
            abort_all_requests=req.abort_all_requests), req.weight_version)

    def _init_group(self, body: Any) -> _Response:
        req = self._parse(InitWeightsUpdateGroupReqInput, body)
        return self._weights(lambda: self.engine.init_weights_update_group(
            req.master_address, req.master_port, req.rank_offset, req.world_size, group_name=req.group_name,
            backend=req.backend))

    def _update_from_distributed(self, body: Any) -> _Response:
        req = self._parse(UpdateWeightsFromDistributedReqInput, body)
        if req.stage_id is not None:
            return self._weights(lambda: self.engine.stage_weights_from_distributed(
                req.names, req.dtypes, req.shapes, group_name=req.group_name, stage_id=req.stage_id, seq=req.seq,
                load_format=req.load_format))
        return self._weights(lambda: self.engine.update_weights_from_distributed(
            req.names, req.dtypes, req.shapes, group_name=req.group_name, weight_version=req.weight_version,
            abort_all_requests=req.abort_all_requests, load_format=req.load_format), req.weight_version)

    def _stage_weights(self, body: Any) -> _Response:
        req = self._parse(StageWeightsReqInput, body)
        return self._weights(lambda: self.engine.stage_weights(
            [(c.names, c.dtypes, c.shapes) for c in req.calls], group_name=req.group_name, stage_id=req.stage_id,
            load_format=req.load_format))

    def _apply_staged(self, body: Any) -> _Response:
        req = self._parse(ApplyStagedWeightsReqInput, body)
        return self._weights(lambda: self.engine.apply_staged_weights(req.stage_id, req.calls, req.weight_version),
                             req.weight_version)

    def _discard_staged(self, body: Any) -> _Response:
        req = self._parse(DiscardStagedWeightsReqInput, body)
        return self._weights(lambda: self.engine.discard_staged_weights(req.stage_id))

    def _destroy_group(self, body: Any) -> _Response:
        req = self._parse(DestroyWeightsUpdateGroupReqInput, body)
        return self._weights(lambda: self.engine.destroy_weights_update_group(req.group_name))

    def _update_weight_version(self, body: Any) -> _Response:
        req = self._parse(UpdateWeightVersionReqInput, body)
        self.engine.update_weight_version(req.new_version, abort_all_requests=req.abort_all_requests)
        return _json({"success": True, "message": f"Weight version updated to {req.new_version}",
                      "new_version": req.new_version})

    def _model_info(self, body: Any) -> _Response:
        return _json({
            "model_path": self.engine.model_path, "tokenizer_path": self.engine.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.engine.weight_version,
        })

    def _weight_version(self, body: Any) -> _Response:
        return _json({"weight_version": self.engine.weight_version})

    def _server_info(self, body: Any) -> _Response:
        return _json({
            "engine": "relax_gym.embedded", "max_batch": self.engine.max_batch,
            "batch_window_s": self.engine.batch_window_s, "weight_version": self.engine.weight_version,
            "stats": self.engine.stats(), "weight_update_load_formats": list(getattr(self.engine, "weight_update_load_formats", ())),
            "weight_update_staging": bool(getattr(self.engine, "weight_update_staging", False)),
            "weight_update_backends": list(getattr(self.engine, "weight_update_backends", None) or (
                ["gloo", "nccl"] if str(getattr(self.engine, "device", "cpu")).startswith("cuda") else ["gloo"])),
        })

    def _weights_checksum(self, body: Any) -> _Response:
        from relax_gym.trainer.engines.embedded import EngineRequestError

        req = self._parse(WeightsChecksumReqInput, body)
        try:
            checksums = self.engine.weights_checksum(req.names)
        except EngineRequestError as exc:
            raise _HTTPError(400, str(exc)) from None
        return _json({"weight_version": self.engine.weight_version, "algorithm": "sha256", "checksums": checksums})


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the stdlib's 5 drops concurrent connects (a 1 s SYN retry each)
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    server_ref: EngineServer
    protocol_version = "HTTP/1.1"
    server_version = "relax-gym-embedded-engine"
    # headers and body go out as two writes; with Nagle on, the body waits for the client's delayed ACK (~40 ms)
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - %s", self.address_string(), format % args)

    def _handle(self, method: str) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        try:
            try:
                raw = self._read_body()
            except _HTTPError:
                self.close_connection = True  # the rest of the body may still be on the wire
                raise
            body = _parse_json(raw)  # the body was read in full: the connection stays usable
            response = self.server_ref.dispatch(method, path, body, self.headers)
            payload = _encode(response)
        except _HTTPError as exc:
            response = _json(_error_body(path, exc.status, exc.message, exc.kind), exc.status)
            payload = _encode(response)
        except Exception as exc:
            logger.exception("engine request failed")
            status = int(getattr(exc, "status_code", 500) or 500)
            response = _json(_error_body(path, status, f"{type(exc).__name__}: {exc}",
                                         HTTPStatus(status).phrase.replace(" ", "")), status)
            payload = _encode(response)
        try:
            self.send_response(response.status)
            if self.close_connection:  # tell the client, or it may reuse a socket we are about to close
                self.send_header("Connection", "close")
            self.send_header("Content-Type", response.content_type)
            streamed = not isinstance(payload, bytes)
            if streamed:  # a stream: chunked, one event per chunk
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(payload)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if streamed:
                for event in payload:  # a live stream's events are written as its generator yields them
                    if event:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), bytes(event)))
                        self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception:
            self.close_connection = True
            logger.exception("sending the response failed")

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = self._read_chunked()
        else:
            try:
                n = int(length or 0)
            except ValueError:
                raise _HTTPError(400, f"bad Content-Length {length!r}") from None
            if n > MAX_BODY_BYTES:
                raise _HTTPError(413, f"body of {n} bytes exceeds {MAX_BODY_BYTES}")
            raw = self.rfile.read(n) if n else b""
        return raw

    def _read_chunked(self) -> bytes:
        parts = []
        total = 0
        while True:
            line = self.rfile.readline().strip()
            try:
                size = int(line.split(b";")[0], 16)
            except ValueError:
                raise _HTTPError(400, f"bad chunk size line {line[:40]!r}") from None
            if size == 0:
                self.rfile.readline()
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                raise _HTTPError(413, "chunked body too large")
            parts.append(self.rfile.read(size))
            self.rfile.readline()

def _parse_json(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _HTTPError(400, f"the body is not valid JSON: {exc}") from None


def _error_body(path: str, status: int, message: str, kind: str) -> dict[str, Any]:
    """SGLang's error shape, or OpenAI's for the ``/v1`` routes."""
    if path.startswith("/v1/"):
        return {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                          "param": None, "code": status}}
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def _encode(response: _Response) -> bytes | Iterable[bytes]:
    """The body's bytes; a stream's events, all of them (encoded before anything is sent, so a failure is still an
    error response), or, for a live stream (``stream.live``: events made as the engine generates), the stream
    itself, sent event by event (it reports its own failures as events)."""
    if response.stream is not None:
        if getattr(response.stream, "live", False):
            return response.stream
        return [bytes(event) for event in response.stream if event]
    if response.content_type.startswith("application/json"):
        return json.dumps(response.body, allow_nan=False).encode()
    return str(response.body).encode()


def serve(engine: Any, host: str = "127.0.0.1", port: int = 0, *, close_engine: bool = False,
          openai: Any = None, token: str | None = None) -> EngineServer:
    """Serve ``engine`` on ``host:port`` (port 0: a free one) in a background thread; returns the running
    :class:`EngineServer` (``.url``, ``.close()``, ``.openai``). ``close_engine``: close the engine with the
    server; ``openai``: the agents' API on ``/v1`` (see :class:`EngineServer`); ``token``: the bearer token every
    request must carry (an episode key from ``.openai.keys`` does for the ``/v1`` routes); a non-loopback ``host``
    needs one."""
    if token is None:
        token = engine_token()
    return EngineServer(engine, host, port, close_engine=close_engine, openai=openai, token=token)


def serve_openai(api: Any, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None) -> OpenAIServer:
    """Serve only the ``/v1`` routes of ``api`` (an :class:`~relax_gym.trainer.gateway.api.OpenAIAPI`,
    over any engine of its duck type) on ``host:port``; returns the running :class:`OpenAIServer` (``.url``,
    ``.close()``, ``.openai``). ``token`` as for :func:`serve`."""
    return OpenAIServer(api, host, port, token=token)
