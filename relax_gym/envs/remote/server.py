"""An HTTP server for one registered environment: ``relax-gym envs serve ID`` or
``python -m relax_gym.envs.remote.server ID``.

Each session is one env instance (one stream of episodes), made with the kwargs the client sends; the client then
resets, steps and closes it. Routes (JSON in, JSON out; ``Authorization: Bearer <token>`` on every request when
the server has a token):

- ``GET  /v1/health``: ``{"ok": true, "env_id", "sessions"}``
- ``GET  /v1/envs/<id>``: what the env is: modalities, spaces, reward bounds, turn limit, metadata, protocol
- ``POST /v1/envs/<id>/sessions`` ``{"kwargs": {...}, "media": "ref"|"inline"}``: 201 ``{"session", ...}``
- ``POST /v1/envs/<id>/sessions/<sid>/reset`` ``{"seed", "options"}``: ``{"observation", "info"}``
- ``POST /v1/envs/<id>/sessions/<sid>/step`` ``{"action"}``: ``{"observation", "reward", "terminated",
  "truncated", "info"}``
- ``DELETE /v1/envs/<id>/sessions/<sid>``: closes the env and frees the session

A failed request answers ``{"error": {"type", "message", "culprit"}}`` with a 4xx status for a bad request and 500
when the env itself raised (``type`` is the exception's class, ``message`` its text, ``traceback`` the server's).
Session ids are random 128-bit values. The server binds loopback unless told otherwise and refuses a non-loopback
address without a token.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from relax_gym.envs import registry
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
TOKEN_VAR = "RELAX_GYM_ENV_TOKEN"  # the token, for servers and clients that are not given one explicitly
MAX_BODY_BYTES = 64 << 20


class ServeError(ValueError):
    """The server cannot start with these settings (e.g. a public address without a token)."""


class _Reply(Exception):
    """Raised inside a route: answer ``status`` with ``body`` (an error body)."""

    def __init__(self, status: int, kind: str, message: str, culprit: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.body = status, error_body(kind, message, culprit, **extra)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)


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
        method = self.command
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            status, body = 413, error_body("BodyTooLarge", f"request body of {length} bytes, the limit is {MAX_BODY_BYTES}", "body")
            self.close_connection = True
        else:
            raw = self.rfile.read(length) if length else b""
            status, body = self.server.app.handle(method, self.path, self.headers.get("Authorization"), raw)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _serve  # http.server's names; the route decides what each method may do

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class EnvServer:
    """Serve ``env_id`` (a registered env) over HTTP. ``start()`` serves from a thread and returns the URL;
    ``serve_forever()`` blocks; ``close()`` stops serving and closes every session's env."""

    def __init__(self, env_id: str, *, host: str = DEFAULT_HOST, port: int = 0, token: str | None = None,
                 spool_dir: str | Path | None = None, max_sessions: int = 1024, idle_timeout_s: float = 3600.0) -> None:
        if not is_loopback(host) and not token:
            raise ServeError(f"refusing to serve on {host}, which is not a loopback address, without a token: pass "
                             f"--token (or set {TOKEN_VAR}); every request must then carry 'Authorization: Bearer <token>'")
        self.env_id = registry.spec(env_id).id
        probe = registry.make(self.env_id)
        try:
            self.info = describe(probe, self.env_id)
        finally:
            probe.close()
        self.token = token or None
        self.max_sessions, self.idle_timeout_s = max_sessions, idle_timeout_s
        self._own_spool = spool_dir is None
        self.spool_root = Path(spool_dir) if spool_dir else Path(tempfile.mkdtemp(prefix="relax-gym-env-spool-"))
        self._sessions: dict[str, _Session] = {}
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
            self._close_env(s)
        if self._own_spool:
            shutil.rmtree(self.spool_root, ignore_errors=True)

    @property
    def sessions(self) -> int:
        with self._lock:
            return len(self._sessions)

    # -- requests -------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, authorization: str | None, raw: bytes) -> tuple[int, dict[str, Any]]:
        try:
            self._authorise(authorization)
            parts = [p for p in path.split("?", 1)[0].split("/") if p]
            return self._route(method, parts, raw)
        except _Reply as reply:
            return reply.status, reply.body

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
        self._reap()
        with self._lock:
            if len(self._sessions) >= self.max_sessions:
                raise _Reply(503, "TooManySessions", f"{self.max_sessions} sessions are open; close some first", "session")
        try:
            env = registry.make(self.env_id, **decode_value(kwargs))
        except Exception as exc:  # noqa: BLE001 - any constructor failure goes back to the client
            raise _env_failure(exc, self.env_id, "make", f"kwargs {sorted(kwargs)}") from None
        sid = secrets.token_hex(16)
        session = _Session(sid, env, media, Spool(self.spool_root / sid))
        with self._lock:
            self._sessions[sid] = session
        return 201, {**describe(env, self.env_id), "session": sid, "media": media}

    def _session(self, sid: str) -> _Session:
        with self._lock:
            session = self._sessions.get(sid)
        if session is None:
            raise _Reply(404, "UnknownSession", "no such session (closed, expired, or never opened)", "session")
        return session

    def _call(self, session: _Session, what: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with session.lock:
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
                    observation = encode_messages(list(obs), session.media, session.spool)
                except Exception as exc:  # noqa: BLE001
                    raise _env_failure(exc, self.env_id, "reset", f"seed {seed}") from None
                return 200, {"observation": observation, "info": encode_value(info)}
            if "action" not in body:
                raise _Reply(400, "BadRequest", "a step needs an 'action'", "action")
            try:
                obs, reward, terminated, truncated, info = env.step(body["action"])
                observation = encode_messages(list(obs), session.media, session.spool)
            except Exception as exc:  # noqa: BLE001
                raise _env_failure(exc, self.env_id, "step", "action") from None
            return 200, {"observation": observation, "reward": float(reward), "terminated": bool(terminated),
                         "truncated": bool(truncated), "info": encode_value(info)}

    def _delete(self, session: _Session) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._sessions.pop(session.id, None)
        with session.lock:
            self._close_env(session)
        return 200, {"closed": True}

    def _close_env(self, session: _Session) -> None:
        try:
            session.env.close()
        except Exception:
            log.warning("env %s: close failed", self.env_id, exc_info=True)
        shutil.rmtree(session.spool.folder, ignore_errors=True)

    def _reap(self) -> None:
        """Close sessions nobody used for ``idle_timeout_s`` (clients that died without closing)."""
        cutoff = time.monotonic() - self.idle_timeout_s
        with self._lock:
            stale = [s for s in self._sessions.values() if s.last_used < cutoff and not s.lock.locked()]
            for s in stale:
                del self._sessions[s.id]
        for s in stale:
            log.info("env %s: closing session idle for over %.0f s", self.env_id, self.idle_timeout_s)
            self._close_env(s)


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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.manifest:
        registry.discover()
        registry.register_manifest(Path(args.manifest), override=True, in_process=True)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    server = EnvServer(args.env_id, host=args.host, port=args.port, token=os.environ.get(TOKEN_VAR) or None,
                       spool_dir=args.spool, max_sessions=args.max_sessions, idle_timeout_s=args.idle_timeout)
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
