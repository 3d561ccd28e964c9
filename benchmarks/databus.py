"""Data-bus overhead: the TransferQueue bus against raw TransferQueue on 1 MB samples, measured in the same run.

Raw: one client writes dense (batch, 262144) float32 blocks with ``put`` (insert mode) and reads them back with
``get_meta`` (polling mode, one task) + ``get_data`` — what TransferQueue does by itself. Bus: the same rows as
dicts through ``put``, then ``fetch`` + ``ack`` of micro-batches of the same size, rows back as one plain tensor
each — with the ledger's leases, readiness polling and the unbinding the bus adds. Ratios are bus time / raw time
(1.0 = no overhead). Also: the latency of one fetch attempt that finds nothing, against one empty raw ``get_meta``.

Run: ``python benchmarks/databus.py [--quick]``; ``run(quick)`` returns the figures as a dict. Starts a local Ray
session (auth off) when none is running.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import torch

ROW_FLOATS = 262_144  # 1 MiB of float32 per sample


def _ensure_ray() -> bool:
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             configure_logging=False, namespace="relax-gym-bench")
    return True


async def _raw_round(client, rows: torch.Tensor, batch: int) -> tuple[float, float]:
    from tensordict import TensorDict

    pid = f"bench-raw-{uuid.uuid4().hex[:6]}"
    blocks = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    t0 = time.perf_counter()
    for block in blocks:
        await client.async_put(TensorDict({"x": block}, batch_size=len(block)), partition_id=pid)
    t1 = time.perf_counter()
    got = 0
    while got < len(rows):
        meta = await client.async_get_meta(data_fields=["x"], batch_size=batch, partition_id=pid, mode="fetch",
                                           task_name="bench")
        data = await client.async_get_data(meta)
        got += data.batch_size[0]
    t2 = time.perf_counter()
    await client.async_clear_partition(pid)
    return t1 - t0, t2 - t1


async def _bus_round(bus, rows: torch.Tensor, batch: int, partition: int) -> tuple[float, float]:
    per_row = list(rows.unbind(0))
    t0 = time.perf_counter()
    for i in range(0, len(per_row), batch):
        await bus.put(partition, [{"sample_id": f"r{j}", "x": per_row[j]} for j in range(i, min(i + batch, len(rows)))])
    await bus.seal(partition, len(rows))
    t1 = time.perf_counter()
    seen = 0
    while (got := await bus.fetch(partition, "bench", ["x"], batch, timeout=30)) is not None:
        assert all(t.shape == (ROW_FLOATS,) for t in got.fields["x"])
        await bus.ack(got)
        seen += len(got)
    t2 = time.perf_counter()
    assert seen == len(rows), f"bus delivered {seen} of {len(rows)} rows"
    await bus.drop_partition(partition)
    return t1 - t0, t2 - t1


async def _empty_latency(client, bus, tries: int) -> tuple[float, float]:
    pid = f"bench-empty-{uuid.uuid4().hex[:6]}"
    from tensordict import TensorDict

    await client.async_put(TensorDict({"x": torch.zeros(1, 4)}, batch_size=1), partition_id=pid)
    await bus.put(10_000, [{"sample_id": "only", "x": torch.zeros(4)}])
    raw, mine = [], []
    for _ in range(tries):
        t0 = time.perf_counter()
        await client.async_get_meta(data_fields=["x"], batch_size=2, partition_id=pid, mode="fetch", task_name="t")
        raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await bus.fetch(10_000, "t", ["x"], 2, timeout=0)
        mine.append(time.perf_counter() - t0)
    await client.async_clear_partition(pid)
    await bus.drop_partition(10_000)
    return statistics.median(raw) * 1e3, statistics.median(mine) * 1e3


async def _measure(n_rows: int, batch: int, reps: int) -> dict:
    from relax_gym.trainer.databus.tq import TransferQueueBus, tq_client

    owner = await asyncio.to_thread(TransferQueueBus.start, scope=f"bench-{uuid.uuid4().hex[:6]}")
    client = await asyncio.to_thread(tq_client)
    try:
        rows = torch.randn(n_rows, ROW_FLOATS)
        await _raw_round(client, rows[:batch], batch)  # warm-up: sockets, allocations
        await _bus_round(owner, rows[:batch], batch, partition=-1)
        raw_put, raw_get, bus_put, bus_get = [], [], [], []
        for rep in range(reps):  # alternate which goes first, so neither always meets a warmer allocator
            if rep % 2:
                c, d = await _bus_round(owner, rows, batch, partition=rep)
                a, b = await _raw_round(client, rows, batch)
            else:
                a, b = await _raw_round(client, rows, batch)
                c, d = await _bus_round(owner, rows, batch, partition=rep)
            raw_put.append(a), raw_get.append(b), bus_put.append(c), bus_get.append(d)
        raw_empty_ms, bus_empty_ms = await _empty_latency(client, owner, 20 if reps > 1 else 8)
    finally:
        client.close()
        await owner.close()
    mb = n_rows * ROW_FLOATS * 4 / 2**20
    rp, rg, bp, bg = (statistics.median(v) for v in (raw_put, raw_get, bus_put, bus_get))
    return {
        "rows": n_rows, "batch": batch, "mb": mb, "reps": reps,
        "raw_put_mb_s": mb / rp, "raw_get_mb_s": mb / rg, "bus_put_mb_s": mb / bp, "bus_get_mb_s": mb / bg,
        "put_ratio": bp / rp, "get_ratio": bg / rg, "total_ratio": (bp + bg) / (rp + rg),
        "raw_empty_get_ms": raw_empty_ms, "bus_empty_fetch_ms": bus_empty_ms,
    }


def run(quick: bool = False) -> dict:
    """Measure (200 rows of 1 MB in batches of 50, 5 repetitions; quick: 50 rows, 1 repetition) and return figures."""
    started = _ensure_ray()
    try:
        return asyncio.run(_measure(50 if quick else 200, 25 if quick else 50, 1 if quick else 5))
    finally:
        if started:
            import ray

            ray.shutdown()


def print_table(fig: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("operation", "raw TransferQueue", "data bus", "bus / raw",
                  title=f"data bus vs raw TransferQueue: {fig['rows']} x 1 MB rows, batches of {fig['batch']}, "
                        f"median of {fig['reps']}")
    table.add_row("put (MB/s)", f"{fig['raw_put_mb_s']:.0f}", f"{fig['bus_put_mb_s']:.0f}", f"{fig['put_ratio']:.2f}x")
    table.add_row("get / fetch+ack (MB/s)", f"{fig['raw_get_mb_s']:.0f}", f"{fig['bus_get_mb_s']:.0f}",
                  f"{fig['get_ratio']:.2f}x")
    table.add_row("put + get (time)", "", "", f"{fig['total_ratio']:.2f}x")
    table.add_row("empty attempt (ms)", f"{fig['raw_empty_get_ms']:.2f}", f"{fig['bus_empty_fetch_ms']:.2f}",
                  f"{fig['bus_empty_fetch_ms'] / fig['raw_empty_get_ms']:.2f}x")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 rows, one repetition")
    print_table(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
