"""Data-bus overhead: the TransferQueue bus against raw TransferQueue on 1 MB samples, measured in the same run.

Raw: one client writes dense (batch, 262144) float32 blocks with ``put`` (insert mode) and reads them back with
``get_meta`` (polling mode, one task) + ``get_data`` — what TransferQueue does by itself. Bus: the same rows as
dicts through ``put``, then ``fetch`` + ``ack`` of micro-batches of the same size, rows back as one plain tensor
each — with the ledger's leases, readiness polling and the unbinding the bus adds. Ratios are bus time / raw time
(1.0 = no overhead). Also: the latency of one fetch attempt that finds nothing, against one empty raw ``get_meta``.

Media stored once per group (``dedupe``): one rollout step of the default recipe (recipes/cpu-nextqa.yaml: 32
prompts x group of 4, its clips rendered by the policy's processor) put on the bus with a copy of each clip per row,
then with each clip once (``trainer.dedupe_media``), and read back as the actor reads it (whole groups, references
resolved); the figures are the bus's ``bytes_put`` per step, their ratio, the put + read time, and whether the
resolved media are bit-identical to the copies.

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
from pathlib import Path

import torch

ROW_FLOATS = 262_144  # 1 MiB of float32 per sample
RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "cpu-nextqa.yaml"


def _ensure_ray() -> bool:
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from relax_gym.trainer.cluster.local_ray import start_local_ray

    start_local_ray(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
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
        dedupe = await _dedupe(prompts=8 if reps == 1 else 32, group=4)
    finally:
        client.close()
        await owner.close()
    mb = n_rows * ROW_FLOATS * 4 / 2**20
    rp, rg, bp, bg = (statistics.median(v) for v in (raw_put, raw_get, bus_put, bus_get))
    return {
        "rows": n_rows, "batch": batch, "mb": mb, "reps": reps,
        "raw_put_mb_s": mb / rp, "raw_get_mb_s": mb / rg, "bus_put_mb_s": mb / bp, "bus_get_mb_s": mb / bg,
        "put_ratio": bp / rp, "get_ratio": bg / rg, "total_ratio": (bp + bg) / (rp + rg),
        "raw_empty_get_ms": raw_empty_ms, "bus_empty_fetch_ms": bus_empty_ms, "dedupe": dedupe,
    }


def _step_rows(prompts: int, group: int) -> list[list[dict]]:
    """One step's bus rows of the default recipe, group by group: each row renders its prompt on its own (as the
    env worker's episodes do), so each holds its own copy of the clip."""
    import numpy as np

    import relax_gym
    from relax_gym.trainer.config import RelaxConfig
    from relax_gym.trainer.config_loader import load_config
    from relax_gym.trainer.policy import build_policy
    from relax_gym.trainer.rollout.episode import Trajectory
    from relax_gym.trainer.rollout.samples import sample_id, trajectory_row
    from relax_gym.trainer.run.warmup import demonstration

    cfg = load_config(RECIPE, ["model.base=null"], RelaxConfig)
    _, processor = build_policy(cfg.model)
    env = relax_gym.make(cfg.env.id, **cfg.env.kwargs)
    rng = np.random.default_rng(0)
    groups = []
    for p in range(prompts):
        rendered = [demonstration(env, processor, p, rng) for _ in range(group)]
        groups.append([trajectory_row(Trajectory(group_id=p, seed=p, input_ids=list(r.input_ids),
                                                 loss_mask=list(r.loss_mask), rollout_logprobs=[-1.0] * len(r.input_ids),
                                                 mm=dict(r.mm), reward=float(m % 2)), sample_id(1, p, m), [1])
                       for m, r in enumerate(rendered)])
    env.close()
    return groups


async def _dedupe_round(groups: list[list[dict]], dedupe: bool) -> tuple[float, float, list[dict]]:
    """Put one step (with or without shared media) on a fresh bus scope and read it back as the actor does;
    the bytes put, the seconds taken and the resolved media of every row."""
    from relax_gym.trainer.async_engine.roles.env_worker import group_rows
    from relax_gym.trainer.databus.tq import TransferQueueBus
    from relax_gym.trainer.rollout.media import MediaResolver

    bus = TransferQueueBus(scope=f"bench-dedupe-{uuid.uuid4().hex[:6]}")
    n, g = sum(len(x) for x in groups), len(groups[0])
    resolver = MediaResolver()
    media_of: dict[str, dict] = {}
    t0 = time.perf_counter()
    await bus.open_partition(0, expected_rows=n, group_size=g)
    for rows in groups:
        shared, media, _ = group_rows(rows, dedupe=dedupe)
        await bus.put(0, shared, media=media)
    await bus.seal(0, n)
    while (got := await bus.fetch(0, "actor", ["mm_inputs"], 8 * g, whole_groups=True, timeout=30)) is not None:
        mms = await resolver.resolve(got.fields["mm_inputs"], lambda keys: bus.get_media(0, keys))
        media_of.update(zip(got.sample_ids, mms, strict=True))
        await bus.ack(got)
    seconds = time.perf_counter() - t0
    bytes_put = bus.stats()["bytes_put"]
    await bus.drop_partition(0)
    await bus.close()
    return bytes_put, seconds, [media_of[r["sample_id"]] for rows in groups for r in rows]


async def _dedupe(prompts: int, group: int) -> dict:
    groups = await asyncio.to_thread(_step_rows, prompts, group)
    copies, t_copies, mm_copies = await _dedupe_round(groups, dedupe=False)
    shared, t_shared, mm_shared = await _dedupe_round(groups, dedupe=True)
    identical = all(a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
                    for a, b in zip(mm_copies, mm_shared, strict=True))
    return {"prompts": prompts, "group_size": group, "bytes_per_step_copies": copies, "bytes_per_step_shared": shared,
            "bytes_ratio": copies / shared, "put_read_s_copies": t_copies, "put_read_s_shared": t_shared,
            "identical": identical}


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
    d = fig["dedupe"]
    media = Table("media", "bytes put per step", "put + read (s)",
                  title=f"one step of recipes/cpu-nextqa.yaml on the bus: {d['prompts']} prompts x group of "
                        f"{d['group_size']}")
    media.add_row("a copy per row", f"{d['bytes_per_step_copies'] / 2**20:.1f} MiB", f"{d['put_read_s_copies']:.2f}")
    media.add_row("once per group", f"{d['bytes_per_step_shared'] / 2**20:.1f} MiB", f"{d['put_read_s_shared']:.2f}")
    media.add_row("ratio", f"{d['bytes_ratio']:.2f}x", f"{d['put_read_s_copies'] / d['put_read_s_shared']:.2f}x")
    Console().print(media)
    Console().print(f"resolved media bit-identical to the copies: {d['identical']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 rows, one repetition")
    print_table(run(quick=parser.parse_args().quick))


if __name__ == "__main__":
    main()
