"""The staleness gate: a rollout for step k starts only while k - trained <= S."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.async_engine.staleness import StalenessGate, staleness, staleness_stats


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("s", [0, 1, 2, 5])
def test_gate_lets_exactly_s_plus_one_steps_ahead(s):
    gate = StalenessGate(s)
    assert [k for k in range(10) if gate.may_start(k)] == list(range(s + 1))


def test_wait_for_blocks_until_training_catches_up():
    async def main():
        gate = StalenessGate(1)
        started: list[int] = []

        async def launcher():
            for k in range(4):
                await gate.wait_for(k)
                started.append(k)

        task = asyncio.create_task(launcher())
        await asyncio.sleep(0.01)
        assert started == [0, 1]  # S = 1: step 1 may run while step 0 trains
        await gate.advance(1)
        await asyncio.sleep(0.01)
        assert started == [0, 1, 2]
        await gate.advance(3)
        await task
        assert started == [0, 1, 2, 3]

    run(main())


def test_s0_is_synchronous():
    async def main():
        gate = StalenessGate(0)
        await gate.wait_for(0)
        waiter = asyncio.create_task(gate.wait_for(1))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        await gate.advance(1)
        await asyncio.wait_for(waiter, 1)

    run(main())


def test_close_wakes_waiters_with_an_error_and_trained_never_goes_back():
    async def main():
        gate = StalenessGate(0)
        waiter = asyncio.create_task(gate.wait_for(3))
        await asyncio.sleep(0)
        await gate.close()
        with pytest.raises(RuntimeError, match="step 3"):
            await waiter
        await gate.advance(2)
        with pytest.raises(ValueError, match="cannot go back"):
            await gate.advance(1)

    run(main())
    with pytest.raises(ValueError):
        StalenessGate(-1)


def test_staleness_is_counted_from_the_oldest_turn():
    assert staleness(5, [5]) == 0
    assert staleness(5, [3, 4]) == 2  # a multi-turn episode spanning a weight update
    assert staleness(5, []) == 0
    assert staleness_stats([0, 2, 1]) == {"staleness_avg": 1.0, "staleness_max": 2}
    assert staleness_stats([]) == {"staleness_avg": 0.0, "staleness_max": 0}
