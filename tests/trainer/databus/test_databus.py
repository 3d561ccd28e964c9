"""One contract for both data buses: the in-process twin and the TransferQueue bus (integration: Ray + TQ).

The twin runs each scenario on a virtual clock (it is handed the loop's clock), so its lease lapses and fetch
timeouts happen in simulated time, in the same order on every run. The TransferQueue bus runs the same scenarios
on the real clock; there a check that something answers "at once" is made without a clock: the fetch is given no
timeout of its own, so only the awaited event can end it (a generous outer limit reports a hang).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from relax_gym.trainer.databus import (
    BusBatch,
    DataBus,
    DataBusError,
    DataBusInputError,
    DuplicateRowError,
    InProcessBus,
    LeaseError,
    TransferQueueBus,
    make_bus,
)

from ...waiting import loop_clock, run_on_virtual_clock

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tq_owner(ray_session):
    """TransferQueue + the ledger, started once for this file; each test gets its own bus scope on it."""
    owner = TransferQueueBus.start(scope="tests-owner")
    yield owner
    asyncio.run(owner.close())


HANG_S = 60.0  # the outer limit on a wait that should end by an event: reaching it means the event never came


@dataclass(frozen=True)
class BusKind:
    make: Callable[..., DataBus]  # a fresh, isolated bus (call it inside the test's event loop)
    virtual_clock: bool  # run on the virtual-time loop, the bus reading its clock


@pytest.fixture(params=["inprocess", pytest.param("transferqueue", marks=pytest.mark.integration)])
def new_bus(request) -> BusKind:
    if request.param == "inprocess":
        return BusKind(lambda **kw: InProcessBus(clock=loop_clock, **kw), virtual_clock=True)
    request.getfixturevalue("tq_owner")
    return BusKind(lambda **kw: TransferQueueBus(scope=f"t-{uuid.uuid4().hex[:8]}", **kw), virtual_clock=False)


def drive(new_bus: BusKind, body, **bus_kw):
    async def main():
        bus = new_bus.make(**bus_kw)
        try:
            await body(bus)
        finally:
            await bus.close()

    (run_on_virtual_clock if new_bus.virtual_clock else asyncio.run)(main())


def rows(prefix: str, n: int, start: int = 0, **extra):
    return [{"sample_id": f"{prefix}{i}", "input_ids": torch.arange(i + 1), "reward": float(i), **extra}
            for i in range(start, start + n)]


async def drain(bus, partition, task, fields, batch_size, **kw):
    """Fetch and ack until the partition is exhausted for the task; returns the batches."""
    out = []
    while (batch := await bus.fetch(partition, task, fields, batch_size, timeout=5, **kw)) is not None:
        await bus.ack(batch)
        out.append(batch)
    return out


def test_implements_the_protocol(new_bus):
    async def body(bus):
        assert isinstance(bus, DataBus)
        assert set(bus.stats()) >= {"puts", "fetches", "acks", "given_back", "rows", "fetch_wait_s"}

    drive(new_bus, body)


def test_row_waits_for_every_requested_field(new_bus):
    async def body(bus):
        await bus.put(0, rows("r", 3))
        assert await bus.fetch(0, "actor", ["input_ids", "ref_logprobs"], 1, timeout=0.2) is None
        await bus.put_fields(0, ["r2", "r0"], {"ref_logprobs": [torch.full((3,), -2.0), torch.full((1,), -0.5)]})
        batch = await bus.fetch(0, "actor", ["input_ids", "ref_logprobs"], 2, timeout=5)
        assert sorted(batch.sample_ids) == ["r0", "r2"]
        by_id = dict(zip(batch.sample_ids, batch.fields["ref_logprobs"], strict=True))
        assert torch.equal(by_id["r2"], torch.full((3,), -2.0)) and torch.equal(by_id["r0"], torch.full((1,), -0.5))
        assert await bus.fetch(0, "actor", ["input_ids", "ref_logprobs"], 1, timeout=0.2) is None  # r1 lacks it
        await bus.put_fields(0, ["r1"], {"ref_logprobs": [torch.zeros(2)]})
        last = await bus.fetch(0, "actor", ["input_ids", "ref_logprobs"], 1, timeout=5)
        assert last.sample_ids == ["r1"] and torch.equal(last.fields["input_ids"][0], torch.arange(2))
        # another task that only needs input_ids was never blocked
        assert len((await bus.fetch(0, "reference", ["input_ids"], 3, timeout=5)).sample_ids) == 3

    drive(new_bus, body)


def test_micro_batches_then_tail_after_seal(new_bus):
    async def body(bus):
        await bus.put(1, rows("m", 10))
        sizes = []
        for _ in range(2):
            batch = await bus.fetch(1, "actor", ["input_ids", "sample_id"], 4, timeout=5)
            assert batch.fields["sample_id"] == batch.sample_ids
            sizes.append(len(batch))
            await bus.ack(batch)
        assert sizes == [4, 4]
        assert await bus.fetch(1, "actor", ["input_ids"], 4, timeout=0.2) is None  # 2 left, not sealed: no tail
        await bus.seal(1, 10)
        tail = await bus.fetch(1, "actor", ["input_ids"], 4, timeout=5)
        assert tail.sample_ids == ["m8", "m9"]
        await bus.ack(tail)
        # no timeout of its own: only exhaustion can answer None
        assert await asyncio.wait_for(bus.fetch(1, "actor", ["input_ids"], 4), HANG_S) is None

    drive(new_bus, body)


def test_seal_releases_a_waiting_fetch_with_a_tail(new_bus):
    async def body(bus):
        await bus.open_partition(2, expected_rows=8)

        async def produce():
            await asyncio.sleep(0.2)
            await bus.put(2, rows("w", 3))
            await asyncio.sleep(0.2)
            await bus.seal(2, 3)  # fewer than expected: some episodes failed

        # no timeout of its own: only the seal can end the wait for 8 rows
        batch, _ = await asyncio.wait_for(asyncio.gather(bus.fetch(2, "actor", ["input_ids"], 8), produce()), HANG_S)
        assert batch is not None and batch.sample_ids == ["w0", "w1", "w2"]

    drive(new_bus, body)


def test_timeout_returns_none(new_bus):
    async def body(bus):
        t0 = loop_clock()
        fetch = bus.fetch(3, "actor", ["input_ids"], 2, timeout=0.3)
        assert await asyncio.wait_for(fetch, HANG_S) is None  # partition nobody opened
        assert loop_clock() - t0 >= 0.25  # waited its timeout out (on the twin's virtual clock: 0.3 exactly)
        await bus.put(3, rows("t", 1))
        assert await bus.fetch(3, "actor", ["input_ids"], 2, timeout=0) is None
        assert bus.stats()["fetch_wait_s"] >= 0.25

    drive(new_bus, body)


def test_whole_groups(new_bus):
    async def body(bus):
        await bus.open_partition(4, group_size=3)
        order = [("a", 0), ("b", 1), ("a", 2), ("c", 3), ("b", 4), ("a", 5), ("c", 6), ("b", 7)]  # c is short
        await bus.put(4, [{"sample_id": f"g{i}", "group_id": g, "x": torch.tensor([i])} for g, i in order])
        with pytest.raises(DataBusInputError, match="partition 4: batch_size 2 is smaller than one group"):
            await bus.fetch(4, "actor", ["x"], 2, whole_groups=True)
        batch = await bus.fetch(4, "actor", ["x", "group_id"], 7, whole_groups=True, timeout=5)
        assert batch.fields["group_id"] == ["a", "a", "a", "b", "b", "b"]  # two whole groups, group by group
        assert await bus.fetch(4, "actor", ["x"], 3, whole_groups=True, timeout=0.2) is None  # c has 2 of 3
        await bus.put(4, [{"sample_id": "g8", "group_id": "d", "x": torch.tensor([8])}])
        await bus.seal(4, 9)  # c and d stay short: delivered as they are once nothing else can come
        last = await bus.fetch(4, "actor", ["x", "group_id"], 6, whole_groups=True, timeout=5)
        assert last.fields["group_id"] == ["c", "c", "d"]
        with pytest.raises(DataBusInputError, match="partition 5: .*no group_size"):
            await bus.put(5, rows("n", 2))
            await bus.fetch(5, "actor", ["input_ids"], 4, whole_groups=True, timeout=1)

    drive(new_bus, body)


def test_ack_give_back_release_deliver_every_row_once(new_bus):
    async def body(bus):
        await bus.put(6, rows("k", 12))
        b1 = await bus.fetch(6, "actor", ["input_ids"], 4, timeout=5)
        b2 = await bus.fetch(6, "actor", ["input_ids"], 4, timeout=5)
        assert not set(b1.sample_ids) & set(b2.sample_ids)
        await bus.give_back(b1)
        with pytest.raises(LeaseError, match="given back"):
            await bus.ack(b1)
        assert await bus.release_task("actor") == 4  # b2's consumer died
        with pytest.raises(LeaseError):
            await bus.ack(b2)
        assert await bus.release_task("actor") == 0
        await bus.seal(6, 12)
        b3 = await bus.fetch(6, "actor", ["input_ids"], 5, timeout=5)
        await bus.ack(b3)
        with pytest.raises(LeaseError, match="already acked"):
            await bus.ack(b3)
        with pytest.raises(LeaseError):
            await bus.give_back(b3)
        rest = await drain(bus, 6, "actor", ["input_ids"], 5)
        delivered = b3.sample_ids + [s for b in rest for s in b.sample_ids]
        assert sorted(delivered) == sorted(f"k{i}" for i in range(12))  # no loss, no duplicate
        assert await bus.progress(6, "actor") == {"rows": 12, "sealed": 12, "expected_rows": None, "group_size": None,
                                                  "dropped": False, "acked": 12, "leased": 0, "media": 0,
                                                  "media_bytes": 0}
        stats = bus.stats()
        assert stats["given_back"] == 8 and stats["acked_rows"] == 12

    drive(new_bus, body)


def test_unacked_lease_runs_out(new_bus):
    async def body(bus):
        await bus.put(7, rows("d", 4))
        lost = await bus.fetch(7, "actor", ["input_ids"], 2, timeout=5)  # this consumer hangs
        late = await bus.fetch(7, "actor", ["input_ids"], 2, timeout=5)
        # no timeout of its own: only the lapse of the hung consumer's lease can hand rows out
        again = await asyncio.wait_for(bus.fetch(7, "actor", ["input_ids"], 2), HANG_S)
        assert again.sample_ids == lost.sample_ids
        with pytest.raises(LeaseError, match="handed out again"):
            await bus.ack(lost)
        await asyncio.sleep(0.6)  # past the lease (load only lengthens the sleep; simulated time on the twin)
        await bus.ack(late)  # ran out too, but nobody took its rows: the late ack still counts
        await bus.ack(again)
        await bus.seal(7, 4)
        assert await bus.fetch(7, "actor", ["input_ids"], 2, timeout=5) is None

    drive(new_bus, body, lease_timeout=0.4)


def test_tasks_consume_independently(new_bus):
    async def body(bus):
        await bus.put(8, rows("i", 6))
        await bus.seal(8, 6)
        ref = await drain(bus, 8, "reference", ["input_ids"], 4)
        act = await drain(bus, 8, "actor", ["input_ids", "reward"], 3)
        assert [len(b) for b in ref] == [4, 2] and [len(b) for b in act] == [3, 3]
        assert sorted(s for b in ref for s in b.sample_ids) == sorted(s for b in act for s in b.sample_ids)
        assert act[0].fields["reward"] == [0.0, 1.0, 2.0] and all(type(r) is float for r in act[0].fields["reward"])

    drive(new_bus, body)


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_mm_dict_round_trip_is_bit_identical(new_bus):
    gen = torch.Generator().manual_seed(0)

    def mm(n: int, k: int):
        pixels = torch.randn(n, 384, generator=gen)
        pixels[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
        return {"pixel_values_videos": pixels, "video_grid_thw": torch.randint(1, 9, (k, 3), generator=gen),
                "video_second_per_grid": torch.tensor([0.5, 1.0 / 3.0])[:k],
                "audio_features": torch.randn(2, n, generator=gen).to(torch.bfloat16)}

    sent = {f"v{i}": mm(n, k) for i, (n, k) in enumerate([(16, 1), (40, 2), (8, 1)])}
    sent["v3"] = {}  # a text-only episode

    async def body(bus):
        await bus.put(9, [{"sample_id": sid, "mm": value, "reward": 1.0} for sid, value in sent.items()])
        batch = await bus.fetch(9, "actor", ["mm"], 4, timeout=5)
        for sid, got in zip(batch.sample_ids, batch.fields["mm"], strict=True):
            assert isinstance(got, dict) and set(got) == set(sent[sid])
            for key, value in sent[sid].items():
                assert got[key].dtype == value.dtype and got[key].shape == value.shape
                assert _bits(got[key]) == _bits(value), (sid, key)

    drive(new_bus, body)


def test_variable_length_tensors_come_back_dense_per_row(new_bus):
    async def body(bus):
        sent = [{"sample_id": f"s{i}", "input_ids": torch.arange(3 + 5 * i),
                 "loss_mask": torch.arange(3 + 5 * i) % 2 == 0,
                 "logp": torch.randn(3 + 5 * i, dtype=torch.float64), "frames": torch.ones(i + 1, 4 - i, 2),
                 "score": torch.tensor(0.25 * i), "version": i, "status": "ok" if i else "truncated",
                 "same": torch.full((2, 2), i), "info": {"turns": i, "tags": ("a", i)}} for i in range(3)]
        await bus.put(10, sent)
        fields = ["input_ids", "loss_mask", "logp", "frames", "score", "version", "status", "same", "info"]
        batch = await bus.fetch(10, "actor", fields, 3, timeout=5)
        for i, sid in enumerate(batch.sample_ids):
            row = sent[int(sid[1:])]
            for name in ["input_ids", "loss_mask", "logp", "frames", "score", "same"]:
                got = batch.fields[name][i]
                assert type(got) is torch.Tensor and not got.is_nested, name
                assert got.dtype == row[name].dtype and got.shape == row[name].shape and torch.equal(got, row[name])
            assert batch.fields["version"][i] == row["version"] and type(batch.fields["version"][i]) is int
            assert batch.fields["status"][i] == row["status"]
            assert batch.fields["info"][i] == {"turns": row["info"]["turns"], "tags": ["a", row["info"]["turns"]]}

    drive(new_bus, body)


def test_fetched_values_are_private_copies(new_bus):
    async def body(bus):
        ids = torch.arange(4)
        await bus.put(11, [{"sample_id": "c0", "input_ids": ids}])
        ids.zero_()  # the producer reuses its buffer
        first = await bus.fetch(11, "a", ["input_ids"], 1, timeout=5)
        first.fields["input_ids"][0].mul_(100)  # a consumer edits in place
        second = await bus.fetch(11, "b", ["input_ids"], 1, timeout=5)
        assert torch.equal(second.fields["input_ids"][0], torch.arange(4))

    drive(new_bus, body)


def test_concurrent_producers_and_consumers(new_bus):
    n_producers, per_producer, batch = 4, 24, 8
    total = n_producers * per_producer

    async def body(bus):
        await bus.open_partition(12, expected_rows=total, group_size=4)

        async def producer(p: int):
            for start in range(0, per_producer, 8):
                await bus.put(12, [{"sample_id": f"p{p}-{i}", "group_id": f"p{p}-{i // 4}",
                                    "input_ids": torch.arange(1 + i % 7)} for i in range(start, start + 8)])
                await asyncio.sleep(0.01)

        async def reference(worker: int):
            seen = []
            while (b := await bus.fetch(12, "reference", ["input_ids"], 6, timeout=10)) is not None:
                await bus.put_fields(12, b.sample_ids, {"ref_logprobs": [-t.float() for t in b.fields["input_ids"]]})
                await bus.ack(b)
                seen += b.sample_ids
            return seen

        async def actor(worker: int):
            seen = []
            while (b := await bus.fetch(12, "actor", ["input_ids", "ref_logprobs", "group_id"], batch,
                                        whole_groups=True, timeout=10)) is not None:
                assert all(torch.equal(r, -i.float()) for r, i in
                           zip(b.fields["ref_logprobs"], b.fields["input_ids"], strict=True))
                groups = b.fields["group_id"]
                assert all(groups.count(g) == 4 for g in groups)
                if worker == 0 and not seen:
                    await bus.give_back(b)  # this consumer gives its first batch back: another takes it
                    seen.append(None)
                    continue
                await bus.ack(b)
                seen += b.sample_ids
            return [s for s in seen if s is not None]

        async def seal_when_done():
            await asyncio.gather(*(producer(p) for p in range(n_producers)))
            await bus.seal(12, total)

        results = await asyncio.gather(seal_when_done(), *(reference(w) for w in range(2)),
                                       *(actor(w) for w in range(3)))
        everything = sorted(f"p{p}-{i}" for p in range(n_producers) for i in range(per_producer))
        refs = [s for r in results[1:3] for s in r]
        acts = [s for r in results[3:] for s in r]
        assert sorted(refs) == everything and sorted(acts) == everything  # each row once per task
        assert (await bus.progress(12, "actor"))["acked"] == total

    drive(new_bus, body)


def test_bad_input_names_the_culprit(new_bus):
    async def body(bus):
        with pytest.raises(DataBusInputError, match=r"partition 13: row 1 has no 'sample_id'"):
            await bus.put(13, [{"sample_id": "a", "x": 1}, {"x": 2}])
        with pytest.raises(DataBusInputError, match=r"partition 13: duplicate sample_id 'a' in one put"):
            await bus.put(13, [{"sample_id": "a", "x": 1}, {"sample_id": "a", "x": 2}])
        await bus.put(13, [{"sample_id": "a", "x": torch.ones(2)}, {"sample_id": "b", "x": torch.ones(3)}])
        with pytest.raises(DataBusInputError, match=r"partition 13: duplicate sample_id 'b' \(already put\)"):
            await bus.put(13, [{"sample_id": "c", "x": torch.ones(1)}, {"sample_id": "b", "x": torch.ones(1)}])
        await bus.put(13, [{"sample_id": "c", "x": torch.ones(1)}])  # the refused put left nothing behind
        with pytest.raises(DataBusInputError, match=r"partition 13: row 'd' has no fields besides 'sample_id'"):
            await bus.put(13, [{"sample_id": "d"}])
        with pytest.raises(DataBusInputError, match=r"partition 13: put_fields names rows that were never put: 'zz'"):
            await bus.put_fields(13, ["a", "zz"], {"adv": [1.0, 2.0]})
        with pytest.raises(DataBusInputError, match=r"partition 13: field 'adv' has 1 values for 2 sample_ids"):
            await bus.put_fields(13, ["a", "b"], {"adv": [1.0]})
        with pytest.raises(DataBusInputError, match=r"partition 13: put_fields cannot rewrite 'sample_id'"):
            await bus.put_fields(13, ["a"], {"sample_id": ["x"]})
        with pytest.raises(DataBusInputError, match=r"partition 13: field 'x' holds torch.float32 tensors; got "
                                                    r"torch.int64"):
            await bus.put(13, [{"sample_id": "e", "x": torch.arange(2)}])
        with pytest.raises(DataBusInputError, match=r"partition 13: field 'y' mixes tensor dtypes"):
            await bus.put(13, [{"sample_id": "e", "y": torch.ones(1)}, {"sample_id": "f", "y": torch.ones(1).long()}])
        with pytest.raises(DataBusInputError, match=r"partition 13 already holds 3 rows; cannot seal at 2"):
            await bus.seal(13, 2)
        await bus.seal(13, 3)
        with pytest.raises(DataBusInputError, match=r"partition 13 is sealed at 3 rows"):
            await bus.put(13, [{"sample_id": "g", "x": torch.ones(1)}])
        await bus.open_partition(14, group_size=2)
        with pytest.raises(DataBusInputError, match=r"partition 14 declares group_size=2 but row 'h' has no "
                                                    r"'group_id'"):
            await bus.put(14, [{"sample_id": "h", "x": 1}])
        with pytest.raises(DataBusInputError, match=r"partition 14: group 'q' would have 3 rows"):
            await bus.put(14, [{"sample_id": f"q{i}", "group_id": "q", "x": i} for i in range(3)])
        with pytest.raises(DataBusInputError, match=r"partition 14: opened again with group_size=3, was 2"):
            await bus.open_partition(14, group_size=3)
        with pytest.raises(DataBusInputError, match=r"partition 15: task 'actor' must fetch a non-empty list"):
            await bus.fetch(15, "actor", [], 2)
        with pytest.raises(DataBusInputError, match=r"partition 15: batch_size must be a positive int"):
            await bus.fetch(15, "actor", ["x"], 0)
        with pytest.raises(DataBusInputError, match=r"partition must be an int"):
            await bus.put("15", [{"sample_id": "a", "x": 1}])
        await bus.drop_partition(13)
        with pytest.raises(DataBusInputError, match=r"partition 13 was dropped"):
            await bus.put(13, [{"sample_id": "z", "x": 1}])
        with pytest.raises(DataBusInputError, match=r"partition 13 was dropped"):
            await bus.fetch(13, "actor", ["x"], 1, timeout=0)

    drive(new_bus, body)


def test_cancelled_fetch_leaves_no_rows_behind(new_bus):
    async def body(bus):
        for partition, delay in enumerate([0, 0.001, 0.003, 0.01, 0.03]):
            await bus.put(20 + partition, rows("c", 2))
            fetch = asyncio.create_task(bus.fetch(20 + partition, "actor", ["input_ids"], 2, timeout=5))
            await asyncio.sleep(delay)
            fetch.cancel()
            try:
                await bus.give_back(await fetch)  # it finished before the cancel landed
            except asyncio.CancelledError:
                pass
            again = await bus.fetch(20 + partition, "actor", ["input_ids"], 2, timeout=5)
            assert again is not None and sorted(again.sample_ids) == ["c0", "c1"], (partition, delay)

    drive(new_bus, body)


def test_drop_partition_ends_its_leases(new_bus):
    async def body(bus):
        await bus.put(16, rows("x", 2))
        batch = await bus.fetch(16, "actor", ["input_ids"], 2, timeout=5)
        await bus.drop_partition(16)
        with pytest.raises(LeaseError, match="dropped"):
            await bus.ack(batch)
        assert (await bus.progress(16))["dropped"] is True

    drive(new_bus, body)


def _media(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    video = torch.randn(8, 3, 16, 16, generator=gen)
    video[0, 0, 0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    return {f"vid{seed}": video, f"frames{seed}": torch.randint(0, 255, (4, 16, 16, 3), generator=gen, dtype=torch.uint8),
            f"audio{seed}": torch.randn(2, 300, generator=gen).to(torch.bfloat16)}


def test_media_are_stored_once_and_read_back_bit_identical(new_bus):
    first, second = _media(0), _media(1)

    async def body(bus):
        await bus.open_partition(20, expected_rows=4, group_size=2)
        refs = {"mm_inputs": {"v": "media:vid0"}, "reward": 1.0}
        await bus.put(20, [{"sample_id": f"a{i}", "group_id": 0, **refs} for i in range(2)], media=first)
        # the next group shares one tensor (already stored: not written again) and brings its own
        again = {"vid0": first["vid0"], **second}
        await bus.put(20, [{"sample_id": f"b{i}", "group_id": 1, **refs} for i in range(2)], media=again)
        stats = bus.stats()
        assert stats["media_put"] == 6 and stats["media_reused"] == 1
        assert stats["media_bytes_reused"] == first["vid0"].numel() * 4
        assert stats["bytes_put"] >= stats["media_bytes_put"] == sum(t.numel() * t.element_size()
                                                                    for t in {**first, **second}.values())
        got = await bus.get_media(20, ["frames1", "vid0", "audio0", "vid0"])
        assert list(got) == ["frames1", "vid0", "audio0"]
        for key, tensor in got.items():
            sent = {**first, **second}[key]
            assert tensor.dtype == sent.dtype and tensor.shape == sent.shape and _bits(tensor) == _bits(sent), key
        got["vid0"].zero_()  # a private copy: the store keeps its own
        assert _bits((await bus.get_media(20, ["vid0"]))["vid0"]) == _bits(first["vid0"])
        # media are not rows: the declared 4 rows, the seal at 4 and whole groups of 2 see only the samples
        progress = await bus.progress(20)
        assert progress["rows"] == 4 and progress["media"] == 6
        await bus.seal(20, 4)
        batches = await drain(bus, 20, "actor", ["mm_inputs", "reward"], 4, whole_groups=True)
        assert sorted(s for b in batches for s in b.sample_ids) == ["a0", "a1", "b0", "b1"]
        assert all(b.fields["mm_inputs"][0] == {"v": "media:vid0"} for b in batches)
        assert stats["media_gets"] == 0 and bus.stats()["media_gets"] == 2

    drive(new_bus, body)


def test_media_errors_and_drop_partition_frees_them(new_bus):
    async def body(bus):
        await bus.put(21, [], media={"only": torch.ones(3)})  # media alone open the partition, add no row
        assert (await bus.progress(21))["rows"] == 0
        with pytest.raises(DataBusInputError, match=r"partition 21 stores no media under 'nope'"):
            await bus.get_media(21, ["only", "nope"])
        with pytest.raises(DataBusInputError, match="not a dense tensor"):
            await bus.put(21, rows("m", 1), media={"k": [1.0, 2.0]})
        with pytest.raises(DataBusInputError, match="list of non-empty string keys"):
            await bus.get_media(21, "only")
        await bus.put(21, rows("m", 1), media={"k": torch.zeros(2)})
        with pytest.raises(DuplicateRowError):  # a re-sent group: its rows are refused, its media are already there
            await bus.put(21, rows("m", 1), media={"k": torch.zeros(2)})
        assert torch.equal((await bus.get_media(21, ["k"]))["k"], torch.zeros(2))
        await bus.drop_partition(21)
        progress = await bus.progress(21)
        assert progress["dropped"] is True and progress["media"] == 0
        with pytest.raises(DataBusInputError, match="dropped"):
            await bus.get_media(21, ["k"])
        with pytest.raises(DataBusInputError, match="dropped"):
            await bus.put(21, [], media={"k": torch.zeros(2)})

    drive(new_bus, body)


def test_make_bus():
    assert isinstance(make_bus("inprocess", lease_timeout=None), InProcessBus)
    assert isinstance(make_bus("transferqueue", scope="x"), TransferQueueBus)  # connects on first use
    with pytest.raises(DataBusInputError, match="unknown data bus kind 'kafka'"):
        make_bus("kafka")
    assert isinstance(BusBatch(0, "t", [], {}, "l"), BusBatch)
    assert issubclass(DataBusInputError, (DataBusError, ValueError))


# ------------------------------------------------------------------------ TransferQueue-only: the real edges
@pytest.mark.integration
def test_tq_binds_loopback_with_one_storage_unit(tq_owner, ray_session):
    ray = ray_session
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    conf = ray.get(controller.get_config.remote())
    assert conf.controller.zmq_info.ip == "127.0.0.1"
    assert all(info.ip == "127.0.0.1" for info in conf.backend.SimpleStorage.zmq_info.values())
    assert conf.controller.polling_mode is True and conf.backend.SimpleStorage.num_data_storage_units == 1
    alive = {a["Name"] for a in ray._private.state.actors(actor_state_name="ALIVE").values()}
    assert {"TransferQueueController", "TransferQueueStorageUnit#0", "relax_gym.databus.ledger"} <= alive


@pytest.mark.integration
def test_tq_consumer_in_another_process_dies_and_its_rows_come_back(tq_owner, ray_session):
    """A consumer actor leases rows and is killed; the controller's release_task hands them to a new consumer."""
    ray = ray_session
    scope = f"t-{uuid.uuid4().hex[:8]}"

    @ray.remote(num_cpus=0)
    class Consumer:
        async def take(self, scope: str, n: int) -> list[str]:
            self.bus = TransferQueueBus(scope=scope)
            batch = await self.bus.fetch(0, "actor", ["input_ids"], n, timeout=30)
            return batch.sample_ids  # never acked

    async def main():
        bus = TransferQueueBus(scope=scope)
        try:
            await bus.put(0, rows("x", 6))
            await bus.seal(0, 6)
            consumer = Consumer.remote()
            taken = await consumer.take.remote(scope, 4)
            ray.kill(consumer)
            assert await bus.fetch(0, "actor", ["input_ids"], 4, timeout=0.3) is not None  # the 2 nobody took
            assert await bus.release_task("actor") == 4 + 2  # the dead consumer's 4 + this test's unacked 2
            again = await drain(bus, 0, "actor", ["input_ids"], 6)
            assert sorted(s for b in again for s in b.sample_ids) == sorted(f"x{i}" for i in range(6))
            assert set(taken) <= {s for b in again for s in b.sample_ids}
        finally:
            await bus.close()

    asyncio.run(main())


def test_wait_is_event_driven_in_the_twin():
    """The twin wakes a waiting fetch on the write itself (no polling interval to wait out): on the virtual clock
    the batch arrives at the very moment of the put."""
    async def main():
        bus = InProcessBus(clock=loop_clock)
        waiting = asyncio.create_task(bus.fetch(0, "actor", ["x"], 1, timeout=30))
        await asyncio.sleep(0.05)
        t0 = loop_clock()
        await bus.put(0, [{"sample_id": "a", "x": 1}])
        batch = await waiting
        assert batch.fields["x"] == [1] and loop_clock() == t0
        assert math.isclose(bus.stats()["fetches"], 1) and bus.stats()["fetch_wait_s"] == pytest.approx(0.05)

    run_on_virtual_clock(main())


@pytest.mark.integration
def test_tq_waiting_fetch_wakes_on_the_write_not_on_a_timer(tq_owner, ray_session):
    """A TransferQueue fetch that finds nothing sleeps on the ledger; the put (and a put_fields that completes a row)
    wakes it. With a 300 s re-check interval, only the wake-up can answer within the test's limit, and the
    fetch reads TransferQueue's readiness a handful of times, not once per backoff interval."""
    async def waits(bus, n):  # the fetch has gone to sleep on the ledger n times
        while bus.stats().get("waits", 0) < n:
            await asyncio.sleep(0.01)

    async def main():
        bus = TransferQueueBus(scope=f"t-{uuid.uuid4().hex[:8]}", recheck_s=300.0)
        try:
            waiting = asyncio.ensure_future(bus.fetch(0, "actor", ["input_ids", "adv"], 2))
            await asyncio.wait_for(waits(bus, 1), HANG_S)
            await bus.put(0, rows("w", 2))  # no "adv" yet: woken, it finds nothing to hand out and sleeps again
            await asyncio.wait_for(waits(bus, 2), HANG_S)
            assert not waiting.done()
            await bus.put_fields(0, ["w0", "w1"], {"adv": [0.5, -0.5]})
            batch = await asyncio.wait_for(waiting, HANG_S)
            assert batch.sample_ids == ["w0", "w1"] and batch.fields["adv"] == [0.5, -0.5]
            stats = bus.stats()
            assert stats["waits"] >= 2 and stats["polls"] <= 6, stats
        finally:
            await bus.close()

    asyncio.run(main())


@pytest.mark.integration
def test_tq_waiting_fetch_wakes_when_a_lease_lapses(tq_owner, ray_session):
    async def main():
        bus = TransferQueueBus(scope=f"t-{uuid.uuid4().hex[:8]}", lease_timeout=0.5, recheck_s=300.0)
        try:
            await bus.put(0, rows("l", 1))
            await bus.fetch(0, "actor", ["input_ids"], 1)  # never acked
            # with a 300 s re-check, only the ledger's wake-up at the lapse can answer within the limit
            again = await asyncio.wait_for(bus.fetch(0, "actor", ["input_ids"], 1), HANG_S)
            assert again.sample_ids == ["l0"]
        finally:
            await bus.close()

    asyncio.run(main())
