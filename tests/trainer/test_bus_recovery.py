"""What level-1 recovery needs from the data bus, without Ray: a dead consumer's leases given back for one partition
only, a streaming role's call replaced mid-partition without losing or repeating a row, a retried producer."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.databus import DuplicateRowError, make_bus
from relax_gym.trainer.databus.ledger import DeliveryLedger


def rows(step: int, groups: int, size: int, reward=lambda g, m: float(m)) -> list[dict]:
    return [{"sample_id": f"s{step}-g{g}-{m}", "group_id": g, "reward": reward(g, m), "trainable": True}
            for g in range(groups) for m in range(size)]


def test_release_by_partition_frees_only_that_partitions_leases():
    async def body():
        bus = make_bus("inprocess")
        for k in (0, 1):
            await bus.put(k, rows(k, 2, 2))
        a0 = await bus.fetch(0, "advantages", ["reward"], 2, timeout=1)
        a1 = await bus.fetch(1, "advantages", ["reward"], 2, timeout=1)
        r0 = await bus.fetch(0, "reference", ["reward"], 2, timeout=1)
        assert await bus.release_task("advantages", 0) == 2  # only the dead call's rows on partition 0
        await bus.ack(a1)  # the live call on partition 1 keeps its lease
        await bus.ack(r0)  # and so does another role on partition 0
        again = await bus.fetch(0, "advantages", ["reward"], 2, timeout=1)
        assert again.sample_ids == a0.sample_ids
        assert await bus.release_task("advantages") == 2  # all partitions, as before
        await bus.close()

    asyncio.run(body())


def test_a_retried_put_is_told_its_rows_are_there_and_an_unwritten_one_goes_through():
    async def body():
        bus = make_bus("inprocess")
        await bus.put(0, rows(0, 1, 2))
        with pytest.raises(DuplicateRowError, match="already put"):
            await bus.put(0, rows(0, 1, 2))
        await bus.close()

    asyncio.run(body())
    ledger = DeliveryLedger()
    ledger.register(0, ["a", "b"], [0, 0])  # a TransferQueue producer died between registering and writing
    with pytest.raises(DuplicateRowError):
        ledger.register(0, ["a", "b"], [0, 0])
    ledger.register(0, ["a", "b"], [0, 0], replace_unbound=True)  # its retry replaces the unwritten rows
    ledger.bind(0, ["a", "b"], [10, 11])
    with pytest.raises(DuplicateRowError):  # written rows are never replaced
        ledger.register(0, ["a", "b"], [0, 0], replace_unbound=True)


def test_a_streaming_call_replaced_mid_partition_processes_every_row_once():
    """The advantages call dies holding a lease (cancelled here, as a dead replica's call ends); the controller gives
    its leases on the partition back and sends the call again: every group gets its advantages, none twice."""

    async def body():
        bus = make_bus("inprocess")
        await bus.open_partition(0, expected_rows=8, group_size=2)
        writes: list[str] = []
        original = bus.put_fields

        async def counting_put_fields(partition, sample_ids, fields):
            writes.extend(sample_ids)
            await original(partition, sample_ids, fields)

        bus.put_fields = counting_put_fields
        algo = AlgorithmConfig().model_dump()
        first = AdvantagesRole(algo, bus)
        await bus.put(0, rows(0, 4, 2, reward=lambda g, m: float(g + m)))
        await bus.seal(0, 8)
        held = await bus.fetch(0, "advantages", ["group_id", "reward", "trainable"], 2, whole_groups=True, timeout=1)
        done_before = await first.process(0, 4, 2)  # a first call that finishes two (other) groups...
        assert done_before["rows"] == 4
        # ... and a call that died holding one group (the lease ``held``): the controller releases it
        assert await bus.release_task("advantages", 0) == 2
        second = AdvantagesRole(algo, bus)
        done_after = await second.process(0, 8, 2)  # the re-sent call: stops once the sealed partition is exhausted
        assert done_after["rows"] == 4  # the released group and the one nobody had taken
        assert sorted(writes) == sorted(r["sample_id"] for r in rows(0, 4, 2)) and len(writes) == 8
        assert held.sample_ids[0] in writes
        actor = await bus.fetch(0, "actor", ["advantages"], 8, timeout=1)
        assert len(actor.sample_ids) == 8  # every row has its advantage
        await bus.close()

    asyncio.run(body())
