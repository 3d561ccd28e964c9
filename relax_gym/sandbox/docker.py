"""Docker sandbox backend: one long-lived, locked-down container per sandbox; commands run in it with ``docker exec``.

Container: no network (unless ``spec.network``), read-only root, tmpfs ``/tmp`` and a tmpfs ``workdir`` owned by the
sandbox user, ``spec.mounts`` as bind mounts (``ro`` unless asked), memory (+swap) / cpu / pids limits, all capabilities dropped, ``no-new-privileges``, running as
``spec.uid:spec.gid``, no log driver. Its PID 1 is :mod:`relax_gym.sandbox.docker_init`: it reaps every orphan (so
zombies never pile up against the pids limit), and, being the namespace's init, cannot be killed from inside, so a
command's ``kill -9 -1`` cannot take the sandbox down.

Commands, by default, go to that PID 1 over the container's attached stdin/stdout (:mod:`docker_channel`, one
socket per sandbox): it forks the command, enforces the deadline, caps the output, and once the command ends kills
every process of the sandbox user, so nothing a command started outlives it and no background process can hold the
output pipe open. A command then costs about what the process itself costs, not the ~60-80 ms of a ``docker exec``.

``RELAX_GYM_DOCKER_EXEC=api`` (read when a sandbox is created), or a lost channel, uses ``docker exec`` instead:
every command runs as ``timeout -s KILL <t> <cmd>`` inside a small wrapper shell that, once the command ends,
kills every process of the sandbox user (``kill -9 -1`` spares the caller and PID 1). On our side a wall-clock
deadline (the in-container ``timeout`` only has one-second resolution) kills everything again with a separate exec.
Output is read from the raw exec socket into two :class:`OutputCap` s, stdin is written (then half-closed) from the
same loop. Either way OOM kills are read from the container's memory cgroup ``oom_kill`` counter.

Files go in and out through PID 1 (or ``exec``): ``docker cp`` / ``put_archive`` refuse a read-only root and cannot
see tmpfs mounts; so they are created by, and owned by, the sandbox user.

Blocking SDK calls run in a dedicated thread pool (a long exec holds a thread for its duration; the default asyncio
executor has only ``cpus + 4`` threads, which would serialise sandboxes).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import json
import logging
import math
import os
import select
import socket
import threading
import time
from typing import Any

from relax_gym.sandbox.base import (
    LABEL,
    OWNER_LABEL,
    Backend,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    new_sandbox_id,
    owner_alive,
    owner_tag,
    process_start_time,
)
from relax_gym.sandbox.docker_channel import (
    Channel,
    ChannelBroken,
    ChannelClosed,
    init_source,
    request,
)
from relax_gym.sandbox.spec import DEFAULT_IMAGE, SandboxSpec

log = logging.getLogger(__name__)

OWNER_START_LABEL = f"{LABEL}.owner-start"  # start time (clock ticks since boot) of the owner pid: catches pid reuse
DEFAULT_SOCKET = "unix:///var/run/docker.sock"
PING_TIMEOUT_S = 3.0
API_TIMEOUT_S = 120.0
KILL_GRACE_S = 2.0  # after a wall-clock kill, how long we still drain output before giving up on the stream
POLL_IDLE_S = 1.0  # with no output for this long, ask the engine whether the exec has already ended
MAX_THREADS = 128
MAX_INNER_TIMEOUT_S = 7 * 86400
SHELL = "/bin/sh"  # absolute: a spec.env PATH must not break our own plumbing
EXEC_MODE_VAR = "RELAX_GYM_DOCKER_EXEC"  # "channel" (default): commands through PID 1; "api": one docker exec each
CHANNEL_START_S = 30.0  # how long a new container's PID 1 may take to answer its first ping
CHANNEL_GRACE_S = 10.0  # past a command's timeout, how long PID 1 may take to report before we give up on it
_SHELL_ADDED = ("PWD", "SHLVL", "OLDPWD")  # what the init shell exports that docker exec would not


def _init_command(spec: SandboxSpec) -> list[str]:
    """The container command: a shell finds python3 (also when spec.env sets a PATH without it) and execs
    :mod:`docker_init` as PID 1, passing the environment as it was before the shell touched it."""
    script = 'p="${PATH-}"; s="${PATH+1}"; PATH="/usr/local/bin:/usr/bin:/bin:$PATH" exec python3 -I -S -c "$0" "$p" "$s" "$1"'
    return [SHELL, "-c", script, init_source(), json.dumps([k for k in _SHELL_ADDED if k not in spec.env])]


def exec_mode() -> str:
    mode = (os.environ.get(EXEC_MODE_VAR) or "channel").strip().lower()
    if mode not in ("channel", "api"):
        raise SandboxError(f"{EXEC_MODE_VAR}={mode!r}: choose channel or api")
    return mode

# Runs every command: $1 = seconds, the rest = argv. The command runs as a background job (handed our stdin, which a
# background job would otherwise lose) that the wrapper waits for with its own stderr on /dev/null, so a killed
# command gets no "Killed" line from the wrapper: the output is only the command's. Then everything of this uid dies
# except the wrapper itself and PID 1, and the wrapper exits with the command's status.
_WRAPPER = (
    'command -v timeout >/dev/null || PATH="${PATH:+$PATH:}/usr/bin:/bin"; '  # a spec.env PATH without them
    'exec 3<&0; t=$1; shift; timeout -s KILL "$t" "$@" <&3 3<&- & exec 2>/dev/null 3<&-; '
    'wait $!; rc=$?; kill -9 -1; exit $rc'
)

_SYSTEM_PATH = 'PATH=/usr/local/bin:/usr/bin:/bin; '  # our file scripts use the image's tools, whatever spec.env says
_WRITE = _SYSTEM_PATH + 'd=$(dirname -- "$1") && mkdir -p -- "$d" && cat > "$1" && chmod "$2" -- "$1"'
_READ = _SYSTEM_PATH + (
    'if [ ! -e "$1" ]; then echo "no such file: $1" >&2; exit 2; fi; '
    'if [ -d "$1" ]; then echo "is a directory: $1" >&2; exit 3; fi; '
    'head -c "$2" -- "$1"'
)
_RESET = _SYSTEM_PATH + (
    'chmod 755 -- "$1" 2>/dev/null; chmod -R u+rwX -- "$1" /tmp /dev/shm 2>/dev/null; '
    'for d in "$1" /tmp /dev/shm; do [ -d "$d" ] && rm -rf -- "$d"/* "$d"/.[!.]* "$d"/..?* 2>/dev/null; done; '
    'for d in "$1" /tmp /dev/shm; do [ ! -d "$d" ] || ls -A -- "$d"; done'
)


def _retrieve(fut) -> bool:
    """Mark a future's outcome as seen; True when it did not produce a result."""
    return fut.cancelled() or fut.exception() is not None


def _errors():
    import docker.errors

    return docker.errors


def _failures() -> tuple[type[BaseException], ...]:
    """What an engine call raises when the engine (not our request) fails: API errors, lost connections."""
    import docker.errors
    import requests.exceptions

    return docker.errors.DockerException, requests.exceptions.RequestException


def _owner_alive(owner: str, start: str | None, host: str) -> bool | None:
    """True/False for an owner on this host; None when it lives on another host (or the label is unreadable)."""
    name, _, pid_text = owner.rpartition(":")
    if name != host or not pid_text.isdigit():
        return None
    return owner_alive(name, int(pid_text), start if start and start.isdigit() else None)


def _find_oom_counter(container_pid: int, container_id: str) -> str | None:
    """The file holding the container's memory-cgroup ``oom_kill`` counter, when it is readable from here."""
    candidates = []
    try:
        with open(f"/proc/{container_pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "memory" in controllers.split(","):
                    candidates.append(f"/sys/fs/cgroup/memory{path}/memory.oom_control")
                elif controllers == "":
                    candidates.append(f"/sys/fs/cgroup{path}/memory.events")
    except (OSError, ValueError):
        pass
    candidates += [
        f"/sys/fs/cgroup/memory/docker/{container_id}/memory.oom_control",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.events",
        f"/sys/fs/cgroup/docker/{container_id}/memory.events",
    ]
    for path in candidates:
        if container_id in path and _read_oom_kills(path) is not None:
            return path
    return None


def _read_oom_kills(path: str | None) -> int | None:
    if not path:
        return None
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _bind_mounts(spec: SandboxSpec) -> list:
    """``spec.mounts`` as docker bind mounts (the engine must see the same host paths as we do)."""
    from docker.types import Mount as DockerMount

    return [DockerMount(target=m.target, source=m.source, type="bind", read_only=m.read_only)
            for m in spec.mounts_in_order()]


class _Stream:
    """Demultiplexes docker's exec stream (8-byte frame headers: stream id, 3 zero bytes, big-endian size)."""

    def __init__(self, out: OutputCap, err: OutputCap) -> None:
        self.buf = bytearray()
        self.sinks = {1: out, 2: err}

    def feed(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        pos = 0
        while len(buf) - pos >= 8:
            size = int.from_bytes(buf[pos + 4 : pos + 8], "big")
            if len(buf) - pos - 8 < size:
                break
            sink = self.sinks.get(buf[pos], self.sinks[2])
            sink.feed(bytes(buf[pos + 8 : pos + 8 + size]))
            pos += 8 + size
        if pos:
            del buf[:pos]


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, owner: DockerBackend, container_id: str,
                 oom_file: str | None, channel: Channel | None = None) -> None:
        super().__init__(spec, sandbox_id)
        self._owner = owner
        self.container_id = container_id
        self._oom_file = oom_file
        self._channel = channel  # None: every command is a docker exec
        # One command at a time: the clean-up after each one kills all of the sandbox user's processes.
        self._lock = threading.Lock()

    # -- plumbing ------------------------------------------------------------------------------------------

    @property
    def _api(self):
        return self._owner._api()

    def _gone(self, err: Exception) -> SandboxError:
        return SandboxError(f"sandbox {self.id} is gone (container {self.container_id[:12]}): {err}")

    async def _call(self, fn, *args):
        """Run a blocking command function in the backend's pool; a cancelled caller makes it stop early."""
        cancel = threading.Event()
        fut = asyncio.get_running_loop().run_in_executor(self._owner._pool, fn, *args, cancel)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancel.set()
            fut.add_done_callback(_retrieve)  # the worker ends soon (it kills the command); nobody awaits it
            raise

    def _user(self) -> str:
        return f"{self.spec.uid}:{self.spec.gid}"

    def _kill_all(self) -> None:
        """Kill every process of the sandbox user (PID 1 and the killer itself are spared)."""
        errors = _errors()
        for attempt in range(20):
            try:
                eid = self._api.exec_create(self.container_id, [SHELL, "-c", "kill -9 -1"], user=self._user())["Id"]
                self._api.exec_start(eid)
                code = self._api.exec_inspect(eid).get("ExitCode")
                if code in (0, 1):  # 1: nothing left to kill
                    return
            except errors.NotFound as e:
                raise self._gone(e) from e
            except errors.APIError as e:
                if e.status_code == 409:  # not running
                    raise self._gone(e) from e
            except _failures():
                pass
            time.sleep(0.05 * (attempt + 1))  # e.g. the pids limit is exhausted right now; try again
        log.warning("sandbox %s: could not kill leftover processes", self.id)

    def _run(self, argv: list[str], timeout: float, stdin: bytes | None, out: OutputCap, err: OutputCap,
             cancel: threading.Event) -> dict[str, Any]:
        """Run ``argv`` under the wrapper; stream output into the caps. Returns rc / timed_out / oom / duration."""
        errors = _errors()
        api = self._api
        with self._lock:
            if cancel.is_set():
                raise SandboxError("cancelled")
            oom_before = _read_oom_kills(self._oom_file)
            limit = min(max(1, math.ceil(timeout)), MAX_INNER_TIMEOUT_S)  # our own deadline is the precise one
            wrapped = [SHELL, "-c", _WRAPPER, "relax-gym", str(limit), *argv]
            t0 = time.monotonic()
            try:
                eid = api.exec_create(self.container_id, wrapped, stdin=stdin is not None, user=self._user(),
                                      workdir=self.spec.workdir)["Id"]
                sock = api.exec_start(eid, socket=True)
            except errors.NotFound as e:
                raise self._gone(e) from e
            except errors.APIError as e:
                if e.status_code == 409:
                    raise self._gone(e) from e
                raise SandboxError(f"sandbox {self.id}: docker exec failed: {e}") from e
            except _failures() as e:
                raise SandboxError(f"sandbox {self.id}: docker exec failed: {e}") from e
            raw: socket.socket = getattr(sock, "_sock", sock)
            deadline = t0 + timeout
            killed = ended = False
            try:
                killed, ended = self._pump(raw, eid, stdin, _Stream(out, err), deadline, cancel)
            finally:
                for closable in (sock, raw):
                    try:
                        closable.close()
                    except OSError:
                        pass
            duration = time.monotonic() - t0
            try:
                info = api.exec_inspect(eid)
            except errors.NotFound as e:
                raise self._gone(e) from e
            except _failures() as e:
                raise SandboxError(f"sandbox {self.id}: lost the engine during exec: {e}") from e
            running = bool(info.get("Running"))
            rc = info.get("ExitCode")
            if running or not ended or rc is None or (rc >= 128 and not killed):
                # The wrapper may not have cleaned up (it was killed, or is still running): do it from outside.
                # (A kill of ours that ended the stream already did; rc >= 128 is ambiguous, so kill again.)
                self._kill_all()
            if running or rc is None:
                killed, rc = True, 137
            return self._outcome(rc, killed, duration, timeout, oom_before)

    def _outcome(self, rc: int, killed: bool, duration: float, timeout: float, oom_before: int | None) -> dict[str, Any]:
        oom_after = _read_oom_kills(self._oom_file)
        if oom_before is not None and oom_after is not None:
            oom = oom_after > oom_before
        else:  # no cgroup counter readable from here: a SIGKILL we did not send is most likely the OOM killer
            oom = rc == 137 and not killed and duration < timeout
        timed_out = killed or (rc == 137 and not oom and duration >= timeout - 0.05)
        return {"rc": rc, "timed_out": timed_out, "oom": oom, "duration": duration}

    # -- the channel to PID 1 ------------------------------------------------------------------------------

    def _run_channel(self, channel: Channel, argv: list[str], timeout: float, stdin: bytes | None, out: OutputCap,
                     err: OutputCap, cancel: threading.Event) -> dict[str, Any]:
        """Run ``argv`` through PID 1 (see :mod:`docker_init`); the status as :meth:`_run` gives it."""
        with self._lock:
            if cancel.is_set():
                raise SandboxError("cancelled")
            oom_before = _read_oom_kills(self._oom_file)
            t0 = time.monotonic()
            head = {"op": "exec", "argv": argv, "cwd": self.spec.workdir, "timeout": timeout,
                    "caps": [out.limit, err.limit], "stdin": stdin is not None}
            try:
                status = channel.call(head, stdin or b"", out=out, err=err, reply_by=t0 + timeout + CHANNEL_GRACE_S,
                                      cancel=cancel, on_cancel=request({"op": "kill"}))
            except ChannelBroken as e:
                raise self._channel_lost(e) from e
            out.dropped += status["dropped"][0]
            err.dropped += status["dropped"][1]
            return self._outcome(status["rc"], status["killed"], time.monotonic() - t0, timeout, oom_before)

    def _live_channel(self) -> Channel | None:
        """The channel, or None (docker exec) when there is none or it was closed between calls."""
        channel = self._channel
        if channel is not None and channel.broken:
            log.warning("sandbox %s: its command channel is closed; using docker exec from now on", self.id)
            channel = self._channel = None
        return channel

    def _channel_op(self, channel: Channel, head: dict[str, Any], body: bytes, out: OutputCap | None,
                    cancel: threading.Event) -> dict[str, Any]:
        """A file or reset request to PID 1; its status (``ok``, ``error``)."""
        with self._lock:
            try:
                return channel.call(head, body, out=out, reply_by=time.monotonic() + self._file_timeout())
            except ChannelBroken as e:
                raise self._channel_lost(e) from e

    def _channel_lost(self, why: Exception) -> SandboxError:
        """The error to raise for a failed channel: the sandbox is gone, or (still running) it falls back to
        ``docker exec`` from now on, after its leftovers are killed; or it is being closed (no fallback then)."""
        self._channel = None
        if isinstance(why, ChannelClosed):
            return SandboxError(f"sandbox {self.id} was closed during the call")
        errors = _errors()
        try:
            running = bool(self._api.inspect_container(self.container_id)["State"].get("Running"))
        except errors.NotFound as e:
            return self._gone(e)
        except _failures() as e:
            return SandboxError(f"sandbox {self.id}: lost the engine: {e}")
        if not running:
            return self._gone(why)
        log.warning("sandbox %s lost its command channel (%s); using docker exec from now on", self.id, why)
        try:
            self._kill_all()
        except SandboxError as e:
            return e
        return SandboxError(f"sandbox {self.id}: lost its command channel during the call: {why}")

    def _pump(self, raw: socket.socket, eid: str, stdin: bytes | None, stream: _Stream, deadline: float,
              cancel: threading.Event) -> tuple[bool, bool]:
        """Feed stdin and read output until EOF, the deadline, or the command ended with the pipe still held.
        Returns (killed by us, stream reached EOF)."""
        raw.setblocking(False)
        poller = select.poll()  # not select(): a busy process has descriptors above FD_SETSIZE
        pending = memoryview(stdin) if stdin else None
        if stdin is not None and not stdin:
            self._shut_write(raw)
        poller.register(raw, select.POLLIN | (select.POLLOUT if pending is not None else 0))
        killed = False
        kill_deadline = None
        last_activity = time.monotonic()
        while True:
            now = time.monotonic()
            if kill_deadline is None and (now >= deadline or cancel.is_set()):
                killed = True
                self._kill_all()  # kills the wrapper too, which ends the stream
                kill_deadline = time.monotonic() + KILL_GRACE_S
                if pending is not None:
                    pending = None
                    poller.modify(raw, select.POLLIN)
            if kill_deadline is not None and now >= kill_deadline:
                return killed, False
            wait = min(0.25, max(0.0, (kill_deadline or deadline) - now))
            events = 0
            for _, ev in poller.poll(wait * 1000):
                events |= ev
            if events & select.POLLOUT and pending is not None:
                try:
                    sent = raw.send(pending[: 1 << 16])
                    pending = pending[sent:]
                except BlockingIOError:
                    pass
                except OSError:
                    pending = pending[:0]  # the command closed its stdin
                if not pending:
                    pending = None
                    self._shut_write(raw)
                    poller.modify(raw, select.POLLIN)
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    chunk = raw.recv(1 << 18)
                except BlockingIOError:
                    continue
                except OSError:
                    return killed, False
                if not chunk:
                    return killed, True
                stream.feed(chunk)
                last_activity = time.monotonic()
            elif kill_deadline is None and time.monotonic() - last_activity >= POLL_IDLE_S:
                # Quiet for a while: if the wrapper is gone but something still holds the pipe, stop waiting.
                last_activity = time.monotonic()
                try:
                    if not self._api.exec_inspect(eid).get("Running"):
                        self._drain(raw, stream)
                        return killed, False
                except _failures():
                    return killed, False

    @staticmethod
    def _drain(raw: socket.socket, stream: _Stream) -> None:
        """Read what is already buffered (for at most 0.2 s)."""
        poller = select.poll()
        poller.register(raw, select.POLLIN)
        end = time.monotonic() + 0.2
        while time.monotonic() < end and poller.poll(50):
            try:
                chunk = raw.recv(1 << 18)
            except OSError:
                return
            if not chunk:
                return
            stream.feed(chunk)

    @staticmethod
    def _shut_write(raw: socket.socket) -> None:
        try:
            raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _command(self, argv: list[str], timeout: float, stdin: bytes | None, out_limit: int, err_limit: int,
                 cancel: threading.Event) -> tuple[dict[str, Any], OutputCap, OutputCap]:
        out, err = OutputCap(out_limit), OutputCap(err_limit)
        channel = self._live_channel()
        if channel is not None:
            status = self._run_channel(channel, argv, timeout, stdin, out, err, cancel)
        else:
            status = self._run(argv, timeout, stdin, out, err, cancel)
        return status, out, err

    # -- hooks ---------------------------------------------------------------------------------------------

    async def _exec(self, cmd: str | list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        argv = [SHELL, "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ValueError("empty command")
        cap = self.spec.max_output_bytes
        status, out, err = await self._call(self._command, argv, timeout, stdin, cap, cap)
        return ExecResult(
            rc=status["rc"],
            stdout=out.text(),
            stderr=err.text(),
            timed_out=status["timed_out"],
            oom_killed=status["oom"],
            duration=status["duration"],
            truncated=bool(out.dropped or err.dropped),
        )

    def _file_timeout(self) -> float:
        return max(self.spec.exec_timeout_s, 30.0)

    async def _ask(self, channel: Channel, head: dict[str, Any], body: bytes = b"", out: OutputCap | None = None,
                   *, failed: str) -> None:
        """A file or reset request to PID 1; raises SandboxError starting with ``failed`` when it did not work."""
        status = await self._call(self._channel_op, channel, head, body, out)
        if not status.get("ok"):
            why = status.get("error") or f"left {status.get('left')}"
            raise SandboxError(f"{failed} in sandbox {self.id}: {why}")

    async def _write_file(self, path: str, data: bytes, mode: int) -> None:
        channel = self._live_channel()
        if channel is not None:
            head = {"op": "write", "path": path, "mode": mode & 0o7777}
            return await self._ask(channel, head, data, failed=f"cannot write {path}")
        argv = [SHELL, "-c", _WRITE, "relax-gym-write", path, f"{mode & 0o7777:o}"]
        status, _, err = await self._call(self._command, argv, self._file_timeout(), data, 4096, 4096)
        if status["rc"] != 0:
            why = err.text().strip() or ("timed out" if status["timed_out"] else f"exit status {status['rc']}")
            raise SandboxError(f"cannot write {path} in sandbox {self.id}: {why}")

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        channel = self._live_channel()
        if channel is not None:
            out = OutputCap(max_bytes)
            await self._ask(channel, {"op": "read", "path": path, "max": max_bytes}, out=out, failed=f"cannot read {path}")
            return bytes(out.kept)
        argv = [SHELL, "-c", _READ, "relax-gym-read", path, str(max_bytes)]
        status, out, err = await self._call(self._command, argv, self._file_timeout(), None, max_bytes, 4096)
        if status["rc"] != 0:
            why = err.text().strip() or ("timed out" if status["timed_out"] else f"exit status {status['rc']}")
            raise SandboxError(f"cannot read {path} in sandbox {self.id}: {why}")
        return bytes(out.kept)

    async def _reset(self) -> None:
        channel = self._live_channel()
        if channel is not None:
            head = {"op": "reset", "dirs": [self.spec.workdir, "/tmp", "/dev/shm"]}
            return await self._ask(channel, head, failed="reset failed")
        argv = [SHELL, "-c", _RESET, "relax-gym-reset", self.spec.workdir]
        status, out, err = await self._call(self._command, argv, self._file_timeout(), None, 4096, 4096)
        left = out.text().split()  # whatever is still in workdir, /tmp or /dev/shm
        if status["rc"] != 0 or left:
            raise SandboxError(f"reset of sandbox {self.id} failed: left {left[:5]} ({err.text().strip()})")

    async def _close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        await asyncio.get_running_loop().run_in_executor(self._owner._pool, self._owner._remove, self.container_id)


class DockerBackend(Backend):
    name = "docker"

    def __init__(self) -> None:
        self._client = None
        self._client_lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="relax-gym-docker")
        self._images: set[str] = set()
        atexit.register(self._atexit)

    # -- engine --------------------------------------------------------------------------------------------

    @staticmethod
    def _base_url() -> str:
        return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET

    def _connect(self):
        try:
            import docker
        except ImportError as e:
            raise SandboxUnavailable("docker SDK not installed: pip install docker") from e
        with self._client_lock:
            if self._client is None:
                try:
                    # A short timeout while the client asks the engine for its API version (a hung engine must
                    # not hang check()), then the long one for real work (image import, big execs).
                    client = docker.from_env(timeout=int(PING_TIMEOUT_S), max_pool_size=MAX_THREADS)
                except docker.errors.DockerException as e:
                    raise SandboxUnavailable(
                        f"no Docker engine answers at {self._base_url()}: start dockerd ({e})"
                    ) from e
                client.api.timeout = API_TIMEOUT_S
                self._client = client
            return self._client

    def _api(self):
        return self._connect().api

    def _ping(self, client) -> None:
        api = client.api
        try:
            resp = api._get(api._url("/_ping"), timeout=PING_TIMEOUT_S)
            api._raise_for_status(resp)
        except AttributeError:  # private SDK helpers moved: fall back to the public (slower to time out) ping
            client.ping()

    def check(self) -> str | None:
        try:
            client = self._connect()
        except SandboxUnavailable as e:
            return str(e)
        try:
            self._ping(client)
        except Exception:
            with self._client_lock:
                self._client = None
            return f"no Docker engine answers at {self._base_url()}: start dockerd (apt-get install docker.io; dockerd)"
        return None

    # -- sandboxes -----------------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        problem = await asyncio.get_running_loop().run_in_executor(self._pool, self.check)
        if problem:
            raise SandboxUnavailable(f"docker sandbox backend cannot run here: {problem}")
        sandbox_id = new_sandbox_id(self.name)
        fut = asyncio.get_running_loop().run_in_executor(self._pool, self._create_blocking, spec, sandbox_id)
        try:
            container_id, oom_file, channel = await asyncio.shield(fut)
        except asyncio.CancelledError:
            # The container may still come up after our caller gave up: remove it then.
            fut.add_done_callback(lambda f: _retrieve(f) or self._discard(*f.result()))
            raise
        return DockerSandbox(spec, sandbox_id, self, container_id, oom_file, channel)

    def _discard(self, container_id: str, oom_file: str | None, channel: Channel | None) -> None:
        if channel is not None:
            channel.close()
        self._pool.submit(self._remove, container_id)

    def image_config(self, image: str) -> dict[str, Any]:
        """The image's ``Config`` (Cmd, Entrypoint, WorkingDir, Env, ExposedPorts, ...) as the engine reports it."""
        problem = self.check()
        if problem:
            raise SandboxUnavailable(f"docker sandbox backend cannot run here: {problem}")
        try:
            return self._api().inspect_image(image).get("Config") or {}
        except _errors().ImageNotFound:
            raise SandboxError(f"image {image!r} not found in the local Docker engine (no registry is used: "
                               f"`docker load`, `docker build` or `docker import` it first)") from None
        except _failures() as e:
            raise SandboxError(f"cannot inspect image {image!r}: {e}") from e

    def _ensure_image(self, image: str) -> None:
        from relax_gym.sandbox import image as images

        if image in self._images:
            return
        client = self._connect()
        try:
            present = images.image_exists(image, client)
        except _failures() as e:
            raise SandboxError(f"cannot look up image {image!r}: {e}") from e
        if not present:
            if image != DEFAULT_IMAGE:
                raise SandboxError(
                    f"image {image!r} not found; build it with `relax-gym sandbox build-image` (the default "
                    f"{DEFAULT_IMAGE!r}) or `docker build`/`docker import` it (no registry is used)"
                )
            images.build_base_image(image, client=client)
        self._images.add(image)

    def _create_blocking(self, spec: SandboxSpec, sandbox_id: str) -> tuple[str, str | None, Channel | None]:
        """Create and start the container; attach the command channel to its PID 1 unless the mode is ``api``."""
        errors = _errors()
        use_channel = exec_mode() == "channel"
        problem = spec.mount_source_problem()
        if problem:
            raise SandboxError(f"cannot create a docker sandbox: {problem}")
        self._ensure_image(spec.image)
        api = self._api()
        workdir_mb = max(spec.tmpfs_mb, spec.memory_mb)  # tmpfs pages count against the memory limit anyway
        host_config = api.create_host_config(
            network_mode="bridge" if spec.network else "none",
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(spec.cpus * 1e9),
            pids_limit=spec.pids,
            read_only=True,
            tmpfs={
                "/tmp": f"size={spec.tmpfs_mb}m,mode=1777,exec,nosuid,nodev",
                spec.workdir: f"size={workdir_mb}m,uid={spec.uid},gid={spec.gid},mode=0755,exec,nosuid,nodev",
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            runtime=spec.runtime,
            init=False,  # PID 1 is docker_init; docker's init would make it killable from inside
            mounts=_bind_mounts(spec),
            log_config={"type": "none", "config": {}},  # PID 1's stdout is our channel, not a log
        )
        owner_start = process_start_time(os.getpid())
        labels = {LABEL: sandbox_id, OWNER_LABEL: owner_tag()}
        if owner_start is not None:
            labels[OWNER_START_LABEL] = str(owner_start)
        env = {"HOME": spec.workdir, **spec.env}
        create = functools.partial(
            api.create_container, spec.image, _init_command(spec), user=f"{spec.uid}:{spec.gid}",
            environment=env, working_dir=spec.workdir, labels=labels, name=sandbox_id, host_config=host_config,
            detach=True, stdin_open=True, tty=False,
            healthcheck={"test": ["NONE"]},  # an image's own HEALTHCHECK would run processes beside our PID 1's
        )
        try:
            try:
                container_id = create()["Id"]
            except errors.ImageNotFound:  # removed since we last looked
                self._images.discard(spec.image)
                self._ensure_image(spec.image)
                container_id = create()["Id"]
        except _failures() as e:
            raise SandboxError(self._explain(e, spec, "create")) from e
        channel = None
        try:
            if use_channel:  # attached before the start: PID 1 never runs without its host end
                params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
                channel = Channel(api.attach_socket(container_id, params=params), sandbox_id)
            api.start(container_id)
            info = api.inspect_container(container_id)
            if not info["State"].get("Running"):
                raise SandboxError(f"container exited at once: {info['State'].get('Error') or info['State']}")
            if channel is not None:
                channel.call({"op": "ping"}, reply_by=time.monotonic() + CHANNEL_START_S)
        except (*_failures(), SandboxError, ChannelBroken) as e:
            if channel is not None:
                channel.close()
            self._remove(container_id)
            raise SandboxError(self._explain(e, spec, "start")) from e
        except BaseException:
            if channel is not None:
                channel.close()
            self._remove(container_id)
            raise
        return container_id, _find_oom_counter(info["State"].get("Pid") or 0, container_id), channel

    @staticmethod
    def _explain(e: Exception, spec: SandboxSpec, what: str) -> str:
        text = str(e)
        if spec.runtime and "runtime" in text.lower():
            return f"docker runtime {spec.runtime!r} is not available to the engine: {text}"
        if "python3" in text and ("not found" in text or "no such file" in text.lower()):
            return f"image {spec.image!r} has no python3 on its PATH (the sandbox's init needs it): {text}"
        return f"could not {what} a sandbox container from {spec.image!r}: {text}"

    def _remove(self, container_id: str) -> None:
        errors = _errors()
        api = self._api()
        last: BaseException | None = None
        for attempt in range(10):
            try:
                api.remove_container(container_id, force=True)
                return
            except errors.NotFound:
                return
            except _failures() as e:  # e.g. 409 "removal already in progress": wait for it
                last = e
            try:
                api.inspect_container(container_id)
            except errors.NotFound:
                return
            except _failures():
                pass
            time.sleep(0.1 * (attempt + 1))
        raise SandboxError(f"could not remove container {container_id[:12]}: {last}")

    def _ours(self, label_filter: str) -> list[dict]:
        return self._api().containers(all=True, filters={"label": label_filter})

    def live(self) -> list[str]:
        found = self._ours(f"{OWNER_LABEL}={owner_tag()}")
        return [labels[LABEL] for labels in ((c.get("Labels") or {}) for c in found) if LABEL in labels]

    def every(self) -> list[str]:
        return sorted((c.get("Labels") or {}).get(LABEL, c["Id"][:12]) for c in self._ours(LABEL))

    def reap(self, *, all_owners: bool = False) -> int:
        me, host = owner_tag(), os.uname().nodename
        removed = 0
        for c in self._ours(LABEL):
            labels = c.get("Labels") or {}
            owner = labels.get(OWNER_LABEL, "")
            if not all_owners:
                if owner == me:
                    continue
                alive = _owner_alive(owner, labels.get(OWNER_START_LABEL), host) if owner else False
                if alive is None or alive:  # another host's, or a live owner's: not ours to judge
                    continue
            try:
                self._remove(c["Id"])
                removed += 1
            except SandboxError as e:
                log.warning("reap: %s", e)
        return removed

    def _atexit(self) -> None:
        """Backstop: remove this process's containers that nobody closed, then close the client's sockets."""
        if self._client is None:
            return
        try:
            for c in self._ours(f"{OWNER_LABEL}={owner_tag()}"):
                try:
                    self._api().remove_container(c["Id"], force=True)
                except Exception:
                    pass
        except Exception:
            pass
        try:
            self._client.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
