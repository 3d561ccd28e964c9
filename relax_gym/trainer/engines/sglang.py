"""A real SGLang server as a rollout engine: launched as a child process, driven over its HTTP protocol.

relax-gym never imports ``sglang``: :func:`launch_sglang` runs ``<python> -m sglang.launch_server`` (``python``
may be another environment's interpreter, see ``docs/scaling.md``), waits until ``/health_generate`` answers 200
and tears the whole process group down on :meth:`SGLangServer.close` (also at interpreter exit)::

    with launch_sglang("/models/Qwen3-8B", tp_size=2, mem_fraction_static=0.7) as server:   # loopback, free port
        client = AsyncEngineClient(server.url, transport=SGLangTransport(MediaTokens.from_checkpoint(path)))
        out = await client.generate(rendered.input_ids, **media_data(obs), sampling_params={...})

The same :class:`~relax_gym.trainer.engines.client.AsyncEngineClient` drives the embedded engine and SGLang. Two
request differences are bridged on the way out by :func:`to_sglang_generate` (:class:`SGLangTransport` for a
client, :meth:`SGLangProxy.dispatch` for the inference role):

- **Media placeholders.** Our ``input_ids`` carry each media item's pad token expanded (``render`` writes them so);
  SGLang decodes ``input_ids`` back to text and counts one placeholder per item, then expands it with its own
  processor. Each run of an image / video / audio pad token is therefore collapsed to one token (the ids come from
  the checkpoint's ``config.json``, :meth:`MediaTokens.from_checkpoint`).
- **Media items.** ``{"url", "sampling"}`` items become SGLang's ``MediaRef`` objects: ``url`` as is (``file://``,
  ``data:`` and plain paths are read by SGLang's loaders), the sampling spec mapped onto ``MediaRef`` fields
  (image ``max_pixels``; video ``fps``, ``max_frames``, ``min_frames``, ``max_pixels``, ``use_audio``). Spec
  fields SGLang cannot express (a clip span ``start_s`` / ``end_s``) and ``application/x-npy`` arrays are refused
  with a 400 naming the item, rather than sent and decoded differently. SGLang applies its own resize rules within
  those budgets, so the engine may see a media tensor of another size than the trainer's ``render``.

Weight pushes go through the DCS (``trainer/dcs``): NCCL over ``/init_weights_update_group`` +
``/update_weights_from_distributed``, with ``/update_weights_from_disk`` as the fallback
(the DCS's ``NcclOrDiskTransport``). ``update_weights_from_tensor`` is not used
(SGLang's payload there is a same-host CUDA IPC pickle).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from relax_gym.watchdog import guard

__all__ = [
    "LAUNCH_MODULE", "OWNED_FLAGS", "MediaTokens", "SGLangLaunchError", "SGLangProxy", "SGLangServer",
    "SGLangTransport", "launch_command", "launch_sglang", "to_sglang_generate",
]

logger = logging.getLogger(__name__)

LAUNCH_MODULE = "sglang.launch_server"
# flags the launcher sets itself from the config; extra_args may not repeat them
OWNED_FLAGS = frozenset({"--model-path", "--host", "--port", "--tp-size", "--tensor-parallel-size",
                         "--mem-fraction-static"})
_LOG_TAIL_LINES = 40


class SGLangLaunchError(RuntimeError):
    """The SGLang server did not come up: it exited, or was not healthy in time. The message ends with the
    server's last log lines."""


# ---------------------------------------------------------------------------------------------- launching


def launch_command(model_path: str, *, host: str = "127.0.0.1", port: int, tp_size: int = 1,
                   mem_fraction_static: float = 0.7, extra_args: Sequence[str] = (),
                   python: str | None = None) -> list[str]:
    """The argv of ``<python> -m sglang.launch_server`` for these settings (``python``: default this interpreter).
    ``ValueError`` if ``extra_args`` repeats a flag the launcher sets (:data:`OWNED_FLAGS`)."""
    extra = [str(a) for a in extra_args]
    clash = sorted({a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in OWNED_FLAGS})
    if clash:
        raise ValueError(f"inference.sglang.extra_args repeats {clash}: set them through the config fields "
                         "(model_path, host, port, tp_size, mem_fraction_static)")
    if not 0 < mem_fraction_static < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be at least 1, got {tp_size}")
    return [python or sys.executable, "-m", LAUNCH_MODULE, "--model-path", str(model_path), "--host", host,
            "--port", str(int(port)), "--tp-size", str(int(tp_size)), "--mem-fraction-static", repr(float(mem_fraction_static)),
            *extra]


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class SGLangServer:
    """A running ``sglang.launch_server`` child (its own process group): ``.url``, ``.pid``, ``.alive``,
    ``.log_path``, :meth:`log_tail`, :meth:`close` (idempotent: SIGTERM to the group, SIGKILL after ``grace_s``);
    a context manager. Servers still running at interpreter exit are closed by an ``atexit`` hook."""

    def __init__(self, process: subprocess.Popen, url: str, log_path: Path, command: list[str]) -> None:
        self.process, self.url, self.log_path, self.command = process, url, log_path, command
        self._lock = threading.Lock()
        self._closed = False
        _LIVE.add(self)

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def close(self, grace_s: float = 30.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _LIVE.discard(self)
        _stop_group(self.process, grace_s)

    def __enter__(self) -> SGLangServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.alive else f"exited {self.returncode}"
        return f"SGLangServer({self.url}, pid {self.pid}, {state})"


def _stop_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the child's process group (the server and the scheduler / detokenizer workers it forks), then
    SIGKILL whatever is left after ``grace_s``.

    The group id is the child's pid (it was started with ``start_new_session``), not ``os.getpgid``: once the
    leader has exited and been reaped (``poll()`` in ``alive`` / during start-up), ``getpgid`` fails, yet its
    workers may still hold the GPU in that group."""
    pgid = process.pid
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):  # the whole group is gone
            pass
        try:
            process.wait(wait_s)
            if sig == signal.SIGTERM:
                try:  # the leader is gone; reap stragglers of its group too
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            return
        except subprocess.TimeoutExpired:
            continue
    logger.warning("the SGLang server's process group %d did not exit after SIGKILL", pgid)


# strong references: a server dropped without close() must still be reached by the exit hook (its process group
# would otherwise outlive the trainer, holding GPU memory)
_LIVE: set[SGLangServer] = set()


@atexit.register
def _close_live_servers() -> None:
    for server in list(_LIVE):
        server.close(grace_s=5.0)


def launch_sglang(model_path: str, *, host: str = "127.0.0.1", port: int = 0, tp_size: int = 1,
                  mem_fraction_static: float = 0.7, extra_args: Sequence[str] = (), python: str | None = None,
                  startup_timeout_s: float = 600.0, log_path: str | Path | None = None,
                  env: Mapping[str, str] | None = None) -> SGLangServer:
    """Start ``sglang.launch_server`` for ``model_path`` and return once ``/health_generate`` answers 200.

    ``port`` 0 picks a free one on ``host`` (loopback by default). ``log_path``: where the server's stdout and
    stderr go (default a temporary file). ``env``: extra environment variables for the child. Raises
    :class:`SGLangLaunchError` (with the log's tail) if the process exits during start-up or is not healthy within
    ``startup_timeout_s`` (the process group is then killed)."""
    port = int(port) or _free_port(host)
    command = launch_command(model_path, host=host, port=port, tp_size=tp_size,
                             mem_fraction_static=mem_fraction_static, extra_args=extra_args, python=python)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="sglang-", suffix=".log")
        os.close(fd)
        log_path = name
    log = Path(log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**os.environ, **(env or {})}
    logger.info("launching SGLang: %s (log %s)", shlex.join(command), log)
    with open(log, "ab") as sink:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                   env=child_env, start_new_session=True)
    guard(process)  # the server's process group dies with this process, even on SIGKILL
    server = SGLangServer(process, _url(host, port), log, command)
    try:
        _wait_healthy(server, startup_timeout_s)
    except BaseException:
        server.close(grace_s=5.0)
        raise
    return server


def _wait_healthy(server: SGLangServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=server.url, timeout=10.0) as http:
        while True:
            code = server.returncode
            if code is not None:
                raise SGLangLaunchError(f"the SGLang server exited with code {code} during start-up "
                                        f"({shlex.join(server.command)}); last lines of {server.log_path}:\n{server.log_tail()}")
            try:
                if http.get("/health_generate").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise SGLangLaunchError(f"the SGLang server at {server.url} was not healthy within {timeout_s:g} s; "
                                        f"last lines of {server.log_path}:\n{server.log_tail()}")
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class MediaTokens:
    """The pad token ids whose runs :func:`to_sglang_generate` collapses (None: the model has no such input)."""

    image: int | None = None
    video: int | None = None
    audio: int | None = None

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(t for t in (self.image, self.video, self.audio) if t is not None)

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> MediaTokens:
        """Read ``image_token_id`` / ``video_token_id`` / ``audio_token_id`` (also ``image_token_index`` /
        ``audio_token_index``) from ``path/config.json``, at the top level or under ``thinker_config``; a text-only
        checkpoint gives no ids. ``FileNotFoundError`` if there is no ``config.json``."""
        config_file = Path(path) / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in {path}: SGLang needs a Hugging Face checkpoint directory")
        config = json.loads(config_file.read_text())
        scopes = [config, config.get("thinker_config") or {}]

        def find(*keys: str) -> int | None:
            for scope in scopes:
                for key in keys:
                    if isinstance(scope.get(key), int):
                        return int(scope[key])
            return None

        return cls(image=find("image_token_id", "image_token_index"), video=find("video_token_id", "video_token_index"),
                   audio=find("audio_token_id", "audio_token_index"))


_MEDIA_KINDS = {"image_data": "image", "video_data": "video", "audio_data": "audio"}
# our sampling-spec field -> SGLang MediaRef field, per kind (same meaning, same unit)
_SAMPLING_FIELDS = {
    "image": {"max_pixels": "max_pixels"},
    "video": {"fps": "fps", "max_frames": "max_frames", "min_frames": "min_frames", "max_pixels": "max_pixels"},
    "audio": {},
}
# spec fields SGLang has no way to express; a non-default value is refused (default shown)
_UNSUPPORTED = {"start_s": 0.0, "end_s": None}


def collapse_runs(ids: Sequence[int], pad_ids: frozenset[int]) -> list[int]:
    """``ids`` with every run of one pad token (``pad_ids``) reduced to a single token."""
    out: list[int] = []
    for token in ids:
        token = int(token)
        if token in pad_ids and out and out[-1] == token:
            continue
        out.append(token)
    return out


def _media_ref(item: Any, kind: str, where: str) -> Any:
    if isinstance(item, str):
        _check_url(item, where)
        return item
    if not isinstance(item, Mapping) or not isinstance(item.get("url"), str):
        raise ValueError(f"{where}: a media item must be a URL string or {{'url': ..., 'sampling': {{...}}}}")
    url = item["url"]
    _check_url(url, where)
    unknown = sorted(set(item) - {"url", "sampling", "detail"})
    if unknown:
        raise ValueError(f"{where}: unknown media item field(s) {unknown}")
    ref: dict[str, Any] = {"url": url}
    if item.get("detail") is not None:
        ref["detail"] = item["detail"]
    sampling = dict(item.get("sampling") or {})
    for name, default in _UNSUPPORTED.items():
        if sampling.get(name, default) != default:
            raise ValueError(f"{where}: sampling.{name}={sampling[name]!r} cannot be expressed to SGLang (it decodes "
                             "the whole clip); cut the clip in the env instead")
    for ours, theirs in _SAMPLING_FIELDS[kind].items():
        if sampling.get(ours) is not None:
            ref[theirs] = sampling[ours]
    if kind == "video" and sampling.get("audio") is not None:
        ref["use_audio"] = True
    return ref


def _check_url(url: str, where: str) -> None:
    if url[:64].lower().startswith("data:application/x-npy"):
        raise ValueError(f"{where}: a raw array (data:application/x-npy) cannot be sent to SGLang; use an encoded "
                         "file (png / mp4 / wav) or a path")
    if url[:8].lower().startswith(("http://", "https://")):
        raise ValueError(f"{where}: http(s) URLs are not fetched (relax-gym never downloads media)")


def _is_batch(body: Mapping[str, Any]) -> bool:
    ids, text = body.get("input_ids"), body.get("text")
    if isinstance(text, list):
        return True
    return isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)


def to_sglang_generate(body: Mapping[str, Any], tokens: MediaTokens) -> dict[str, Any]:
    """A ``/generate`` body as SGLang takes it (see the module doc): pad-token runs in ``input_ids`` collapsed,
    media items as SGLang ``MediaRef`` objects. Everything else is passed through. ``ValueError`` naming the
    request and item for media SGLang cannot receive faithfully."""
    out = dict(body)
    batch = _is_batch(body)
    pad = tokens.ids
    ids = body.get("input_ids")
    if ids is not None and pad:
        out["input_ids"] = [collapse_runs(row, pad) for row in ids] if batch else collapse_runs(ids, pad)
    for field, kind in _MEDIA_KINDS.items():
        value = body.get(field)
        if value is None:
            continue
        if batch:
            if not isinstance(value, list):
                raise ValueError(f"{field}: a batch request needs one entry per request")
            out[field] = [_request_items(entry, kind, f"{field}[{i}]") for i, entry in enumerate(value)]
        else:
            out[field] = _request_items(value, kind, field)
    return out


def _request_items(value: Any, kind: str, where: str) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_media_ref(item, kind, f"{where}[{j}]") for j, item in enumerate(value)]
    return _media_ref(value, kind, where)


def _rewrite(method: str, path: str, raw: bytes, tokens: MediaTokens) -> bytes:
    """The body to forward: ``/generate`` bodies mapped with :func:`to_sglang_generate`, others unchanged."""
    if urlsplit(path).path.rstrip("/") != "/generate" or method not in ("POST", "PUT") or not raw.strip():
        return raw
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return raw  # SGLang answers the malformed body itself
    if not isinstance(body, Mapping):
        return raw
    return json.dumps(to_sglang_generate(body, tokens)).encode()


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    body = {"object": "error", "message": message, "type": "BadRequest", "param": None, "code": status}
    return status, "application/json", json.dumps(body).encode()


class SGLangTransport(httpx.AsyncBaseTransport):
    """An httpx transport for :class:`~relax_gym.trainer.engines.client.AsyncEngineClient` against SGLang:
    ``/generate`` bodies are mapped (a request SGLang cannot take faithfully is answered 400 here, as the embedded
    engine would), every other request is forwarded unchanged."""

    def __init__(self, tokens: MediaTokens, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.tokens = tokens
        # an httpx client ignores its own ``limits`` once given a transport: the pool is sized here, as the engine
        # client sizes its own (httpx's default of 100 connections would queue a large rollout's requests)
        self.inner = inner or httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        raw = await request.aread()
        try:
            content = _rewrite(request.method, request.url.path, raw, self.tokens)
        except ValueError as exc:
            status, kind, payload = _error(400, str(exc))
            return httpx.Response(status, headers={"content-type": kind}, content=payload, request=request)
        if content is not raw:
            headers = [(k, v) for k, v in request.headers.raw if k.lower() not in (b"content-length", b"transfer-encoding")]
            request = httpx.Request(request.method, request.url, headers=headers, content=content,
                                    extensions=request.extensions)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


class SGLangProxy:
    """Forwards one request of SGLang's protocol to the server at ``url`` (blocking; for the inference role's
    deployment-handle calls), mapping ``/generate`` bodies like :class:`SGLangTransport`."""

    def __init__(self, url: str, tokens: MediaTokens, *, timeout_s: float = 600.0, max_connections: int = 256) -> None:
        self.url = url.rstrip("/")
        self.tokens = tokens
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s,
                                  limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64))

    def dispatch(self, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
        """``(status, content type, body)`` as SGLang answered; a request refused by the mapping is a 400 and an
        unreachable server a 503, both in SGLang's error shape."""
        try:
            content = _rewrite(method, path, raw, self.tokens)
        except ValueError as exc:
            return _error(400, str(exc))
        try:
            response = self._http.request(method, path, content=content or None,
                                          headers={"content-type": "application/json"} if content else None)
        except httpx.HTTPError as exc:
            return _error(503, f"the SGLang server at {self.url} did not answer: {type(exc).__name__}: {exc}")
        return response.status_code, response.headers.get("content-type", "application/json"), response.content

    def close(self) -> None:
        self._http.close()
