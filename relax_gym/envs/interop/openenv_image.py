"""OpenEnv envs shipped as Docker images, run as relax-gym docker sandboxes: ``relax_gym.make("openenv:IMAGE",
sandbox={"memory_mb": 2048}, ...)``.

OpenEnv's own way (``from_docker_image``) is ``docker run -d -p PORT:8000 IMAGE``: a container with the host's
network and no limits. Here the image's server runs in a sandbox of our docker backend instead, under its limits
(no network interface but ``lo``, read-only root, memory + swap, cpus, pids, every capability dropped, a non-root
user, our PID 1 that reaps orphans), and the host reaches it through a Unix socket:

- the image's ``Entrypoint + Cmd`` runs in its ``WorkingDir`` under ``forward_in_sandbox.py --expose``, which
  listens on ``/run/relax-env/env.sock`` (a host directory mounted writable, holding nothing else) and forwards
  each connection to the server on the sandbox's loopback (the image's one exposed TCP port, else OpenEnv's 8000);
- on the host a :class:`~relax_gym.sandbox.bridge.SocketPort` gives that socket a loopback URL, which the OpenEnv
  adapter (:mod:`relax_gym.envs.interop.openenv_env`, in the OpenEnv venv) is handed as the env's id;
- the server is ready when ``GET /health`` answers 200 (OpenEnv's servers have it); if the command ends first, or
  the wait runs out, the error names the image and quotes the end of the server's output.

One sandbox per image and limits per process (the server keeps one session per client connection), removed at
exit; the sandbox's owner label lets ``relax-gym sandbox reap`` remove what a killed process left. The image must
have ``python3`` on its PATH (our PID 1 and the forwarder run on it; OpenEnv's images are Python images).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import concurrent.futures.thread  # its exit hook must be registered before ours (below)
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.bridge import BIN_DIR_IN_SANDBOX, SCRIPT_NAME, SocketPort, forwarder_dir
from relax_gym.sandbox.spec import Mount, SandboxSpec

POLL_NOISE = "forward_in_sandbox: cannot connect to "  # relax_gym/sandbox/forward_in_sandbox.py, per refused poll

OPENENV_PORT = 8000  # the port OpenEnv's images serve on (its Dockerfile template and from_docker_image)
SOCKET_DIR = "/run/relax-env"
SERVER_TIMEOUT_S = 6 * 86400.0  # the server's exec: as long as the process wants it (the backend allows 7 days)
POLL_S = 0.2


class ImageServerError(RuntimeError):
    """An OpenEnv image that cannot be served: the message names the image and what went wrong."""


class SandboxLimits(BaseModel):
    """What a user may set of the sandbox an OpenEnv image runs in (``sandbox={...}``); the rest stays locked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpus: float = Field(default=1.0, gt=0, le=64)
    memory_mb: int = Field(default=2048, ge=64)
    pids: int = Field(default=256, ge=16)
    tmpfs_mb: int = Field(default=256, ge=1)
    runtime: str | None = None  # e.g. "runsc" (gVisor) when the engine has it
    port: int | None = Field(default=None, gt=0, lt=65536)  # the server's port in the image; None: its one exposed
    startup_timeout_s: float = Field(default=120.0, gt=0)


def parse_limits(image: str, given: dict[str, Any] | None) -> SandboxLimits:
    try:
        return SandboxLimits(**(given or {}))
    except ValidationError as e:
        problems = "; ".join(f"sandbox.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ImageServerError(f"OpenEnv image {image}: {problems}") from None


def server_command(config: dict[str, Any]) -> tuple[list[str], str | None]:
    """The image's own command (Entrypoint + Cmd) and working directory."""
    argv = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    return argv, config.get("WorkingDir") or None


def server_port(image: str, config: dict[str, Any], port: int | None) -> int:
    """``port`` if given, else the image's one exposed TCP port, else OpenEnv's 8000."""
    if port is not None:
        return port
    exposed = [int(p.split("/")[0]) for p in (config.get("ExposedPorts") or {}) if p.endswith("/tcp")]
    if len(exposed) > 1:
        raise ImageServerError(f"OpenEnv image {image} exposes ports {sorted(exposed)}: say which one serves the env "
                               f"with sandbox={{'port': N}}")
    return exposed[0] if exposed else OPENENV_PORT


class ImageServer:
    """An OpenEnv image's server running in a docker sandbox; ``url`` reaches it from this host's loopback."""

    def __init__(self, image: str, limits: SandboxLimits | None = None) -> None:
        self.image, self.limits = image, limits or SandboxLimits()
        backend = get_backend("docker")
        problem = backend.check()
        if problem:
            raise ImageServerError(f"OpenEnv image {image}: needs the docker sandbox backend: {problem}")
        config = backend.image_config(image)
        argv, cwd = server_command(config)
        if not argv:
            raise ImageServerError(f"OpenEnv image {image} has no CMD or ENTRYPOINT: nothing to start")
        self.port_in_sandbox = server_port(image, config, self.limits.port)
        self._dir = tempfile.mkdtemp(prefix="relax-gym-openenv-image-")  # 0700: only its child is shown
        sockets = os.path.join(self._dir, "sock")
        os.mkdir(sockets)
        os.chmod(sockets, 0o777)  # the sandbox user makes its socket here
        spec = SandboxSpec(
            image=image, cpus=self.limits.cpus, memory_mb=self.limits.memory_mb, pids=self.limits.pids,
            tmpfs_mb=self.limits.tmpfs_mb, runtime=self.limits.runtime, exec_timeout_s=SERVER_TIMEOUT_S,
            mounts=(Mount(source=sockets, target=SOCKET_DIR, read_only=False),
                    Mount(source=forwarder_dir(), target=BIN_DIR_IN_SANDBOX)))
        self._box: Any = None
        self._port: SocketPort | None = None
        self._server: concurrent.futures.Future | None = None
        try:
            self._box = sync.run(backend.create(spec))
            command = ["python3", "-I", "-S", f"{BIN_DIR_IN_SANDBOX}/{SCRIPT_NAME}", "--expose",
                       f"{SOCKET_DIR}/env.sock", "--to", f"127.0.0.1:{self.port_in_sandbox}",
                       *(["--cwd", cwd] if cwd else []), "--", *argv]
            self._server = asyncio.run_coroutine_threadsafe(self._box.exec(command, timeout=SERVER_TIMEOUT_S),
                                                            sync.loop())
            self._port = SocketPort(os.path.join(sockets, "env.sock"))
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    @property
    def url(self) -> str:
        assert self._port is not None
        return self._port.url

    @property
    def sandbox_id(self) -> str:
        return self._box.id

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.limits.startup_timeout_s
        last = "no answer yet"
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self._server.done():
                    raise ImageServerError(f"OpenEnv image {self.image}: its server ended before it was ready: "
                                           f"{self._ended()}")
                try:
                    answer = client.get(f"{self.url}/health")
                    if answer.status_code == 200:
                        return
                    last = f"GET /health answered {answer.status_code}"
                except httpx.HTTPError as e:
                    last = f"GET /health: {type(e).__name__}"
                if time.monotonic() > deadline:
                    raise ImageServerError(f"OpenEnv image {self.image}: not ready within "
                                           f"{self.limits.startup_timeout_s:g} s ({last}; sandbox.startup_timeout_s)")
                time.sleep(POLL_S)

    def _ended(self) -> str:
        try:
            result = self._server.result()
        except Exception as e:  # noqa: BLE001 - the sandbox itself failed: that is the reason
            return f"{type(e).__name__}: {e}"
        # the server's own words: the forwarder's "cannot connect" lines (our readiness polls, which it could not
        # pass on while nothing listened yet) are left out, whatever order the two processes wrote in; its other
        # lines (a command it cannot run, a socket it cannot open) are the reason and stay
        own = [line for line in (result.stderr or result.stdout or "").splitlines()
               if not line.startswith(POLL_NOISE)]
        tail = "\n".join(own)[-2000:].strip()
        why = "killed: out of memory (sandbox.memory_mb)" if result.oom_killed else f"exit status {result.rc}"
        return f"{why}{': ' + tail if tail else ', no output'}"

    def close(self) -> None:
        if self._port is not None:
            self._port.close()
            self._port = None
        if self._box is not None:
            box, self._box = self._box, None
            try:
                sync.run(box.close(), timeout=60)
            except Exception:  # noqa: BLE001 - at exit or after a failed start: the reaper removes what is left
                pass
        shutil.rmtree(self._dir, ignore_errors=True)


_servers: dict[tuple[str, SandboxLimits], ImageServer] = {}
_lock = threading.Lock()


def image_server(image: str, sandbox: dict[str, Any] | None = None) -> ImageServer:
    """``image``'s server under the limits ``sandbox`` asks for, started once per image and limits in this process."""
    limits = parse_limits(image, sandbox)
    with _lock:
        server = _servers.get((image, limits))
        if server is None:
            server = _servers[(image, limits)] = ImageServer(image, limits)
        return server


def image_url(image: str, sandbox: dict[str, Any] | None = None) -> str:
    """The loopback URL of ``image``'s server (:func:`image_server`)."""
    return image_server(image, sandbox).url


def is_image(foreign_id: str) -> bool:
    """An OpenEnv id is an image reference unless it is a URL."""
    return "://" not in foreign_id


def close_image_servers() -> None:
    """Stop every image server this process started (also at exit)."""
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


# Before the interpreter joins executor threads: the server's exec holds a thread of the docker backend's pool
# until the sandbox closes, and concurrent.futures joins its threads at exit (threading's exit hooks run last-in
# first-out, and concurrent.futures.thread registers its own when imported, above), so an atexit hook would wait
# behind that join for ever.
getattr(threading, "_register_atexit", atexit.register)(close_image_servers)
