"""The sandbox contract shared by every backend.

Lifecycle invariants (each backend's tests check them):

- ``exec`` never raises for anything the command does: non-zero exit, timeout, OOM kill and oversized output are
  all reported in :class:`ExecResult`. It raises :class:`SandboxError` only when the sandbox itself is gone.
- Every command runs under a wall-clock limit (``timeout`` or ``spec.exec_timeout_s``); on expiry the command *and
  everything it started* are killed, so nothing keeps running into the next command.
- stdout and stderr are each capped at ``spec.max_output_bytes``; the rest is drained and dropped, and the kept
  text ends with :data:`TRUNCATION_MARKER`.
- ``reset()`` returns the sandbox to a clean state (workdir and /tmp emptied, no processes left) so a pool can hand
  it to another episode; ``close()`` is idempotent, safe to call from any state, and shielded from cancellation.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import os
import time
from dataclasses import dataclass

from relax_gym.sandbox.spec import SandboxSpec

LABEL = "relax-gym.sandbox"  # every container / cgroup / process group of ours carries this
OWNER_LABEL = "relax-gym.owner"  # "<hostname>:<pid>" of the process that created it (for reaping)
TRUNCATION_MARKER = "\n[relax-gym: output truncated, {dropped} more bytes dropped]\n"

_ids = itertools.count()


class SandboxError(RuntimeError):
    """The sandbox (not the command) failed: it could not be created, or it is gone."""


class SandboxUnavailable(SandboxError):
    """A backend cannot run on this machine; the message says what to install or start."""


@dataclass(frozen=True)
class ExecResult:
    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False
    oom_killed: bool = False
    duration: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and not self.oom_killed


def owner_tag() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def process_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot, field 22 of /proc/<pid>/stat), or None. Stored with
    an owner tag, it tells a live owner from another process that reused its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_alive(host: str | None, pid: int | None, start: int | str | None) -> bool | None:
    """Is the process that created a sandbox still running? None when it cannot be told: another host's
    owner, or no pid recorded. A pid that now belongs to a process started at another time counts as dead."""
    if (host is not None and host != os.uname().nodename) or pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    if start in (None, ""):
        return True
    return process_start_time(pid) in (None, int(start))


def new_sandbox_id(backend: str) -> str:
    return f"rg-{backend}-{os.getpid()}-{next(_ids)}-{int(time.time() * 1000) % 100000}"


class OutputCap:
    """Collects one output stream up to ``limit`` bytes, counting (not storing) the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.dropped += max(0, len(chunk) - max(room, 0))

    def text(self) -> str:
        out = self.kept.decode("utf-8", errors="replace")
        return out + TRUNCATION_MARKER.format(dropped=self.dropped) if self.dropped else out


class Sandbox(abc.ABC):
    """One isolated place to run commands. Async API; :class:`SyncSandbox` wraps it for synchronous callers."""

    backend: str = "?"

    def __init__(self, spec: SandboxSpec, sandbox_id: str) -> None:
        self.spec = spec
        self.id = sandbox_id
        self.created_at = time.monotonic()
        self._closed = False
        self._close_task: asyncio.Task | None = None

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.created_at

    async def exec(self, cmd: str | list[str], timeout: float | None = None, stdin: bytes | str | None = None) -> ExecResult:
        """Run ``cmd`` (a shell string, or an argv list) in ``spec.workdir`` as the sandbox user."""
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return await self._exec(cmd, timeout or self.spec.exec_timeout_s, data)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Write a file (relative paths are inside ``workdir``)."""
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        await self._write_file(self._abs(path), data.encode() if isinstance(data, str) else data, mode)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """Read a file; at most ``max_bytes`` (default ``spec.max_output_bytes``) are returned, the rest is cut.
        A missing file or a path outside the workdir and /tmp raises SandboxError naming the path."""
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        return await self._read_file(self._abs(path), max_bytes or self.spec.max_output_bytes)

    async def reset(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        await self._reset()

    async def close(self) -> None:
        """Idempotent and shielded: a cancelled caller still leaves the sandbox destroyed."""
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.spec.workdir.rstrip('/')}/{path}"

    # -- backend hooks ------------------------------------------------------------------------------------

    @abc.abstractmethod
    async def _exec(self, cmd: str | list[str], timeout: float, stdin: bytes | None) -> ExecResult: ...

    @abc.abstractmethod
    async def _write_file(self, path: str, data: bytes, mode: int) -> None: ...

    @abc.abstractmethod
    async def _read_file(self, path: str, max_bytes: int) -> bytes: ...

    @abc.abstractmethod
    async def _reset(self) -> None: ...

    @abc.abstractmethod
    async def _close(self) -> None: ...

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Backend(abc.ABC):
    name: str = "?"

    @abc.abstractmethod
    def check(self) -> str | None:
        """None when the backend works here, else the reason and what to install or start."""

    @abc.abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox; raises SandboxUnavailable / SandboxError with a clear message."""

    @abc.abstractmethod
    def reap(self, *, all_owners: bool = False) -> int:
        """Destroy leftovers of ours (dead owners only, unless ``all_owners``); returns how many."""

    @abc.abstractmethod
    def live(self) -> list[str]:
        """Ids of this process's sandboxes that still hold resources (containers, cgroups, processes)."""

    @abc.abstractmethod
    def every(self) -> list[str]:
        """Ids of every sandbox of ours on this machine that still holds resources, whatever process owns it."""
