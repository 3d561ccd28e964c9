"""A sandbox for the lifetime of one episode, leased lazily from a process-wide pool.

Nothing is created until the first tool call; the lease's deadline is the episode's (``episode_timeout_s`` after
the first call), so a hung tool cannot outlive the episode; ``release()`` at episode end hands the sandbox back
for a reset. Synchronous, for gymnasium envs: the pool lives on the shared sandbox loop.

The pools stay open while anything holds them (:class:`PoolHold`: every :class:`EpisodeSandbox` takes one, and an
env closes it in its ``close()``), so sandboxes stay warm from one episode to the next; when the last hold is
released the pools close, and every sandbox of theirs is destroyed (containers removed) before that ``close()``
returns. Nothing of ours is left running by a process whose envs were closed.
"""

from __future__ import annotations

import threading
import time

from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import select_backend
from relax_gym.sandbox.base import ExecResult
from relax_gym.sandbox.pool import Lease, SandboxPool
from relax_gym.sandbox.spec import SandboxSpec

_pools: dict[str, SandboxPool] = {}
_pools_lock = threading.Lock()
_holds = 0  # open PoolHold objects in this process


def shared_pool(backend_name: str | None = None) -> SandboxPool:
    """One pool per backend per process (backend from RELAX_GYM_SANDBOX / auto when None)."""
    backend = select_backend(backend_name)
    with _pools_lock:
        pool = _pools.get(backend.name)
        if pool is None or pool._closed:
            pool = _pools[backend.name] = SandboxPool(backend, max_size=32)
    return pool


def close_shared_pools(timeout: float = 120.0) -> int:
    """Close every shared pool of this process (their sandboxes destroyed, containers removed): what a trainer does
    when its run ends, so that no sandbox of ours outlives the run in a process that goes on (a notebook, a test
    session). A later episode opens a new pool. Answers the number of pools closed."""
    with _pools_lock:
        pools = [p for p in _pools.values() if not p._closed]
        _pools.clear()
    for pool in pools:
        sync.run(pool.close(), timeout=timeout)
    return len(pools)


def open_holds() -> int:
    """How many :class:`PoolHold` objects of this process are not released."""
    return _holds


class PoolHold:
    """A claim that keeps this process's shared pools open. Releasing the last one closes them: their sandboxes are
    destroyed before :meth:`release` returns. Release is idempotent."""

    def __init__(self) -> None:
        global _holds
        with _pools_lock:
            _holds += 1
        self._held = True

    @property
    def held(self) -> bool:
        return self._held

    def release(self, timeout: float = 120.0) -> None:
        global _holds
        with _pools_lock:
            if not self._held:
                return
            self._held = False
            _holds -= 1
            last = _holds == 0
        if last:
            close_shared_pools(timeout)


class EpisodeSandbox:
    """``hold`` (default True): keep the shared pools open until :meth:`close` (an env's sandbox); False for a
    short-lived one inside an episode whose env holds the pools itself."""

    def __init__(self, spec: SandboxSpec, *, backend: str | None = None, episode_timeout_s: float = 300.0,
                 hold: bool = True) -> None:
        self.spec = spec
        self.backend_name = backend
        self.episode_timeout_s = episode_timeout_s
        self._lease: Lease | None = None
        self._hold = PoolHold() if hold else None

    @property
    def active(self) -> bool:
        return self._lease is not None

    def exec(self, cmd: str | list[str], timeout: float | None = None, stdin: bytes | str | None = None) -> ExecResult:
        return sync.run(self._ensure().exec(cmd, timeout, stdin))

    def write_file(self, path: str, data: bytes | str) -> None:
        sync.run(self._ensure().write_file(path, data))

    def release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            pool = shared_pool(self.backend_name)
            sync.run(pool.release(lease), timeout=120)

    def close(self) -> None:
        """Hand back the episode's sandbox and release this sandbox's hold on the shared pools: the last hold
        closes them (see the module doc). Idempotent."""
        try:
            self.release()
        finally:
            if self._hold is not None:
                self._hold.release()

    def _ensure(self) -> Lease:
        if self._lease is None:
            pool = shared_pool(self.backend_name)
            deadline = time.monotonic() + self.episode_timeout_s
            self._lease = sync.run(pool.acquire(self.spec, deadline))
        return self._lease
