"""In-process twin of the data bus: the same contract as the TransferQueue bus, held in one asyncio event loop.

Rows live in a dict per partition, media tensors (``put(..., media=)``) in another, by key; the delivery ledger (shared with the TransferQueue bus) decides what each fetch
gets. A fetch that has nothing to take sleeps on an :class:`asyncio.Condition` that every write, seal, give-back and
drop notifies, and wakes early only for the next lease deadline — it never polls on a fixed interval. Lease
deadlines and fetch timeouts are read from ``clock`` (default ``time.monotonic``); tests on a virtual event loop hand
in its ``loop.time`` so that leases lapse in simulated time.

Values are copied on the way in and on the way out (tensors cloned to CPU, tuples turned into lists), because that is
what crossing TransferQueue's wire does: a producer that reuses a buffer after ``put``, or a consumer that edits a
fetched tensor in place, changes nothing in the bus.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from relax_gym.trainer.databus.checks import (
    check_columns,
    check_fetch,
    check_partition,
    check_rows,
    check_task,
    column_dtypes,
)
from relax_gym.trainer.databus.ledger import BATCH, EXHAUSTED, DeliveryLedger, Stats
from relax_gym.trainer.databus.media import (
    check_media,
    check_media_keys,
    payload_bytes,
    tensor_bytes,
)
from relax_gym.trainer.databus.protocol import (
    SAMPLE_ID,
    BusBatch,
    DataBus,
    DataBusError,
)


def copy_value(value: Any) -> Any:
    """A deep copy of one field value as the wire would deliver it (CPU tensors, lists for tuples)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous()
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [copy_value(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


class InProcessBus(DataBus):
    """The data bus for one process and one event loop (unit tests, single-process runs)."""

    def __init__(self, *, lease_timeout: float | None = 600.0, group_field: str = "group_id",
                 clock: Callable[[], float] = time.monotonic):
        self.group_field = group_field
        self._clock = clock
        self._ledger = DeliveryLedger(lease_timeout, clock)
        self._rows: dict[int, dict[str, dict[str, Any]]] = {}
        self._media: dict[int, dict[str, torch.Tensor]] = {}  # partition -> media key -> tensor
        self._changed = asyncio.Condition()
        self._stats = Stats()
        self._closed = False

    async def open_partition(self, partition: int, *, expected_rows: int | None = None,
                             group_size: int | None = None) -> None:
        self._check_open()
        self._ledger.open(check_partition(partition), expected_rows, group_size)
        self._rows.setdefault(partition, {})
        await self._notify()

    async def put(self, partition: int, rows: list[dict[str, Any]], *,
                  media: Mapping[str, torch.Tensor] | None = None) -> None:
        self._check_open()
        ids, bodies = check_rows(partition, rows)
        media = check_media(partition, media)
        if not ids and not media:
            return
        names = list(dict.fromkeys(k for b in bodies for k in b))
        dtypes = column_dtypes(partition, {n: [b[n] for b in bodies if n in b] for n in names})
        groups = [b.get(self.group_field) for b in bodies]
        # no await from here on: the media, the ledger's rows and the stored rows change together
        new = set(self._ledger.media_missing(partition, list(media)))
        if ids:
            self._ledger.register(partition, ids, groups, dtypes, self.group_field)
        self._store_media(partition, media, new)
        store = self._rows.setdefault(partition, {})
        for sid, body in zip(ids, bodies, strict=True):
            store[sid] = {k: copy_value(v) for k, v in body.items()}
        if ids:
            self._stats.add("puts")
            self._stats.add("rows", len(ids))
            self._stats.add("bytes_put", payload_bytes(bodies) + payload_bytes(ids))
        await self._notify()

    def _store_media(self, partition: int, media: dict[str, torch.Tensor], new: set[str]) -> None:
        store = self._media.setdefault(partition, {})
        for key, tensor in media.items():
            size = tensor_bytes(tensor)
            if key in new:
                store[key] = copy_value(tensor)
                self._stats.add("media_put")
                self._stats.add("media_bytes_put", size)
                self._stats.add("bytes_put", size)
            else:
                self._stats.add("media_reused")
                self._stats.add("media_bytes_reused", size)
        self._ledger.media_bind(partition, {k: tensor_bytes(media[k]) for k in new})

    async def get_media(self, partition: int, keys: list[str]) -> dict[str, torch.Tensor]:
        self._check_open()
        keys = check_media_keys(check_partition(partition), keys)
        self._ledger.media_check(partition, keys)
        out = {k: copy_value(self._media[partition][k]) for k in keys}
        self._stats.add("media_gets")
        self._stats.add("media_bytes_got", sum(tensor_bytes(t) for t in out.values()))
        return out

    async def put_fields(self, partition: int, sample_ids: list[str], fields: dict[str, list[Any]]) -> None:
        self._check_open()
        ids, columns = check_columns(partition, sample_ids, fields)
        self._ledger.add_fields(partition, ids, column_dtypes(partition, columns))
        store = self._rows[partition]
        for i, sid in enumerate(ids):
            store[sid].update({k: copy_value(v[i]) for k, v in columns.items()})
        self._stats.add("put_fields")
        self._stats.add("bytes_put", payload_bytes(columns))
        await self._notify()

    async def seal(self, partition: int, n_rows: int) -> None:
        self._check_open()
        self._ledger.seal(check_partition(partition), n_rows)
        await self._notify()

    async def fetch(self, partition: int, task: str, fields: list[str], batch_size: int, *,
                    whole_groups: bool = False, timeout: float | None = None) -> BusBatch | None:
        self._check_open()
        need = check_fetch(partition, task, fields, batch_size, timeout)
        start = self._clock()
        deadline = None if timeout is None else start + timeout
        try:
            async with self._changed:
                while True:
                    store = self._rows.get(partition, {})
                    ready = [sid for sid, row in store.items() if all(f in row for f in need)]
                    pick = self._ledger.pick(partition, task, batch_size, ready_ids=ready, whole_groups=whole_groups)
                    if pick.verdict == BATCH:
                        assert pick.lease is not None
                        ids = pick.lease.sample_ids
                        columns = {f: (list(ids) if f == SAMPLE_ID else [copy_value(store[s][f]) for s in ids])
                                   for f in dict.fromkeys(fields)}
                        self._stats.add("fetches")
                        self._stats.add("fetched_rows", len(ids))
                        return BusBatch(partition, task, list(ids), columns, pick.lease.lease_id)
                    now = self._clock()
                    if pick.verdict == EXHAUSTED or self._closed or (deadline is not None and now >= deadline):
                        self._stats.add("empty_fetches")
                        return None
                    waits = [t - now for t in (deadline, self._ledger.next_deadline()) if t is not None]
                    wake = max(min(waits), 0.0) if waits else None
                    try:
                        await asyncio.wait_for(self._changed.wait(), wake)
                    except asyncio.TimeoutError:
                        pass  # a deadline passed: a lease ran out (rows are back) or this fetch's own timeout
        finally:
            self._stats.add("fetch_wait_s", self._clock() - start)

    async def ack(self, batch: BusBatch) -> None:
        self._check_open()
        n = self._ledger.ack(batch.lease_id, batch.partition, batch.task)
        self._stats.add("acks")
        self._stats.add("acked_rows", n)

    async def give_back(self, batch: BusBatch) -> None:
        self._check_open()
        n = self._ledger.give_back(batch.lease_id, batch.partition, batch.task)
        self._stats.add("given_back", n)
        await self._notify()

    async def release_task(self, task: str, partition: int | None = None) -> int:
        self._check_open()
        n = self._ledger.release_task(check_task(task), None if partition is None else check_partition(partition))
        self._stats.add("given_back", n)
        await self._notify()
        return n

    async def drop_partition(self, partition: int) -> None:
        self._check_open()
        self._ledger.drop(check_partition(partition))
        self._rows.pop(partition, None)
        self._media.pop(partition, None)
        await self._notify()

    async def progress(self, partition: int, task: str | None = None) -> dict[str, Any]:
        """Row, seal and (for ``task``) acked/leased counts of one partition."""
        return self._ledger.progress(check_partition(partition), task)

    def stats(self) -> dict[str, float]:
        return self._stats.snapshot()

    async def close(self) -> None:
        self._closed = True
        self._rows.clear()
        self._media.clear()
        await self._notify()

    # ---- helpers
    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _check_open(self) -> None:
        if self._closed:
            raise DataBusError("this InProcessBus is closed")
