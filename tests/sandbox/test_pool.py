"""SandboxPool: leasing, deadlines, reuse without shared state, rate limits, 32 episodes at once.

The logic is tested on an in-process twin backend, on a virtual clock: the pool is handed the virtual loop's
clock, so deadlines, lifetimes, create spacing and slow creates happen in simulated time, in the same order on
every run, whatever the machine's load; timings are asserted exactly on that clock. One scenario then runs on the
real backends (docker, bwrap) in test_pool_on_real_backend, on the real clock.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from relax_gym.sandbox.base import Backend, ExecResult, Sandbox, SandboxError, new_sandbox_id
from relax_gym.sandbox.pool import LeaseExpired, PoolTimeout, SandboxPool
from relax_gym.sandbox.spec import SandboxSpec

from ..waiting import loop_clock, run_on_virtual_clock
from .conftest import run


class TwinSandbox(Sandbox):
    backend = "twin"

    def __init__(self, spec, owner):
        super().__init__(spec, new_sandbox_id("twin"))
        self.files: dict[str, bytes] = {}
        self.owner = owner
        self.fail_reset = False

    async def _exec(self, cmd, timeout, stdin):
        if cmd.startswith("sleep "):
            try:
                await asyncio.wait_for(asyncio.sleep(float(cmd.split()[1])), timeout)
            except TimeoutError:
                return ExecResult(rc=137, stdout="", stderr="", timed_out=True, duration=timeout)
        return ExecResult(rc=0, stdout=" ".join(sorted(self.files)), stderr="")

    async def _write_file(self, path, data, mode):
        self.files[path] = data

    async def _read_file(self, path, max_bytes):
        if path not in self.files:
            raise SandboxError(f"{path}: no such file")
        return self.files[path]

    async def _reset(self):
        if self.fail_reset:
            raise SandboxError("reset failed")
        self.files.clear()

    async def _close(self):
        self.owner.alive.discard(self.id)


class TwinBackend(Backend):
    name = "twin"

    def __init__(self, create_s: float = 0.0):
        self.alive: set[str] = set()
        self.created = 0
        self.create_s = create_s
        self.create_times: list[float] = []
        self.concurrent = 0
        self.max_concurrent = 0

    def check(self):
        return None

    async def create(self, spec):
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        self.create_times.append(loop_clock())
        try:
            await asyncio.sleep(self.create_s)
        finally:
            self.concurrent -= 1
        box = TwinSandbox(spec, self)
        self.alive.add(box.id)
        self.created += 1
        return box

    def reap(self, *, all_owners=False):
        return 0

    def live(self):
        return sorted(self.alive)

    def every(self):
        return sorted(self.alive)


def test_release_resets_and_reuses_without_shared_state():
    async def body():
        backend = TwinBackend()
        async with SandboxPool(backend, clock=loop_clock, max_size=2) as pool:
            async with pool.lease() as lease:
                await lease.write_file("secret.txt", "x")
                first = lease.id
            async with pool.lease() as lease:
                assert lease.id == first  # reused warm...
                assert (await lease.exec("ls")).stdout == ""  # ...and clean
            assert pool.stats.reused == 1 and backend.created == 1
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_prewarm_and_reap_at_start():
    async def body():
        backend = TwinBackend(create_s=1.0)
        pool = SandboxPool(backend, clock=loop_clock, min_warm=3)
        await pool.start()
        assert backend.created == 3 and pool.live_count() == 3 and loop_clock() >= 1.0
        t0 = loop_clock()
        lease = await pool.acquire()
        assert loop_clock() == t0 and backend.created == 3  # taken warm: no create (1 s) on the episode's path
        await pool.release(lease)
        await pool.close()
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_waits_for_a_slot_and_times_out_at_the_deadline():
    async def body():
        backend = TwinBackend()
        async with SandboxPool(backend, clock=loop_clock, max_size=1) as pool:
            held = await pool.acquire()
            t0 = loop_clock()
            with pytest.raises(PoolTimeout, match="waiting for one of 1 busy sandboxes"):
                await pool.acquire(deadline=t0 + 0.2)
            assert loop_clock() == pytest.approx(t0 + 0.2)  # gave up at the deadline, not before or after
            waiter = asyncio.ensure_future(pool.acquire(deadline=loop_clock() + 5))
            await asyncio.sleep(0.05)
            assert not waiter.done()
            await pool.release(held)
            lease = await waiter
            assert lease.id == held.id
            await pool.release(lease)

    run_on_virtual_clock(body())


def test_expired_lease_destroys_its_sandbox_and_frees_the_slot():
    async def body():
        backend = TwinBackend()
        async with SandboxPool(backend, clock=loop_clock, max_size=1) as pool:
            lease = await pool.acquire(deadline=loop_clock() + 0.2)
            result = await lease.exec("sleep 5")  # capped by the lease deadline
            assert result.timed_out and result.duration == pytest.approx(0.2)
            await _settle(pool)  # the revoked sandbox's destroy
            assert lease.expired and lease.id not in backend.alive and pool.stats.expired == 1
            with pytest.raises(LeaseExpired):
                await lease.exec("ls")
            await pool.release(lease)  # releasing a revoked lease is harmless
            fresh = await pool.acquire(deadline=loop_clock() + 1)
            assert fresh.id != lease.id
            await pool.release(fresh)

    run_on_virtual_clock(body())


def test_failed_reset_destroys_instead_of_reusing():
    async def body():
        backend = TwinBackend()
        async with SandboxPool(backend, clock=loop_clock) as pool:
            lease = await pool.acquire()
            lease.sandbox.fail_reset = True
            await pool.release(lease)
            assert lease.id not in backend.alive
            assert (await pool.acquire()).id != lease.id

    run_on_virtual_clock(body())


def test_max_uses_and_lifetime_retire_sandboxes():
    async def body():
        backend = TwinBackend()
        async with SandboxPool(backend, clock=loop_clock, max_uses=2) as pool:
            ids = []
            for _ in range(3):
                lease = await pool.acquire()
                ids.append(lease.id)
                await pool.release(lease)
            assert ids[0] == ids[1] != ids[2]
            spec = SandboxSpec(lifetime_s=0.05)
            lease = await pool.acquire(spec)
            await asyncio.sleep(0.1)
            await pool.release(lease)
            assert lease.id not in backend.alive

    run_on_virtual_clock(body())


def test_32_episodes_at_once_queue_under_rate_limits():
    async def body():
        backend = TwinBackend(create_s=0.02)
        async with SandboxPool(backend, clock=loop_clock, max_size=8, create_per_s=100, max_concurrent_creates=3) as pool:
            async def episode(i):
                async with pool.lease(deadline=loop_clock() + 20) as lease:
                    await lease.write_file(f"ep{i}", "x")
                    out = (await lease.exec("ls")).stdout
                    assert out == f"{lease.sandbox.spec.workdir}/ep{i}"  # alone in its sandbox
                    await asyncio.sleep(0.01)
                return lease.id

            ids = await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(32))), 30)
        assert len(ids) == 32 and backend.created <= 8 and backend.max_concurrent <= 3
        gaps = [b - a for a, b in zip(backend.create_times, backend.create_times[1:])]
        assert min(gaps) >= 0.01 - 1e-9  # create_per_s=100 spaces creates 10 ms apart
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_closed_pool_refuses_and_close_is_idempotent():
    async def body():
        backend = TwinBackend()
        pool = SandboxPool(backend, clock=loop_clock)
        lease = await pool.acquire()
        await pool.close()
        await pool.close()
        assert lease.expired and backend.alive == set()
        with pytest.raises(SandboxError, match="closed"):
            await pool.acquire()

    run_on_virtual_clock(body())


@pytest.mark.timeout(240)
def test_pool_on_real_backend(backend):
    """16 concurrent episodes on the real backend with 4 sandboxes: no hang, clean hand-overs, nothing left."""

    async def body():
        async with SandboxPool(backend, max_size=4, create_per_s=10) as pool:
            async def episode(i):
                async with pool.lease(deadline=time.monotonic() + 120) as lease:
                    before = (await lease.exec("ls -A . /tmp")).stdout
                    await lease.exec(f"echo {i} > mine; echo {i} > /tmp/mine")
                    return before

            seen = await asyncio.gather(*(episode(i) for i in range(16)))
            assert all("mine" not in s for s in seen), seen
            assert pool.stats.created <= 4 and pool.stats.reused >= 12
        assert not [i for i in backend.live()]

    run(body())


# ---------------------------------------------------------------------------------------------- background refill


async def _settle(pool: SandboxPool) -> None:
    """Wait for the pool's background work (refills, destroys) to finish."""
    while pool._background:
        await asyncio.gather(*list(pool._background), return_exceptions=True)


def test_retired_sandbox_is_replaced_in_the_background():
    async def body():
        backend = TwinBackend(create_s=0.2)
        async with SandboxPool(backend, clock=loop_clock, max_uses=1) as pool:
            lease = await pool.acquire()
            await pool.release(lease)  # used up: destroyed, and a replacement is started
            assert lease.id not in backend.alive
            await _settle(pool)
            assert pool.stats.refilled == 1 and pool.live_count() == 1
            t0 = loop_clock()
            fresh = await pool.acquire()
            assert loop_clock() == t0 and fresh.id != lease.id  # no create (0.2 s) on the episode's path
            await pool.release(fresh)
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_an_episode_takes_the_replacement_being_made_instead_of_its_own():
    async def body():
        backend = TwinBackend(create_s=0.3)
        async with SandboxPool(backend, clock=loop_clock, max_uses=1) as pool:
            lease = await pool.acquire()
            await pool.release(lease)
            await asyncio.sleep(0.15)  # the replacement is half made
            t0 = loop_clock()
            fresh = await pool.acquire()
            assert loop_clock() - t0 == pytest.approx(0.15)  # waited for the rest of that create only
            assert backend.created == 2 and pool.stats.refilled == 1
            await pool.release(fresh)
            await _settle(pool)
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_refill_is_sized_to_the_peak_of_leases_in_flight():
    async def body():
        backend = TwinBackend(create_s=0.01)
        async with SandboxPool(backend, clock=loop_clock, max_size=8, max_uses=1) as pool:
            leases = [await pool.acquire() for _ in range(3)]
            for lease in leases:
                await pool.release(lease)
            await _settle(pool)
            assert pool.live_count() == 3 and len(pool._idle[pool.default_spec.key()]) == 3  # not 8
            leases = await asyncio.gather(*(pool.acquire() for _ in range(3)))
            assert backend.created == 6  # all three taken warm
            for lease in leases:
                await pool.release(lease)
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_failed_background_create_falls_back_to_the_episodes_own():
    async def body():
        backend = TwinBackend(create_s=0.05)
        async with SandboxPool(backend, clock=loop_clock, max_uses=1) as pool:
            lease = await pool.acquire()
            real_create = backend.create
            calls = []

            async def flaky(spec):
                calls.append(1)
                if len(calls) == 1:
                    await asyncio.sleep(0.05)
                    raise SandboxError("engine hiccup")
                return await real_create(spec)

            backend.create = flaky
            await pool.release(lease)  # the replacement's create will fail
            fresh = await pool.acquire(deadline=loop_clock() + 5)
            assert fresh.id != lease.id and len(calls) == 2
            await pool.release(fresh)
            await _settle(pool)
        assert backend.alive == set()

    run_on_virtual_clock(body())


def test_close_during_refill_leaves_nothing():
    async def body():
        backend = TwinBackend(create_s=0.3)
        pool = SandboxPool(backend, clock=loop_clock, max_uses=1)
        lease = await pool.acquire()
        await pool.release(lease)
        await asyncio.sleep(0.05)
        assert pool._background  # the replacement is being made
        await pool.close()
        await asyncio.sleep(0.35)
        assert backend.alive == set() and pool.live_count() == 0

    run_on_virtual_clock(body())


def test_stale_idle_sandbox_is_destroyed_off_the_episodes_path():
    async def body():
        backend = TwinBackend()
        spec = SandboxSpec(lifetime_s=0.1)
        async with SandboxPool(backend, clock=loop_clock) as pool:
            lease = await pool.acquire(spec)
            await pool.release(lease)  # young enough to keep
            await asyncio.sleep(0.15)
            fresh = await pool.acquire(spec)  # the idle one is stale: dropped in the background
            assert fresh.id != lease.id
            await _settle(pool)
            assert lease.id not in backend.alive
            await pool.release(fresh)
        assert backend.alive == set()

    run_on_virtual_clock(body())
