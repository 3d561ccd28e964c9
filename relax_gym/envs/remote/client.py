"""The client side of a served environment: :class:`RemoteEnv`, an :class:`~relax_gym.envs.core.AgentEnv` whose
episodes run in an env server (:mod:`.server`), so ``check_env``, ``relax-gym envs play`` and the trainer's
episode runner use it exactly like the in-process env.

``relax_gym.make("remote:http://127.0.0.1:8765/nextqa-video")`` connects to a running server (the last path
component is the env id; ``?media=inline`` chooses the media transfer); a manifest's ``[server]`` table makes
``relax_gym.make(ID)`` do the same, starting the server itself when it names an interpreter (:mod:`.launcher`).

Client options are keyword arguments with a ``remote_`` prefix; every other keyword argument goes to the env's
constructor on the server, which refuses it unless its operator allowed that name (``--allow-kwarg``):
``remote_media`` (``"auto"``: ``ref`` for a loopback server, ``inline`` otherwise),
``remote_token`` (default: ``$RELAX_GYM_ENV_TOKEN``), ``remote_timeout_s`` (per request, default 600).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import select
import threading
import weakref
from typing import Any
from urllib.parse import parse_qs, urlsplit

import gymnasium

from relax_gym.envs.core import AgentEnv, Status
from relax_gym.envs.env_ids import NAMESPACE, REMOTE_PREFIX
from relax_gym.envs.remote.access import TOKEN_VAR, is_loopback
from relax_gym.envs.remote.wire import (
    MEDIA_MODES,
    PROTOCOL,
    decode_messages,
    decode_value,
    encode_value,
)
from relax_gym.envs.spaces import AssistantText, Conversation
from relax_gym.omni import Message
from relax_gym.omni.parts import TextPart

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE"})  # safe to send twice; a POST (make, reset, step) never is


class RemoteEnvError(RuntimeError):
    """A request to an env server failed. ``kind`` is the server's error type (the env's exception class for an
    env failure), ``culprit`` what it blamed, ``status`` the HTTP status (0: the server could not be reached)."""

    def __init__(self, message: str, *, kind: str = "", culprit: str = "", status: int = 0, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.kind, self.culprit, self.status, self.remote_traceback = kind, culprit, status, remote_traceback


class _Connection:
    """One keep-alive HTTP connection to a server. One closed by the server while idle is noticed before sending and
    reopened; a request that fails on a reused connection is sent again only if it cannot have reached the server
    (it was not fully written) or is idempotent (GET, DELETE): a POST that may have been delivered (a step) is an
    error, never sent twice."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"env server URL must be http://HOST:PORT[/prefix], got {base_url!r}")
        self.base_url, self.host, self.port = base_url.rstrip("/"), parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.token, self.timeout_s = token, timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        with self._lock:
            for attempt in (0, 1):
                if self._conn is not None and _dropped(self._conn):
                    self.close_locked()  # the server closed this idle keep-alive connection: a fresh one
                reused = self._conn is not None
                if self._conn is None:
                    self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                sent = False
                try:
                    self._conn.request(method, self.prefix + path, body=data, headers=headers)
                    sent = True  # from here on the server may have acted on it
                    response = self._conn.getresponse()
                    raw = response.read()
                    break
                except _STALE as exc:
                    self.close_locked()
                    if reused and attempt == 0 and (not sent or method in _IDEMPOTENT):
                        continue  # not delivered (or harmless to repeat): once more on a fresh connection
                    what = "" if method in _IDEMPOTENT else " (not sent again: the server may have acted on it)"
                    raise RemoteEnvError(f"env server at {self.base_url} closed the connection during "
                                         f"{method} {path}{what}: {exc!r}") from exc
                except OSError as exc:
                    self.close_locked()
                    raise RemoteEnvError(f"cannot reach the env server at {self.base_url}: {exc}") from exc
        try:
            return response.status, json.loads(raw)
        except ValueError as exc:
            raise RemoteEnvError(f"env server at {self.base_url} answered {response.status} with a body that is not JSON",
                                 status=response.status) from exc

    def close_locked(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether an idle keep-alive connection was closed by the server (its socket reads as ready: EOF or junk)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        if hasattr(select, "poll"):  # no FD_SETSIZE limit (a trainer may hold more than 1024 descriptors)
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _delete_session(conn: _Connection, path: str) -> None:
    """Best effort: the server may be gone already (e.g. at interpreter exit)."""
    try:
        conn.request("DELETE", path)
    except Exception as exc:  # noqa: BLE001
        log.debug("closing session %s: %r", path, exc)
    conn.close()


class RemoteEnv(AgentEnv):
    """An env served at ``remote_url`` under id ``remote_env_id``; ``**env_kwargs`` go to its constructor there."""

    def __init__(self, remote_url: str, remote_env_id: str, *, remote_media: str = "auto", remote_token: str | None = None,
                 remote_timeout_s: float = DEFAULT_TIMEOUT_S, render_mode: str | None = None, **env_kwargs: Any) -> None:
        if remote_media == "auto":
            remote_media = "ref" if is_loopback(urlsplit(remote_url).hostname or "") else "inline"
        if remote_media not in MEDIA_MODES:
            raise ValueError(f"remote_media must be 'auto', 'ref' or 'inline', got {remote_media!r}")
        self.remote_url, self.remote_env_id, self.remote_media = remote_url.rstrip("/"), remote_env_id, remote_media
        self.env_kwargs = dict(env_kwargs)
        self._conn = _Connection(remote_url, remote_token if remote_token is not None else os.environ.get(TOKEN_VAR), remote_timeout_s)
        self._sid: str | None = None
        self._finalizer: weakref.finalize | None = None
        super().__init__(render_mode=render_mode)
        self._open()

    # -- the session ----------------------------------------------------------------------------------------

    @property
    def session_id(self) -> str | None:
        return self._sid

    def _path(self, *rest: str) -> str:
        return "/".join(["/v1/envs", self.remote_env_id, *rest])

    def _open(self) -> None:
        info = self._request("POST", self._path("sessions"), {"kwargs": encode_value(self.env_kwargs), "media": self.remote_media},
                             "make")
        if info.get("protocol") != PROTOCOL:
            raise RemoteEnvError(f"env server at {self.remote_url} speaks protocol {info.get('protocol')}, this client "
                                 f"{PROTOCOL}: use the same relax-gym version on both sides")
        self._sid = info["session"]
        self.server_info = info
        self.metadata = {**type(self).metadata, **info.get("metadata", {})}
        self.max_turns = info.get("max_turns") or 1
        self.media_kinds = tuple(info["observation_space"].get("media_kinds", ()))
        self.observation_space = Conversation(self.media_kinds)
        max_length = info["action_space"].get("max_length")
        self.action_space = AssistantText(max_length=max_length) if max_length else AssistantText()
        self._bounds = tuple(info.get("reward_bounds", (0.0, 1.0)))
        self._finalizer = weakref.finalize(self, _delete_session, self._conn, self._path("sessions", self._sid))

    @property
    def reward_bounds(self) -> tuple[float, float]:
        return self._bounds

    def _request(self, method: str, path: str, body: dict[str, Any] | None, what: str) -> dict[str, Any]:
        status, reply = self._conn.request(method, path, body)
        if status >= 400:
            err = reply.get("error", {}) if isinstance(reply, dict) else {}
            kind, message = err.get("type", "Error"), err.get("message", str(reply))
            raise RemoteEnvError(f"{self.remote_env_id} at {self.remote_url}: {what} failed: {kind}: {message}", kind=kind,
                                 culprit=err.get("culprit", ""), status=status, remote_traceback=err.get("traceback", ""))
        return reply

    def _session_call(self, what: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._sid is None:  # closed: a new session (gymnasium allows reset after close)
            self._open()
        return self._request("POST", self._path("sessions", self._sid, what), body, what)

    # -- gymnasium API --------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        gymnasium.Env.reset(self, seed=seed)  # this side's np_random (random policies draw from it)
        reply = self._session_call("reset", {"seed": None if seed is None else int(seed), "options": encode_value(options or {})})
        obs, info = decode_messages(reply["observation"]), decode_value(reply["info"])
        self._turn, self._done = 0, False
        self._episode_id, self._gold = info.get("episode_id", ""), info.get("gold", "")
        self.history = list(obs)
        return obs, info

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        reply = self._session_call("step", {"action": encode_value(action)})
        obs, info = decode_messages(reply["observation"]), decode_value(reply["info"])
        self._turn = info.get("turn", self._turn + 1)
        self._gold = info.get("gold", self._gold)
        terminated, truncated = bool(reply["terminated"]), bool(reply["truncated"])
        self._done = terminated or truncated
        if isinstance(action, str) and info.get("status") != Status.INVALID_ACTION.value:
            self.history.append(Message(role="assistant", content=(TextPart(action),)))
        self.history.extend(obs)
        return obs, float(reply["reward"]), terminated, truncated, info

    def close(self) -> None:
        """Close the server-side env and free its session (idempotent; a later ``reset`` opens a new one)."""
        if self._sid is not None:
            self._sid = None
            self._finalizer()
        super().close()


def parse_remote_id(id: str) -> tuple[str, str, dict[str, Any]]:
    """``remote:http://HOST:PORT[/prefix]/ENV_ID[?media=ref|inline&timeout_s=N]`` -> (base URL, env id, client kwargs)."""
    parts = urlsplit(id.removeprefix(REMOTE_PREFIX))
    path = parts.path.rstrip("/")
    if parts.scheme != "http" or not parts.netloc or "/" not in path or not path.rsplit("/", 1)[1]:
        raise ValueError(f"a remote env is named remote:http://HOST:PORT/ENV_ID, got {id!r}")
    prefix, env_id = path.rsplit("/", 1)
    options: dict[str, Any] = {}
    for key, values in parse_qs(parts.query).items():
        if key == "media":
            options["remote_media"] = values[-1]
        elif key == "timeout_s":
            options["remote_timeout_s"] = float(values[-1])
        else:
            raise ValueError(f"{id!r}: unknown option {key!r} (known: media, timeout_s)")
    return f"http://{parts.netloc}{prefix}", env_id, options


def make_remote(id: str, **kwargs: Any) -> gymnasium.Env:
    """``relax_gym.make("remote:http://HOST:PORT/ENV_ID", **kwargs)``: a gymnasium env (with gymnasium's usual
    wrappers) whose episodes run on that server."""
    url, env_id, options = parse_remote_id(id)
    spec_ = gymnasium.envs.registration.EnvSpec(id=f"{NAMESPACE}/{env_id}", entry_point=RemoteEnv,
                                                kwargs={"remote_url": url, "remote_env_id": env_id, **options})
    return gymnasium.make(spec_, **kwargs)
