"""Straggler carry: a step trains on the first groups that finish; a straggler joins a later step while within S,
and is discarded (never put, counted) past it. Groups end when the test says so (events, no timing)."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from relax_gym.trainer.async_engine.carry import CarryFeeder, CarrySlots, claim_slot
from relax_gym.trainer.async_engine.staleness import StalenessGate


def test_slots_fill_partitions_in_order_of_finishing():
    slots = CarrySlots(2, 1)
    assert [slots.claim(k, 0) for k in ("a", "b", "c", "d")] == [0, 0, 1, 1]
    assert slots.filling() == 2
    assert slots.claim("e", 0) is None  # partition 2 is 2 steps after its launch: too stale for S = 1
    assert slots.claim("f", 1) == 2  # launched after one step was trained: fresh enough
    assert slots.claim("a", 5) == 0 and slots.claim("e", 5) is None  # a re-sent group gets its first answer


def test_slots_refuse_partitions_the_run_will_not_train():
    slots = CarrySlots(1, 3, first=4, end=6)
    assert [slots.claim(k, 4) for k in "xyz"] == [4, 5, None]


@pytest.mark.parametrize("args", [(0, 1), (2, -1)])
def test_slots_validate(args):
    with pytest.raises(ValueError, match="groups_per_step"):
        CarrySlots(*args)


def test_claim_slot_takes_an_object_or_an_actor_handle():
    class Handle:  # what a Ray actor handle looks like: claim.remote(...) is awaitable
        class claim:  # noqa: N801
            @staticmethod
            async def remote(key, born):
                return ("remote", key, born)

    assert asyncio.run(claim_slot(CarrySlots(1, 0), "k", 0)) == 0
    assert asyncio.run(claim_slot(Handle(), "k", 3)) == ("remote", "k", 3)


async def _settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def test_feeder_trains_first_finishers_carries_and_discards_stragglers():
    P, G, S, STEPS = 2, 2, 1, 4

    async def main():
        gate = StalenessGate(S)
        slots = CarrySlots(P, S, end=STEPS)
        release: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        launched: list[tuple[int, int]] = []
        seals: list[int] = []
        peak = 0
        placed: dict[str, int] = {}
        discarded: list[str] = []

        async def run_group(i, born):
            nonlocal peak
            launched.append((i, born))
            peak = max(peak, len(feeder.running))
            await release[i].wait()
            j = slots.claim(f"g{i}", born)
            return [{"sample_id": f"g{i}-{m}", "partition": j} for m in range(G)]

        async def seal(j):
            seals.append(j)

        async def end(*groups):
            for i in groups:
                release[i].set()
                await _settle()

        def ids(roll):
            return sorted({e["sample_id"][:-2] for e in roll["episodes"]})

        feeder = CarryFeeder(gate, groups_per_step=P, max_in_flight=(S + 1) * P, first=0, end=STEPS, cursor=0,
                             run_group=run_group, seal=seal, placed=placed, discarded=discarded)
        runner = asyncio.ensure_future(feeder.run())
        await _settle()
        assert launched == [(i, 0) for i in range(4)]  # (S + 1) x P groups, all before any training

        await end(1, 2, 3)  # group 0 straggles: 1 and 2 make step 0, 3 starts step 1; each end launches one more
        assert ids(await feeder.rollout(0)) == ["g1", "g2"] and seals == [0] and feeder.filling() == 1
        assert launched == [(i, 0) for i in range(7)]
        await gate.advance(1)  # step 0 trained
        feeder.poke()
        await _settle()
        assert len(launched) == 7  # four running already

        await end(4)
        assert ids(await feeder.rollout(1)) == ["g3", "g4"] and launched[7] == (7, 1)
        await end(0, 5, 6)  # born at 0, ending when partition 2 fills: 2 steps after launch, S = 1 -> discarded
        assert discarded == [f"g{i}-{m}" for i in (0, 5, 6) for m in range(G)] and "g0-0" not in placed
        assert launched[8:] == [(8, 1), (9, 1), (10, 1)]
        await end(7, 8)
        assert ids(await feeder.rollout(2)) == ["g7", "g8"] and launched[11] == (11, 1)
        assert len(launched) == 12  # partition 3 is 2 ahead of the 1 step trained: the gate holds new launches
        await gate.advance(2)
        feeder.poke()
        await _settle()
        assert launched[12:] == [(12, 2)]
        await end(9, 10, 11)  # born at 1: too stale for partition 3
        assert launched[13:] == [(13, 2), (14, 2), (15, 2)]
        await end(12, 13)
        assert ids(await feeder.rollout(3)) == ["g12", "g13"]
        await asyncio.wait_for(runner, 1)  # every partition of the run has its groups: no more launches
        assert seals == [0, 1, 2, 3] and peak <= (S + 1) * P and len(launched) == 17
        assert [sid for sid in discarded if sid.endswith("-0")] == [f"g{i}-0" for i in (0, 5, 6, 9, 10, 11)]
        born = dict(launched)
        assert all(j - born[int(sid[1:].split("-")[0])] <= S for sid, j in placed.items())  # the bound, per sample
        await feeder.stop()
        assert not feeder.running

    asyncio.run(main())
