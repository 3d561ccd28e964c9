"""The virtual-time loop: asyncio code runs unchanged, the clock jumps to the next timer, real time is refused."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from relax_gym.trainer.plan.clock import (
    VirtualDeadlock,
    VirtualTimeError,
    VirtualTimeLoop,
    run_virtual,
)


def test_sleep_jumps_the_clock_without_waiting():
    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop) and loop.time() == 0.0
        await asyncio.sleep(3600.0)
        return loop.time()

    wall = time.perf_counter()
    assert run_virtual(main()) == 3600.0
    assert time.perf_counter() - wall < 1.0


def test_timers_fire_in_time_order_the_same_way_every_run():
    def once() -> list[tuple[str, float]]:
        order: list[tuple[str, float]] = []

        async def main():
            loop = asyncio.get_running_loop()
            for name, delay in (("c", 2.0), ("a", 1.0), ("b", 1.0), ("d", 0.5)):
                loop.call_later(delay, lambda n=name: order.append((n, loop.time())))

            async def worker(name: str, delay: float) -> None:
                await asyncio.sleep(delay)
                order.append((name, loop.time()))

            await asyncio.gather(worker("w2", 1.5), worker("w1", 0.25))

        run_virtual(main())
        return order

    order = once()
    assert [t for _, t in order] == [0.25, 0.5, 1.0, 1.0, 1.5]  # "c" never ran: main ended first
    assert {n for n, t in order if t == 1.0} == {"a", "b"}  # asyncio orders ties by its heap: fixed, not FIFO
    assert all(once() == order for _ in range(3))


def test_wait_for_conditions_and_events_use_virtual_time():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), timeout=30.0)
        assert loop.time() == 130.0
        cond = asyncio.Condition()

        async def notify_later() -> None:
            await asyncio.sleep(5.0)
            async with cond:
                cond.notify_all()

        task = asyncio.ensure_future(notify_later())
        async with cond:
            await cond.wait()
        await task
        return loop.time()

    assert run_virtual(main(), start=100.0) == 135.0


def test_threads_sockets_and_subprocesses_are_refused():
    async def thread():
        await asyncio.to_thread(sum, [1, 2])

    async def sock():
        await asyncio.open_connection("127.0.0.1", 9)

    async def proc():
        await asyncio.create_subprocess_exec("true")

    async def reader():
        a, b = socket.socketpair()
        try:
            asyncio.get_running_loop().add_reader(a.fileno(), lambda: None)
        finally:
            a.close()
            b.close()

    with pytest.raises(VirtualTimeError, match="run_in_executor\\(sum\\)"):
        run_virtual(thread())
    for coro, what in ((sock(), "create_connection"), (proc(), "subprocess_exec"), (reader(), "add_reader")):
        with pytest.raises(VirtualTimeError, match=what):
            run_virtual(coro)


def test_a_wait_nothing_can_end_is_a_deadlock_not_a_hang():
    async def main():
        await asyncio.sleep(2.0)
        await asyncio.Event().wait()

    with pytest.raises(VirtualDeadlock, match="t=2.000000s"):
        run_virtual(main())
