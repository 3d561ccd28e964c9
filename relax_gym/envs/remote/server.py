"""An HTTP server for one registered environment: ``relax-gym envs serve ID`` or
``python -m relax_gym.envs.remote.server ID``.

Each session is one env instance (one stream of episodes); the client then resets, steps and closes it. The env is
made with the manifest's kwargs, then the server's own (``kwargs=`` / ``--kwargs``, fixed for the process), then the
constructor kwargs the client sends, which are refused (403, the keys named) unless the operator allowed each by name
(``allow_kwargs=`` / ``--allow-kwarg NAME``); some are never taken from a client (:func:`never_from_client`). Routes (JSON in, JSON out; ``Authorization: Bearer <token>`` on every request when
the server has a token):

- ``GET  /v1/health``: ``{"ok": true, "env_id", "sessions"}``
- ``GET  /v1/envs/<id>``: what the env is: modalities, spaces, reward bounds, turn limit, metadata, protocol
- ``POST /v1/envs/<id>/sessions`` ``{"kwargs": {...}, "media": "ref"|"inline"}``: 201 ``{"session", ...}``
- ``POST /v1/envs/<id>/sessions/<sid>/reset`` ``{"seed", "options"}``: ``{"observation", "info"}``
- ``POST /v1/envs/<id>/sessions/<sid>/step`` ``{"action"}``: ``{"observation", "reward", "terminated",
  "truncated", "info"}``
- ``DELETE /v1/envs/<id>/sessions/<sid>``: closes the env and frees the session

A failed request answers ``{"error": {"type", "message", "culprit"}}`` with a 4xx status for a bad request and 500
when the env itself raised (``type`` is the exception's class, ``message`` its text, ``traceback`` the server's) or
its reply could not be encoded (the culprit names the field, e.g. ``info['x']``); every request gets an answer.
Session ids are random 128-bit values. The server binds loopback unless told otherwise and refuses a non-loopback
address without a token.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from relax_gym.envs import registry
from relax_gym.envs.remote.access import TOKEN_VAR, is_loopback
from relax_gym.envs.remote.wire import (
    MEDIA_MODES,
    PROTOCOL,
    Spool,
    decode_value,
    encode_messages,
    encode_value,
    error_body,
)

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
MAX_BODY_BYTES = 64 << 20
BODY_TIMEOUT_S = 60.0  # a request whose body does not arrive within this is answered 408 (its thread freed)

# Constructor kwargs a client may never choose, even when the operator allows them by name: they decide where code
# runs (runner, sandbox, backend) or which host files are read or written (datasets, folders, files, paths).
NEVER_FROM_CLIENT = frozenset({"runner", "sandbox", "backend", "dataset"})
NEVER_FROM_CLIENT_SUFFIXES = ("dir", "path", "root", "file", "files")
_DIGITS = re.compile(r"[0-9]+")


def never_from_client(name: str) -> bool:
    """Whether a constructor kwarg is never taken from a client: ``runner``, ``sandbox``, ``backend``, ``dataset``,
    and any name ending in ``dir``, ``path``, ``root``, ``file`` or ``files`` (``data_dir``, ``cache_path``, ...)."""
    low = name.lower()
    return low in NEVER_FROM_CLIENT or low.endswith(NEVER_FROM_CLIENT_SUFFIXES)


def _forbidden_keys(value: Any, where: str) -> list[str]:
    """Keys anywhere inside an allowed kwarg's value that are never taken from a client (e.g. ``video.cache_dir``)."""
    found: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            name = f"{where}.{k}"
            if never_from_client(str(k)):
                found.append(name)
            found += _forbidden_keys(v, name)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _forbidden_keys(v, f"{where}[{i}]")
    return found


class ServeError(ValueError):
    """The server cannot start with these settings (e.g. a public address without a token)."""


class _Reply(Exception):
    """Raised inside a route: answer ``status`` with ``body`` (an error body)."""

    def __init__(self, status: int, kind: str, message: str, culprit: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(kind, message, culprit, **extra)


def describe(env: Any, env_id: str) -> dict[str, Any]:
    """The env's surface as JSON: what a client needs to stand in for it."""
    base = env.unwrapped
    space = env.action_space
    obs_space = env.observation_space
    spec_ = registry.spec(env_id)
    return {
        "protocol": PROTOCOL,
        "env_id": env_id,
        "description": spec_.description,
        "modalities": list(spec_.modalities),
        "metadata": encode_value(dict(env.metadata)),
        "action_space": {"type": type(space).__name__, "max_length": getattr(space, "max_length", None)},
        "observation_space": {"type": type(obs_space).__name__, "media_kinds": list(getattr(obs_space, "media_kinds", ()))},
        "reward_bounds": list(getattr(base, "reward_bounds", (0.0, 1.0))),
        "max_turns": getattr(base, "max_turns", None),
    }


@dataclass
class _Session:
    id: str
    env: Any
    media: str
    spool: Spool
    lock: threading.Lock = field(default_factory=threading.Lock)  # held by the request using the env, and to close it
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False  # set (under ``lock``) when the env is closed: a request that looked it up before answers 404


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    app: EnvServer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """End the keep-alive connections still open (their threads would otherwise go on serving)."""
        with self._open_lock:
            open_, self._open = list(self._open), set()
        for sock in open_:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection per client env
    disable_nagle_algorithm = True  # headers and body are two writes: without this, each reply waits ~40 ms for an ACK
    server_version = "relax-gym-env-server"
    timeout = 900  # seconds an idle keep-alive connection is kept

    def _serve(self) -> None:
        try:
            status, body = self._answer()
        except Exception as exc:  # whatever happens, the client gets an answer (never a dropped request)
            log.error("%s %s failed", self.command, self.path, exc_info=exc)
            status, body = 500, error_body(type(exc).__name__, f"{self.command} {self.path.split('?', 1)[0]}: {exc}", "server")
            self.close_connection = True
        try:
            data = json.dumps(body).encode()
        except Exception as exc:
            log.error("%s %s: reply not encodable", self.command, self.path, exc_info=exc)
            status = 500
            data = json.dumps(error_body(type(exc).__name__, f"the reply is not JSON-serialisable: {exc}", "reply")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self) -> tuple[int, dict[str, Any]]:
        length, error = self._content_length()
        if error is not None:
            self.close_connection = True  # the body (if any) is unread: this connection cannot carry another request
            return error
        raw = b""
        if length:
            self.connection.settimeout(BODY_TIMEOUT_S)
            try:
                raw = self.rfile.read(length)
            except TimeoutError:
                self.close_connection = True
                return 408, error_body("RequestTimeout", f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s", "body")
            finally:
                self.connection.settimeout(self.timeout)
            if len(raw) != length:
                self.close_connection = True
                return 400, error_body("BadRequest", f"the body ended after {len(raw)} of {length} bytes", "Content-Length header")
        return self.server.app.handle(self.command, self.path, self.headers.get("Authorization"), raw)

    def _content_length(self) -> tuple[int, tuple[int, dict[str, Any]] | None]:
        if self.headers.get("Transfer-Encoding"):
            return 0, (411, error_body("LengthRequired", "send the body with a Content-Length header (no Transfer-Encoding)",
                                       "Content-Length header"))
        values = {v.strip() for v in self.headers.get_all("Content-Length") or ()}
        if not values:
            return 0, None
        if len(values) > 1 or not _DIGITS.fullmatch(next(iter(values))):
            return 0, (400, error_body("BadRequest", f"Content-Length must be one non-negative integer, got {sorted(values)}",
                                       "Content-Length header"))
        length = int(next(iter(values)))
        if length > MAX_BODY_BYTES:
            return 0, (413, error_body("BodyTooLarge", f"request body of {length} bytes, the limit is {MAX_BODY_BYTES}", "body"))
        return length, None

    do_GET = do_POST = do_DELETE = _serve  # http.server's names; the route decides what each method may do

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class EnvServer:
    """Serve ``env_id`` (a registered env) over HTTP. ``start()`` serves from a thread and returns the URL;
    ``serve_forever()`` blocks; ``close()`` stops serving and closes every session's env.

    ``kwargs``: constructor kwargs for every session (over the manifest's), chosen by whoever starts the server.
    ``allow_kwargs``: the constructor kwargs a client may send (over both); any other is refused with 403, and
    :func:`never_from_client` names are refused even here (a ``ServeError``): set those with ``kwargs``."""

    def __init__(self, env_id: str, *, host: str = DEFAULT_HOST, port: int = 0, token: str | None = None,
                 spool_dir: str | Path | None = None, max_sessions: int = 1024, idle_timeout_s: float = 3600.0,
                 kwargs: Mapping[str, Any] | None = None, allow_kwargs: Iterable[str] = ()) -> None:
        if not is_loopback(host) and not token:
            raise ServeError(f"refusing to serve on {host}, which is not a loopback address, without a token: pass "
                             f"--token (or set {TOKEN_VAR}); every request must then carry 'Authorization: Bearer <token>'")
        self.allow_kwargs = frozenset(allow_kwargs)
        never = sorted(k for k in self.allow_kwargs if never_from_client(k))
        if never:
            raise ServeError(f"--allow-kwarg {', '.join(never)}: never accepted from a client (such kwargs choose where code "
                             "runs or which host files are read); set them on the server with --kwargs instead")
        self.kwargs = dict(kwargs or {})
        self.env_id = registry.spec(env_id).id
        probe = registry.make(self.env_id, **self.kwargs)
        try:
            self.info = describe(probe, self.env_id)
        finally:
            probe.close()
        self.token = token or None
        self.max_sessions, self.idle_timeout_s = max_sessions, idle_timeout_s
        self._own_spool = spool_dir is None
        self.spool_root = Path(spool_dir) if spool_dir else Path(tempfile.mkdtemp(prefix="relax-gym-env-spool-"))
        self._sessions: dict[str, _Session] = {}
        self._opening = 0  # sessions being made: they count against max_sessions
        self._lock = threading.Lock()
        cls = _HTTPServer6 if ":" in host else _HTTPServer
        self._httpd = cls((host.strip("[]"), port), _Handler)
        self._httpd.app = self
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._httpd.serve_forever(poll_interval=0.2)

    def start(self) -> str:
        self._thread = threading.Thread(target=self.serve_forever, name=f"env-server-{self.env_id}", daemon=True)
        self._thread.start()
        return self.url

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.drop_connections()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            held = s.lock.acquire(timeout=10.0)  # let a request still using the env finish (briefly)
            try:
                if not s.closed:
                    s.closed = True
                    self._close_env(s)
            finally:
                if held:
                    s.lock.release()
        if self._own_spool:
            shutil.rmtree(self.spool_root, ignore_errors=True)

    @property
    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- requests -------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, authorization: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = [p for p in path.split("?", 1)[0].split("/") if p]
        try:
            self._authorise(authorization)
            return self._route(method, parts, raw)
        except _Reply as reply:
            return reply.status, reply.body
        except Exception as exc:  # a bug of ours or an env's: still one answer, naming the route
            route = _route_name(method, parts)
            log.error("env %s: %s failed", self.env_id, route, exc_info=exc)
            return 500, error_body(type(exc).__name__, f"{route}: {exc}", route,
                                   traceback="".join(traceback.format_exception(exc)[-6:]))

    def _authorise(self, authorization: str | None) -> None:
        if self.token is None:
            return
        if not authorization or not authorization.startswith("Bearer "):
            raise _Reply(401, "Unauthorized", "this server needs 'Authorization: Bearer <token>'", "Authorization header")
        if not hmac.compare_digest(authorization[len("Bearer "):].encode(), self.token.encode()):
            raise _Reply(403, "Forbidden", "wrong token", "Authorization header")

    def _route(self, method: str, parts: list[str], raw: bytes) -> tuple[int, dict[str, Any]]:
        if parts == ["v1", "health"] and method == "GET":
            return 200, {"ok": True, "env_id": self.env_id, "sessions": self.sessions}
        if len(parts) < 3 or parts[:2] != ["v1", "envs"]:
            raise _Reply(404, "NotFound", f"no route {'/' + '/'.join(parts)}; see /v1/envs/{self.env_id}", "path")
        if parts[2] != self.env_id:
            raise _Reply(404, "UnknownEnv", f"this server serves {self.env_id!r}, not {parts[2]!r}", "env id")
        rest = parts[3:]
        if not rest and method == "GET":
            return 200, self.info
        if rest == ["sessions"] and method == "POST":
            return self._create(_body(raw))
        if len(rest) >= 2 and rest[0] == "sessions":
            session = self._session(rest[1])
            if len(rest) == 2 and method == "DELETE":
                return self._delete(session)
            if len(rest) == 3 and method == "POST" and rest[2] in ("reset", "step"):
                return self._call(session, rest[2], _body(raw))
        raise _Reply(405 if rest and rest[0] == "sessions" else 404, "NotFound",
                     f"no route {method} {'/' + '/'.join(parts[:4] + (['...'] if len(parts) > 4 else []))}", "path")

    def _create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        media = body.get("media", "inline")
        if media not in MEDIA_MODES:
            raise _Reply(400, "BadRequest", f"media must be one of {', '.join(MEDIA_MODES)}, got {media!r}", "media")
        kwargs = body.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise _Reply(400, "BadRequest", "kwargs must be a JSON object", "kwargs")
        self._check_client_kwargs(kwargs)
        self._reap()
        with self._lock:  # check and reserve at once: concurrent creates cannot overshoot max_sessions
            if len(self._sessions) + self._opening >= self.max_sessions:
                raise _Reply(503, "TooManySessions", f"{self.max_sessions} sessions are open; close some first", "session")
            self._opening += 1
        try:
            try:
                env = registry.make(self.env_id, **{**self.kwargs, **decode_value(kwargs)})
            except Exception as exc:  # noqa: BLE001 - any constructor failure goes back to the client
                raise _env_failure(exc, self.env_id, "make", f"kwargs {sorted(kwargs)}") from None
            try:
                info = describe(env, self.env_id)
            except Exception as exc:  # noqa: BLE001
                _close_quietly(env, self.env_id)
                raise _env_failure(exc, self.env_id, "make", "describing the env") from None
            sid = secrets.token_hex(16)
            session = _Session(sid, env, media, Spool(self.spool_root / sid))
            with self._lock:
                self._sessions[sid] = session  # only once the reply is ready: a failed create leaves no session
        finally:
            with self._lock:
                self._opening -= 1
        return 201, {**info, "session": sid, "media": media}

    def _check_client_kwargs(self, kwargs: dict[str, Any]) -> None:
        never = sorted(k for k in kwargs if never_from_client(k))
        never += [n for k in sorted(kwargs) if k in self.allow_kwargs for n in _forbidden_keys(kwargs[k], k)]
        if never:
            raise _Reply(403, "KwargsRefused", f"this server never takes {', '.join(repr(k) for k in never)} from a client "
                         "(such kwargs choose where code runs or which host files are read; the server's operator sets them)",
                         "kwargs", keys=never)
        refused = sorted(k for k in kwargs if k not in self.allow_kwargs)
        if refused:
            allowed = f"it allows only {', '.join(sorted(self.allow_kwargs))}" if self.allow_kwargs else "it allows none"
            raise _Reply(403, "KwargsRefused", f"this server does not take the constructor kwargs "
                         f"{', '.join(repr(k) for k in refused)} from clients ({allowed}; the operator may allow one with "
                         "--allow-kwarg NAME, or set it for every session with --kwargs)", "kwargs", keys=refused)

    def _session(self, sid: str) -> _Session:
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None:
                session.last_used = time.monotonic()  # looked up: not idle (the reaper leaves it alone)
        if session is None:
            raise _Reply(404, "UnknownSession", "no such session (closed, expired, or never opened)", "session")
        return session

    def _call(self, session: _Session, what: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with session.lock:
            if session.closed:  # closed (or reaped) while this request waited for it
                raise _Reply(404, "UnknownSession", "no such session (closed, expired, or never opened)", "session")
            session.last_used = time.monotonic()
            session.spool.clear()  # the previous response's media: loaded by the client by now
            env = session.env
            if what == "reset":
                seed, options = body.get("seed"), body.get("options")
                if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
                    raise _Reply(400, "BadRequest", f"seed must be an integer or null, got {seed!r}", "seed")
                if options is not None and not isinstance(options, dict):
                    raise _Reply(400, "BadRequest", "options must be a JSON object or null", "options")
                try:
                    obs, info = env.reset(seed=seed, options=decode_value(options) if options else None)
                except Exception as exc:  # noqa: BLE001
                    raise _env_failure(exc, self.env_id, "reset", f"seed {seed}") from None
                return 200, {"observation": _encoded_observation(obs, session, "reset"), "info": _encoded_info(info, "reset")}
            if "action" not in body:
                raise _Reply(400, "BadRequest", "a step needs an 'action'", "action")
            try:
                obs, reward, terminated, truncated, info = env.step(body["action"])
            except Exception as exc:  # noqa: BLE001
                raise _env_failure(exc, self.env_id, "step", "action") from None
            return 200, {"observation": _encoded_observation(obs, session, "step"),
                         "reward": _converted(float, reward, "step", "reward"),
                         "terminated": _converted(bool, terminated, "step", "terminated"),
                         "truncated": _converted(bool, truncated, "step", "truncated"), "info": _encoded_info(info, "step")}

    def _delete(self, session: _Session) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self._sessions.get(session.id) is not session:
                raise _Reply(404, "UnknownSession", "no such session (closed, expired, or never opened)", "session")
            del self._sessions[session.id]
        with session.lock:  # waits for a request still using the env
            session.closed = True
            self._close_env(session)
        return 200, {"closed": True}

    def _close_env(self, session: _Session) -> None:
        _close_quietly(session.env, self.env_id)
        shutil.rmtree(session.spool.folder, ignore_errors=True)

    def _reap(self) -> None:
        """Close sessions nobody used for ``idle_timeout_s`` (clients that died without closing); a session a request
        is using (its lock held) is left alone."""
        cutoff = time.monotonic() - self.idle_timeout_s
        stale: list[_Session] = []
        with self._lock:
            for s in list(self._sessions.values()):
                if s.last_used < cutoff and s.lock.acquire(blocking=False):  # held until it is closed
                    del self._sessions[s.id]
                    stale.append(s)
        for s in stale:
            try:
                log.info("env %s: closing session idle for over %.0f s", self.env_id, self.idle_timeout_s)
                s.closed = True
                self._close_env(s)
            finally:
                s.lock.release()


def _body(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _Reply(400, "BadRequest", f"the body is not JSON: {exc}", "body") from None
    if not isinstance(body, dict):
        raise _Reply(400, "BadRequest", "the body must be a JSON object", "body")
    return body


def _route_name(method: str, parts: list[str]) -> str:
    rest = parts[3:] if parts[:2] == ["v1", "envs"] else []
    if rest == ["sessions"] and method == "POST":
        return "make"
    if len(rest) == 3 and rest[0] == "sessions" and rest[2] in ("reset", "step"):
        return rest[2]
    if len(rest) == 2 and rest[0] == "sessions" and method == "DELETE":
        return "close"
    return f"{method} /{'/'.join(parts[:3])}"


def _unserialisable(where: str, name: str, exc: Exception) -> _Reply:
    log.error("%s: %s cannot be encoded", where, name, exc_info=exc)
    return _Reply(500, "NotSerialisable", f"{where}: {name} is not JSON-serialisable: {type(exc).__name__}: {exc}", name,
                  traceback="".join(traceback.format_exception(exc)[-6:]))


def _encoded_info(info: Any, where: str, name: str = "info") -> Any:
    """``encode_value(info)``, or a 500 naming the innermost value that failed (``info['x']``, ``info['a'][0]``)."""
    if isinstance(info, dict):
        return {str(k): _encoded_info(v, where, f"{name}[{k!r}]") for k, v in info.items()}
    if isinstance(info, (list, tuple)):
        return [_encoded_info(v, where, f"{name}[{i}]") for i, v in enumerate(info)]
    return _converted(encode_value, info, where, name)


def _encoded_observation(obs: Any, session: _Session, where: str) -> list[dict[str, Any]]:
    try:
        return encode_messages(list(obs), session.media, session.spool)
    except Exception as exc:  # noqa: BLE001
        raise _unserialisable(where, "the observation", exc) from None


def _converted(convert: Any, value: Any, where: str, name: str) -> Any:
    try:
        return convert(value)
    except Exception as exc:  # noqa: BLE001
        raise _unserialisable(where, name, exc) from None


def _close_quietly(env: Any, env_id: str) -> None:
    try:
        env.close()
    except Exception:
        log.warning("env %s: close failed", env_id, exc_info=True)


def _env_failure(exc: Exception, env_id: str, where: str, culprit: str) -> _Reply:
    log.error("env %s: %s failed", env_id, where, exc_info=exc)
    return _Reply(500, type(exc).__name__, str(exc), f"env {env_id} {where} ({culprit})",
                  traceback="".join(traceback.format_exception(exc)[-6:]))


# ---------------------------------------------------------------------------------------------- process entry


def _watch_parent(parent_pid: int) -> None:
    """Stop when the process that started us is gone (it may have been killed without its exit handlers)."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGTERM)
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax_gym.envs.remote.server", description=__doc__.split("\n\n")[0])
    parser.add_argument("env_id")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--manifest", help="register this env.toml in this process first (its [server] table ignored)")
    parser.add_argument("--ready-file", help="write {url, pid} here (atomically) once serving")
    parser.add_argument("--spool", help="folder for in-memory media sent by reference (default: a temporary folder)")
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    parser.add_argument("--max-sessions", type=int, default=1024)
    parser.add_argument("--idle-timeout", type=float, default=3600.0, help="close sessions idle this long (s)")
    parser.add_argument("--kwargs-file", help="a JSON object: constructor kwargs for every session (over the manifest's)")
    parser.add_argument("--allow-kwarg", action="append", default=[], metavar="NAME",
                        help="a constructor kwarg clients may send (repeatable; none by default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.manifest:
        registry.discover()
        registry.register_manifest(Path(args.manifest), override=True, in_process=True)
    kwargs = decode_value(json.loads(Path(args.kwargs_file).read_text())) if args.kwargs_file else {}
    if not isinstance(kwargs, dict):
        parser.error(f"--kwargs-file {args.kwargs_file}: not a JSON object")
    signal.signal(signal.SIGTERM, _exit_on_signal)
    server = EnvServer(args.env_id, host=args.host, port=args.port, token=os.environ.get(TOKEN_VAR) or None,
                       spool_dir=args.spool, max_sessions=args.max_sessions, idle_timeout_s=args.idle_timeout,
                       kwargs=kwargs, allow_kwargs=args.allow_kwarg)
    try:
        print(f"relax-gym env server: serving {server.env_id} at {server.url}", flush=True)
        if args.ready_file:
            tmp = Path(args.ready_file + ".tmp")
            tmp.write_text(json.dumps({"url": server.url, "pid": os.getpid(), "python": sys.executable}))
            tmp.replace(args.ready_file)
        if args.parent_pid:
            threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.close()
    return 0


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    sys.exit(main())
