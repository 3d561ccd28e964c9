"""The engine side of a push, seen from the actor: SGLang's weight and control endpoints over HTTP.

:class:`EngineAPI` is a small blocking HTTP client (``http.client`` keep-alive connections) of the endpoints a
push uses (``/pause_generation``, ``/update_weights_from_distributed``, ``/update_weights_from_disk``,
``/flush_cache``, ...), so the DCS drives a real SGLang server and the embedded engine alike without depending on
the engines package. :class:`EngineLink`
runs one engine's steps and raises :class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming the engine and
the step.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from relax_gym.trainer.dcs.coordinator import EngineInfo, TensorMeta
from relax_gym.trainer.dcs.errors import DCSEngineError

__all__ = ["EngineAPI", "EngineAPIError", "EngineFeatures", "EngineLink", "PendingRequest", "StageRequest"]


class EngineAPIError(RuntimeError):
    """An engine call failed: ``status`` is the HTTP status (None when the engine could not be reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class EngineFeatures(NamedTuple):
    """What an engine advertises beyond SGLang's protocol (:meth:`EngineLink.features`)."""

    flattened: bool  # load_format "flattened_bucket" (SGLang's; one broadcast per call)
    staging: bool  # weight_update_staging (ours): stage_id / seq, /apply_staged_weights
    socket: bool  # "socket" in weight_update_backends (ours): the tcp transport's plain socket stream


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _answer(path: str, status: int, raw: bytes | str) -> Any:
    """The JSON (else text) body of an answer; ``EngineAPIError`` with the engine's message for a status >= 400."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    try:
        body = json.loads(text)
    except ValueError:
        body = text
    if status >= 400:
        message = body
        if isinstance(body, Mapping):
            inner = body.get("error") if isinstance(body.get("error"), Mapping) else body
            message = inner.get("message", body)
        raise EngineAPIError(f"HTTP {status} from {path}: {message}", status)
    return body


def _readable(sock: socket.socket) -> bool:
    """Whether ``sock`` has something to read (or was closed) right now (``poll``: no limit on the descriptor)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


class _NeverReached(Exception):
    """Connecting to the engine failed: the request never left, so it is safe to send again."""


class _Connections:
    """Keep-alive HTTP/1.1 connections to one engine over ``http.client`` (about half the time per request of a
    general-purpose client: the push's control calls are a good part of a push's fixed cost), one per concurrent
    request, reused. An idle connection the engine closed is dropped before it is reused, so a request is never
    sent twice."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or (443 if self.https else 80)
        self.timeout_s = float(timeout_s)
        token = os.environ.get("RELAX_GYM_ENGINE_TOKEN")  # engines off loopback need it (engines/client.py: engine_token)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def send(self, method: str, path: str, payload: Any, timeout_s: float | None) -> http.client.HTTPConnection:
        """Send a request (JSON ``payload``, or none) on a connection of its own; read the answer with
        :meth:`answer`. ``_NeverReached`` when no connection could be made."""
        conn = self._take(self.timeout_s if timeout_s is None else timeout_s)
        body = None if payload is None else json.dumps(payload).encode()
        headers = {**self.headers, **({"Content-Type": "application/json"} if body is not None else {})}
        try:
            conn.request(method, path, body=body, headers=headers)
        except BaseException:
            conn.close()
            raise
        return conn

    def answer(self, conn: http.client.HTTPConnection) -> tuple[int, bytes]:
        """The status and body of the answer to the request sent on ``conn`` (which goes back to the idle ones)."""
        try:
            response = conn.getresponse()
            data = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            self._give(conn)
        return response.status, data

    def request(self, method: str, path: str, payload: Any = None, timeout_s: float | None = None) -> tuple[int, bytes]:
        return self.answer(self.send(method, path, payload, timeout_s))

    def _take(self, timeout_s: float) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                sock = conn.sock
                if sock is not None and not _readable(sock):  # readable while idle: the engine closed it
                    sock.settimeout(timeout_s)
                    return conn
                conn.close()
        factory = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = factory(self.host, self.port, timeout=timeout_s)
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise _NeverReached(f"{type(exc).__name__}: {exc}") from exc
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < 32:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class PendingRequest:
    """A POST sent at once from the calling thread, its answer read later: no thread hand-over before the request
    is on its way, so the engine starts on it while the caller goes on (the socket wire's staged push sends its
    bytes meanwhile). :meth:`ready`: the answer, or the connection's end, has arrived; :meth:`result` reads it
    (``EngineAPIError`` as :class:`EngineAPI` raises)."""

    def __init__(self, connections: _Connections, url: str, path: str, payload: Any, *, timeout_s: float) -> None:
        self.url, self.path, self._connections = url, path, connections
        try:
            self._conn: http.client.HTTPConnection | None = connections.send("POST", path, payload, timeout_s)
        except (_NeverReached, OSError, http.client.HTTPException) as exc:
            raise EngineAPIError(f"POST {url}{path}: {type(exc).__name__}: {exc}") from exc

    def ready(self) -> bool:
        sock = self._conn.sock if self._conn is not None else None
        return sock is None or _readable(sock)

    def result(self) -> Any:
        conn, self._conn = self._conn, None
        if conn is None:
            raise EngineAPIError(f"POST {self.url}{self.path}: the answer was read or dropped already")
        try:
            status, data = self._connections.answer(conn)
        except (OSError, http.client.HTTPException) as exc:
            raise EngineAPIError(f"POST {self.url}{self.path}: {type(exc).__name__}: {exc}") from exc
        return _answer(self.path, status, data)

    def close(self) -> None:
        """Drop the request unanswered (its connection is closed, not reused)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class EngineAPI:
    """Blocking client of an engine's weight / control endpoints (``url``: ``http://host:port``). Requests that
    never reached the engine are resent ``retries`` times."""

    def __init__(self, url: str, *, timeout_s: float = 300.0, retries: int = 1, backoff_s: float = 0.1) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries, self.backoff_s = int(retries), float(backoff_s)
        self._http = _Connections(self.url, timeout_s)

    def _call(self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None) -> Any:
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                status, data = self._http.request(method, path, payload, timeout_s)
            except _NeverReached as exc:  # never reached the engine: safe to resend
                last = exc
                if attempt < self.retries:
                    time.sleep(min(self.backoff_s * 2**attempt, 5.0))
                continue
            except (OSError, http.client.HTTPException) as exc:
                raise EngineAPIError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
            return _answer(path, status, data)
        raise EngineAPIError(f"{method} {self.url}{path}: {last} (after {self.retries + 1} attempts)") from last

    def health(self) -> bool:
        try:
            self._call("GET", "/health")
            return True
        except EngineAPIError:
            return False

    def pause_generation(self, mode: str = "retract") -> Any:
        return self._call("POST", "/pause_generation", {"mode": mode})

    def continue_generation(self) -> Any:
        return self._call("POST", "/continue_generation", {})

    def flush_cache(self) -> Any:
        return self._call("POST", "/flush_cache")

    def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int, world_size: int, *,
                                  group_name: str, backend: str) -> Any:
        return self._call("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": int(master_port), "rank_offset": int(rank_offset),
            "world_size": int(world_size), "group_name": group_name, "backend": backend})

    def destroy_weights_update_group(self, group_name: str) -> Any:
        return self._call("POST", "/destroy_weights_update_group", {"group_name": group_name})

    def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], *,
                                        group_name: str, weight_version: str | None = None, flush_cache: bool = True,
                                        load_format: str | None = None, stage_id: str | None = None,
                                        seq: int | None = None) -> Any:
        """SGLang's call; with ``stage_id`` / ``seq`` (ours) the engine stages the tensors instead of loading them."""
        return self._call("POST", "/update_weights_from_distributed", _drop_none({
            "names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
            "shapes": [[int(s) for s in shape] for shape in shapes], "group_name": group_name,
            "weight_version": weight_version, "flush_cache": flush_cache, "abort_all_requests": False,
            "load_format": load_format, "stage_id": stage_id, "seq": seq}))

    def stage_weights(self, calls: Sequence[tuple[Sequence[str], Sequence[str], Sequence[Sequence[int]]]], *,
                      group_name: str, stage_id: str, load_format: str | None = None,
                      timeout_s: float | None = None) -> PendingRequest:
        """Ours: every call (``(names, dtypes, shapes)``) of staged push ``stage_id`` in one request, answered once the
        engine received them all; sent now, answered later (:class:`PendingRequest`; ``timeout_s``: each wait for
        the engine, default the client's)."""
        return PendingRequest(self._http, self.url, "/stage_weights_from_distributed", _drop_none({
            "group_name": group_name, "stage_id": stage_id, "load_format": load_format,
            "calls": [{"names": list(names), "dtypes": [str(d).removeprefix("torch.") for d in dtypes],
                       "shapes": [[int(x) for x in shape] for shape in shapes]} for names, dtypes, shapes in calls]}),
            timeout_s=timeout_s if timeout_s is not None else self.timeout_s)

    def apply_staged_weights(self, stage_id: str, calls: int, *, weight_version: str | None = None) -> Any:
        return self._call("POST", "/apply_staged_weights", _drop_none({
            "stage_id": stage_id, "calls": int(calls), "weight_version": weight_version}))

    def discard_staged_weights(self, stage_id: str | None = None) -> Any:
        return self._call("POST", "/discard_staged_weights", _drop_none({"stage_id": stage_id}))

    def update_weights_from_disk(self, model_path: str, *, weight_version: str | None = None,
                                 flush_cache: bool = True) -> Any:
        return self._call("POST", "/update_weights_from_disk", _drop_none({
            "model_path": str(model_path), "weight_version": weight_version, "abort_all_requests": False,
            "flush_cache": flush_cache}))

    def get_weight_version(self) -> str | None:
        """``/get_weight_version``, or ``/model_info``'s ``weight_version`` where that endpoint is gone."""
        try:
            data = self._call("GET", "/get_weight_version")
        except EngineAPIError as exc:
            if exc.status != 404:
                raise
            data = self._call("GET", "/model_info")
        return data.get("weight_version") if isinstance(data, Mapping) else None

    def get_server_info(self) -> Any:
        """``/get_server_info`` (``/server_info`` on SGLang versions that dropped the old name)."""
        try:
            return self._call("GET", "/get_server_info")
        except EngineAPIError as exc:
            if exc.status != 404:
                raise
            return self._call("GET", "/server_info")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineAPI:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StageRequest:
    """A staged push's one request to an engine (:meth:`EngineLink.stage_all`), answered once the engine holds every
    call. :meth:`poll`: True once answered, False while pending, :class:`DCSEngineError` naming the engine if it
    refused or went away; :meth:`wait`: block (at most ``timeout_s``, default the request's own bound) for the
    answer; :meth:`close`: drop it unanswered."""

    step = "stage_weights_from_distributed"

    def __init__(self, link: EngineLink, pending: PendingRequest) -> None:
        self.link, self._pending = link, pending
        self._done = False

    def poll(self) -> bool:
        if self._done:
            return True
        if not self._pending.ready():
            return False
        return self.wait()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once answered; False if ``timeout_s`` passed first (then the request stays pending)."""
        if self._done:
            return True
        if timeout_s is not None:
            deadline = time.monotonic() + timeout_s
            while not self._pending.ready():
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
        self._done = True
        self.link._call(self.step, self._pending.result)
        return True

    def close(self) -> None:
        self._done = True
        self._pending.close()


class EngineLink:
    """The engine-side steps of a push for one engine, over its HTTP protocol. Each method raises
    :class:`DCSEngineError` naming the engine and the step."""

    def __init__(self, info: EngineInfo, *, timeout_s: float = 300.0, retries: int = 1) -> None:
        self.info = info
        self.timeout_s = float(timeout_s)
        self.client = EngineAPI(info.url, timeout_s=timeout_s, retries=retries, backoff_s=0.1)

    @property
    def url(self) -> str:
        return self.info.url

    @property
    def rank(self) -> int:
        return self.info.rank

    def _call(self, step: str, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except EngineAPIError as exc:
            raise DCSEngineError(self.url, step, exc) from exc
        if isinstance(result, Mapping) and result.get("success") is False:
            raise DCSEngineError(self.url, step, result.get("message", "the engine answered success=false"))
        return result

    def pause(self, mode: str = "retract") -> None:
        self._call("pause_generation", lambda: self.client.pause_generation(mode))

    def resume(self) -> None:
        self._call("continue_generation", self.client.continue_generation)

    def flush(self, timeout_s: float = 30.0) -> None:
        """``/flush_cache``; SGLang refuses while requests are still being retracted, so it is retried."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client.flush_cache()
                return
            except EngineAPIError as exc:
                if time.monotonic() >= deadline:
                    raise DCSEngineError(self.url, "flush_cache", exc) from exc
                time.sleep(0.1)

    def join_group(self, master_address: str, master_port: int, world_size: int, group_name: str, backend: str) -> None:
        self._call("init_weights_update_group", lambda: self.client.init_weights_update_group(
            master_address, master_port, self.rank, world_size, group_name=group_name, backend=backend))

    def leave_group(self, group_name: str) -> None:
        """Best effort: an engine that is gone has left already."""
        try:
            self.client.destroy_weights_update_group(group_name)
        except EngineAPIError:
            pass

    def receive_distributed(self, metas: Sequence[TensorMeta], group_name: str, load_format: str | None,
                            weight_version: str | None) -> None:
        self._call("update_weights_from_distributed", lambda: self.client.update_weights_from_distributed(
            [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas], group_name=group_name,
            weight_version=weight_version, flush_cache=False, load_format=load_format))

    def stage_distributed(self, metas: Sequence[TensorMeta], group_name: str, load_format: str | None, stage_id: str,
                          seq: int) -> None:
        """Call ``seq`` of staged push ``stage_id``: the engine receives it into its staging area and keeps
        generating on its current weights."""
        self._call("update_weights_from_distributed", lambda: self.client.update_weights_from_distributed(
            [m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas], group_name=group_name,
            flush_cache=False, load_format=load_format, stage_id=stage_id, seq=seq))

    def stage_all(self, calls: Sequence[Sequence[TensorMeta]], group_name: str, load_format: str | None,
                  stage_id: str) -> StageRequest:
        """Announce every call of staged push ``stage_id`` in one request (the socket wire then sends them back to
        back), sent from this thread at once; the returned :class:`StageRequest` says when the engine holds them
        all. Each wait for its answer is bounded by the client's timeout per call, times the calls."""
        try:
            pending = self.client.stage_weights(
                [([m.name for m in metas], [m.dtype for m in metas], [list(m.shape) for m in metas]) for metas in calls],
                group_name=group_name, stage_id=stage_id, load_format=load_format,
                timeout_s=self.timeout_s * max(1, len(calls)))
        except EngineAPIError as exc:
            raise DCSEngineError(self.url, "stage_weights_from_distributed", exc) from exc
        return StageRequest(self, pending)

    def apply_staged(self, stage_id: str, calls: int, weight_version: str) -> None:
        """Swap the ``calls`` staged calls of ``stage_id`` into the model as ``weight_version`` (engine paused)."""
        self._call("apply_staged_weights", lambda: self.client.apply_staged_weights(
            stage_id, calls, weight_version=weight_version))

    def discard_staged(self, stage_id: str) -> None:
        """Best effort: the engine drops an unfinished stage anyway when the next one begins."""
        try:
            self.client.discard_staged_weights(stage_id)
        except EngineAPIError:
            pass

    def load_from_disk(self, path: str, weight_version: str) -> None:
        self._call("update_weights_from_disk", lambda: self.client.update_weights_from_disk(
            path, weight_version=weight_version, flush_cache=False))

    def weight_version(self) -> str | None:
        return self._call("get_weight_version", self.client.get_weight_version)

    def supports_flattened(self) -> bool:
        """Whether the engine advertises SGLang's ``flattened_bucket`` load format (our embedded engine does)."""
        return self.features()[0]

    def features(self) -> EngineFeatures:
        """What the engine advertises in ``/get_server_info``: SGLang's ``flattened_bucket`` load format, our
        ``weight_update_staging``, and ``socket`` among our ``weight_update_backends`` (the tcp transport's plain
        socket stream, :mod:`~relax_gym.trainer.dcs.wire`). The embedded engine with the DCS's receiver has all
        three; SGLang none of ours."""
        info = self._call("get_server_info", self.client.get_server_info)
        if not isinstance(info, Mapping):
            return EngineFeatures(False, False, False)
        return EngineFeatures("flattened_bucket" in (info.get("weight_update_load_formats") or []),
                              info.get("weight_update_staging") is True,
                              "socket" in (info.get("weight_update_backends") or []))

    def close(self) -> None:
        self.client.close()


