"""A pool of warm sandboxes, leased to episodes with a deadline.

- Warm sandboxes are kept per spec (``min_warm`` made ahead, at most ``max_size`` alive per spec).
- ``acquire(spec, deadline)`` returns a :class:`Lease`; it waits for a free slot but never past the deadline
  (then :class:`PoolTimeout`). A lease whose deadline passes is revoked: its sandbox is destroyed, so a hung tool
  never outlives the rollout that started it.
- ``release(lease)`` resets the sandbox (workdir and /tmp emptied, processes killed) and keeps it warm; a sandbox
  whose reset fails, that is older than ``spec.lifetime_s`` or used ``max_uses`` times is destroyed instead.
  Episodes never share state.
- Creation is rate-limited (``create_per_s``, ``max_concurrent_creates``) so 32 episodes starting at once queue
  instead of stampeding the engine (SWE-ReX issue #261 is a hang on exactly this).
- Retired sandboxes are replaced in the background (``refill``), up to the most leases a spec has had out at
  once: an episode that arrives meanwhile takes the sandbox being made (or an idle one) instead of starting its
  own create, so after the first wave no episode waits for a container to start. A stale idle sandbox found at
  acquire is destroyed in the background too.
- Orphans of dead processes are reaped by label at ``start()``; ``close()`` destroys everything and an exit
  backstop closes pools the program forgot (before Python stops its thread pools: ``exit_order``).
- Every deadline, age and creation spacing is read from one clock, ``clock`` (default ``time.monotonic``): a caller's
  deadline is a value of that clock. Tests hand in a virtual event loop's ``loop.time`` so that lease expiry,
  lifetimes and rate limits happen in simulated time, in the same order on every run.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from relax_gym.sandbox import sync
from relax_gym.sandbox.backends import select_backend
from relax_gym.sandbox.base import Backend, Sandbox, SandboxError
from relax_gym.sandbox.exit_order import before_thread_pools_stop
from relax_gym.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)


class PoolTimeout(SandboxError):
    """No sandbox could be had before the deadline."""


class LeaseExpired(SandboxError):
    """The lease's deadline passed; its sandbox was destroyed."""


@dataclass
class Lease:
    sandbox: Sandbox
    deadline: float | None  # a value of the pool's clock
    spec_key: str
    expired: bool = False
    _timer: asyncio.TimerHandle | None = field(default=None, repr=False)
    _clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @property
    def id(self) -> str:
        return self.sandbox.id

    async def exec(self, cmd, timeout: float | None = None, stdin=None):
        self._check()
        if self.deadline is not None:  # a command may not run past the lease
            left = self.deadline - self._clock()
            timeout = min(timeout or self.sandbox.spec.exec_timeout_s, max(left, 0.05))
        return await self.sandbox.exec(cmd, timeout, stdin)

    async def write_file(self, path: str, data, mode: int = 0o644) -> None:
        self._check()
        await self.sandbox.write_file(path, data, mode)

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        self._check()
        return await self.sandbox.read_file(path, max_bytes)

    def _check(self) -> None:
        if self.expired:
            raise LeaseExpired(f"lease on sandbox {self.sandbox.id} expired at its deadline; the sandbox was destroyed")


@dataclass
class PoolStats:
    created: int = 0
    destroyed: int = 0
    reused: int = 0
    expired: int = 0
    reaped: int = 0
    refilled: int = 0  # sandboxes made in the background to replace retired ones


class SandboxPool:
    def __init__(
        self,
        backend: Backend | None = None,
        *,
        min_warm: int = 0,
        max_size: int = 16,
        max_uses: int = 100,
        create_per_s: float = 20.0,
        max_concurrent_creates: int = 4,
        default_spec: SandboxSpec | None = None,
        refill: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend or select_backend()
        self.min_warm = min_warm
        self.max_size = max_size
        self.max_uses = max_uses
        self.create_interval = 1.0 / create_per_s if create_per_s > 0 else 0.0
        self.default_spec = default_spec or SandboxSpec()
        self.refill = refill
        self.clock = clock
        self.stats = PoolStats()
        self._max_concurrent_creates = max_concurrent_creates
        self._create_gate: asyncio.Semaphore | None = None
        self._next_create = 0.0
        self._idle: dict[str, deque[Sandbox]] = defaultdict(deque)
        self._alive: dict[str, int] = defaultdict(int)
        self._uses: dict[str, int] = defaultdict(int)
        self._born: dict[str, float] = {}  # sandbox id -> its creation time on ``clock``
        self._leases: dict[str, Lease] = {}
        self._leased: dict[str, int] = defaultdict(int)  # leases out now, per spec key
        self._peak: dict[str, int] = defaultdict(int)  # the most leases out at once, per spec key
        self._refills: dict[str, deque[asyncio.Future]] = defaultdict(deque)  # background creates nobody claimed
        self._background: set[asyncio.Task] = set()
        self._slot_freed: dict[str, asyncio.Condition] = {}
        self._closed = False
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        _open_pools.add(self)

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Reap orphans of dead processes, then warm ``min_warm`` sandboxes of the default spec."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self.stats.reaped += await asyncio.to_thread(self.backend.reap)
        if self.min_warm:
            await self.prewarm(self.default_spec, self.min_warm)

    async def prewarm(self, spec: SandboxSpec, count: int) -> None:
        key = spec.key()
        want = min(count, self.max_size) - len(self._idle[key])
        boxes = await asyncio.gather(*(self._create(spec) for _ in range(max(want, 0))))
        self._idle[key].extend(boxes)

    async def close(self) -> None:
        """Destroy every sandbox, idle or leased. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._background):
            if task.get_name().startswith("relax-gym-refill"):  # destroys in flight are left to finish
                task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        boxes = [b for q in self._idle.values() for b in q] + [lease.sandbox for lease in self._leases.values()]
        for lease in self._leases.values():
            lease.expired = True
            if lease._timer:
                lease._timer.cancel()
        self._idle.clear()
        self._leases.clear()
        await asyncio.gather(*(self._destroy(b) for b in boxes), return_exceptions=True)
        _open_pools.discard(self)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- leasing ------------------------------------------------------------------------------------------

    async def acquire(self, spec: SandboxSpec | None = None, deadline: float | None = None) -> Lease:
        """A clean sandbox for ``spec``; waits for a slot up to ``deadline`` (a value of the pool's ``clock``)."""
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        await self.start()
        spec = spec or self.default_spec
        key = spec.key()
        cond = self._slot_freed.setdefault(key, asyncio.Condition())
        while True:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            idle = self._idle[key]
            while idle:
                box = idle.popleft()
                if box.closed or self._age_s(box) > spec.lifetime_s:
                    self._in_background(self._destroy_and_notify(box, key))
                    continue
                self.stats.reused += 1
                return self._lease(box, deadline, key)
            if self._refills[key]:  # a replacement is being made: take it rather than start another create
                box = await self._claim(self._refills[key].popleft(), deadline)
                if box is not None:
                    return self._lease(box, deadline, key)
                continue
            if self._alive[key] < self.max_size:
                self._alive[key] += 1  # reserve the slot before awaiting the create
                try:
                    box = await self._with_deadline(self._create(spec, reserved=True), deadline, "creating a sandbox")
                except BaseException:
                    self._alive[key] -= 1
                    await self._notify(key)
                    raise
                return self._lease(box, deadline, key)
            async with cond:
                await self._with_deadline(cond.wait(), deadline, f"waiting for one of {self.max_size} busy sandboxes")

    async def release(self, lease: Lease) -> None:
        """Give the sandbox back: reset and keep it warm, or destroy it (expired, too old, too used, reset failed)."""
        if self._leases.pop(lease.id, None) is None:
            return  # already released or revoked
        if lease._timer:
            lease._timer.cancel()
        box, key = lease.sandbox, lease.spec_key
        self._leased[key] -= 1
        self._uses[box.id] += 1
        keep = not self._closed and not lease.expired and not box.closed
        keep = keep and self._age_s(box) < box.spec.lifetime_s and self._uses[box.id] < self.max_uses
        if keep:
            try:
                await box.reset()
            except Exception as exc:  # a sandbox that cannot be cleaned is never handed out again
                log.warning("sandbox %s failed to reset (%r); destroying it", box.id, exc)
                keep = False
        if keep:
            self._idle[key].append(box)
        else:
            await self._destroy(box)
            self._refill(box.spec)
        await self._notify(key)

    def lease(self, spec: SandboxSpec | None = None, deadline: float | None = None) -> _LeaseContext:
        """``async with pool.lease(spec, deadline) as lease: await lease.exec(...)``."""
        return _LeaseContext(self, spec, deadline)

    def live_count(self) -> int:
        return sum(self._alive.values())

    # -- internals ----------------------------------------------------------------------------------------

    def _lease(self, box: Sandbox, deadline: float | None, key: str) -> Lease:
        lease = Lease(sandbox=box, deadline=deadline, spec_key=key, _clock=self.clock)
        self._leases[box.id] = lease
        self._leased[key] += 1
        self._peak[key] = max(self._peak[key], self._leased[key])
        if deadline is not None:
            loop = asyncio.get_running_loop()
            lease._timer = loop.call_at(loop.time() + max(deadline - self.clock(), 0.0), self._expire, lease)
        return lease

    def _age_s(self, box: Sandbox) -> float:
        born = self._born.get(box.id)
        return box.age_s if born is None else self.clock() - born

    def _expire(self, lease: Lease) -> None:
        if self._leases.get(lease.id) is not lease:
            return
        lease.expired = True
        self.stats.expired += 1
        log.warning("sandbox lease %s passed its deadline; destroying the sandbox", lease.id)
        self._leases.pop(lease.id, None)
        self._leased[lease.spec_key] -= 1
        self._in_background(self._destroy_and_notify(lease.sandbox, lease.spec_key, refill=True))  # close() waits

    async def _destroy_and_notify(self, box: Sandbox, key: str, *, refill: bool = False) -> None:
        try:
            await self._destroy(box)
        finally:
            if refill:
                self._refill(box.spec)
            await self._notify(key)

    # -- background refill --------------------------------------------------------------------------------

    def _in_background(self, coro, name: str = "relax-gym-pool") -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _refill(self, spec: SandboxSpec) -> None:
        """Replace a retired sandbox in the background while this spec's demand (its lease peak) is unmet."""
        key = spec.key()
        want = min(self.max_size, max(self._peak[key], self.min_warm if key == self.default_spec.key() else 0))
        if not self.refill or self._closed or self._alive[key] >= want:
            return
        fut = asyncio.get_running_loop().create_future()
        self._refills[key].append(fut)
        self._in_background(self._make_refill(spec, fut), "relax-gym-refill")

    async def _make_refill(self, spec: SandboxSpec, fut: asyncio.Future) -> None:
        key = spec.key()
        unclaimed = self._refills[key]
        try:
            box = await self._create(spec)
        except BaseException as exc:
            if fut in unclaimed:
                unclaimed.remove(fut)
            if not fut.done():  # a claimant falls back to its own create
                fut.set_exception(exc if isinstance(exc, SandboxError) else SandboxError(f"background create: {exc!r}"))
                fut.exception()  # marked retrieved
            await self._notify(key)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.warning("background sandbox create failed: %r", exc)
            return
        self.stats.refilled += 1
        claimed = fut not in unclaimed
        if not claimed:
            unclaimed.remove(fut)
        if self._closed:
            await self._destroy(box)
        elif claimed and not fut.done():  # hand it to the episode waiting for it
            fut.set_result(box)
        else:  # nobody claimed it, or its claimant gave up
            self._idle[key].append(box)
        await self._notify(key)

    async def _claim(self, fut: asyncio.Future, deadline: float | None) -> Sandbox | None:
        """Wait for a background create; None when it failed (the caller then creates its own)."""
        try:
            return await self._with_deadline(fut, deadline, "waiting for a sandbox being made")
        except PoolTimeout:
            raise
        except SandboxError:
            return None

    async def _create(self, spec: SandboxSpec, *, reserved: bool = False) -> Sandbox:
        if self._create_gate is None:
            self._create_gate = asyncio.Semaphore(self._max_concurrent_creates)
        if not reserved:
            self._alive[spec.key()] += 1
        try:
            async with self._create_gate:
                now = self.clock()
                wait = self._next_create - now
                self._next_create = max(now, self._next_create) + self.create_interval
                if wait > 0:
                    await asyncio.sleep(wait)
                box = await self.backend.create(spec)
        except BaseException:
            if not reserved:
                self._alive[spec.key()] -= 1
            raise
        self.stats.created += 1
        self._born[box.id] = self.clock()
        return box

    async def _destroy(self, box: Sandbox) -> None:
        key = box.spec.key()
        try:
            await box.close()
        finally:
            if self._alive[key] > 0:
                self._alive[key] -= 1
            self._uses.pop(box.id, None)
            self._born.pop(box.id, None)
            self.stats.destroyed += 1

    async def _notify(self, key: str) -> None:
        cond = self._slot_freed.get(key)
        if cond is not None:
            async with cond:
                cond.notify_all()

    async def _with_deadline(self, aw, deadline: float | None, what: str):
        if deadline is None:
            return await aw
        left = deadline - self.clock()
        try:
            return await asyncio.wait_for(aw, timeout=max(left, 0.0))
        except TimeoutError:
            raise PoolTimeout(f"deadline passed while {what}") from None


class _LeaseContext:
    def __init__(self, pool: SandboxPool, spec: SandboxSpec | None, deadline: float | None) -> None:
        self.pool, self.spec, self.deadline = pool, spec, deadline
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        self._lease = await self.pool.acquire(self.spec, self.deadline)
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        if self._lease is not None:
            await asyncio.shield(self.pool.release(self._lease))


_open_pools: weakref.WeakSet[SandboxPool] = weakref.WeakSet()


def _close_forgotten_pools() -> None:
    """Exit backstop for pools on the shared sync loop (the backends' own atexit hooks cover the rest)."""
    for pool in list(_open_pools):
        if pool._loop is None or pool._loop is not sync.loop() or not pool._loop.is_running():
            continue
        try:
            sync.run(pool.close(), timeout=30)
        except Exception as exc:  # best effort at exit
            log.warning("could not close a sandbox pool at exit: %r", exc)


before_thread_pools_stop(_close_forgotten_pools)  # atexit is too late: see exit_order
