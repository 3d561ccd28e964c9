"""The data bus on TransferQueue (``transferqueue`` 0.1.11): rows in its storage units, readiness from its controller,
deliveries decided by a shared ledger.

How the bus maps onto TransferQueue:

- A bus partition ``k`` of scope ``s`` is the TransferQueue partition ``"s/step{k}"``; a row is a TransferQueue key
  (its ``sample_id``), created with ``kv_retrieve_meta(create=True)``; a field is a column. ``put`` writes new keys,
  ``put_fields`` writes new columns for existing keys, ``drop_partition`` clears the partition.
- Media (``put(..., media=)``) are keys ``media:<key>`` of the same partition with one field, ``media``: never
  registered in the ledger (no fetch counts or hands them out: they lack every sample field anyway), written once
  (the ledger records which keys a partition stores), read by key with ``get_media``, cleared with the partition.
- Small tensors whose rows share one shape (scalars, short vectors) are written stacked; everything else (large or
  ragged tensors, dicts such as ``mm``, Python scalars, strings) as a non-tensor column, which TransferQueue
  serialises value by value with tensors as raw buffers — no copy on the way in, and ``mm`` comes back
  bit-identical. On the way out, TransferQueue packs tensor columns into stacked or jagged/strided nested tensors
  (one copy); the bus unbinds them into one plain tensor per row.
- What is ready for a fetch comes from the controller's production status for the requested fields (one small
  request per attempt). Which of those rows the fetch gets — and the lease that makes delivery exactly-once once
  acked — comes from the :class:`~relax_gym.trainer.databus.ledger.DeliveryLedger`, kept in a Ray actor next to the
  controller so that every process shares it. The leased rows are then read by key.

TransferQueue's limits and how the bus works around them:

- Its consumption flags are set when ``get_meta`` hands rows out and can only be reset for a whole (partition, task),
  which would re-deliver rows that other live consumers still hold. The bus therefore never uses ``get_meta``'s
  consumption at all: the ledger leases rows individually and a give-back frees exactly those rows.
- It has no way to wait for data: ``get_meta`` either sleeps 5 s inside the controller's single request thread
  (blocking every other client) or, in polling mode, returns nothing. So the bus does not ask TransferQueue to
  wait: a fetch that finds nothing ready awaits the ledger actor, which every producer calls after its write lands
  (:meth:`LedgerHost.wait_change`), and reads the production status again when woken. The controller is still
  started in polling mode so that any other TransferQueue user in the session cannot stall it.
- It has no tail batches and no groups by value (its group sampler assumes groups sit at consecutive indexes); the
  ledger provides both.
- Its default start-up asks one CPU per actor (it hangs on a 2-CPU Ray node) and binds the node's address. ``start``
  builds the controller and one storage unit itself with ``num_cpus=0``, binds them to 127.0.0.1 on a single-node
  cluster, and caps ``TQ_NUM_THREADS`` at the core count.
- A fetched column mixing tensor dtypes would be cast to one dtype and a field whose dtype changes between puts never
  becomes ready; the bus refuses both at put time (one dtype per field and partition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from relax_gym.trainer.databus.checks import (
    check_columns,
    check_fetch,
    check_partition,
    check_rows,
    check_task,
    column_dtypes,
)
from relax_gym.trainer.databus.ledger import (
    BATCH,
    EXHAUSTED,
    Pick,
    Stats,
)
from relax_gym.trainer.databus.media import (
    check_media,
    check_media_keys,
    payload_bytes,
    tensor_bytes,
)
from relax_gym.trainer.databus.protocol import (
    ERRORS,
    SAMPLE_ID,
    BusBatch,
    DataBus,
    DataBusError,
    DataBusInputError,
)
from relax_gym.trainer.databus.tq_system import (
    CONTROLLER_NAME,
    LEDGER_NAME,
    TQ_NAMESPACE,
    System,
    connect_client,
    start_system,
    tq_client,
)

log = logging.getLogger(__name__)

__all__ = ["TransferQueueBus", "tq_client"]

MEDIA_ROW = "media:"  # TransferQueue key prefix of a partition's media rows (sample ids never start with it)
MEDIA_FIELD = "media"  # their one field
STACK_BELOW_BYTES = 64 * 1024  # rows smaller than this are stacked into one block (fewer frames than rows)


def _pack(values: list[Any]) -> Any:
    """One column of a put as TransferQueue takes it (see the module docstring). Large tensors go row by row in a
    non-tensor column: TransferQueue sends each as its own raw buffer, so the put copies nothing (stacking would
    copy every row into a fresh block first — the slowest step of a put of 1 MB rows)."""
    from tensordict import NonTensorStack

    if all(isinstance(v, torch.Tensor) and not v.is_nested for v in values):
        first = values[0]
        small = first.numel() * first.element_size() < STACK_BELOW_BYTES
        if small and all(v.shape == first.shape for v in values):
            return torch.stack([v.detach().cpu() for v in values])
    return NonTensorStack(*[_portable(v) for v in values])


def _portable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    return value


def _unpack(column: Any) -> list[Any]:
    """One fetched column as one value per row: nested/stacked tensors are unbound, other columns listed."""
    if isinstance(column, torch.Tensor):
        return list(column.unbind()) if column.is_nested else list(column.unbind(0))
    return list(column.tolist())


class TransferQueueBus(DataBus):
    """The data bus on TransferQueue. Construct one per process (it connects on first use to the TransferQueue and
    the ledger that :meth:`start` launched in the Ray session); buses with different ``scope`` are independent.

    ``lease_timeout``: seconds a fetched batch may stay unacked before its rows become fetchable again (None: never;
    fixed by the first bus of a scope). ``recheck_s``: how long a waiting fetch sleeps on the ledger's wake-up
    before it looks again anyway (a safety net: writes and lapsing leases wake it)."""

    def __init__(self, *, scope: str = "rollout", lease_timeout: float | None = 600.0, group_field: str = "group_id",
                 recheck_s: float = 2.0):
        if not scope or "/" in scope:
            raise DataBusError(f"scope must be a non-empty name without '/', got {scope!r}")
        self.scope = scope
        self.lease_timeout = lease_timeout
        self.group_field = group_field
        if not recheck_s > 0:
            raise DataBusError(f"recheck_s must be > 0, got {recheck_s!r}")
        self.recheck_s = recheck_s
        self._client: Any = None
        self._ledger_actor: Any = None
        self._connecting: asyncio.Lock | None = None
        self._system: System | None = None
        self._pending: set[asyncio.Future] = set()  # give-backs of leases granted to cancelled fetches
        self._stats = Stats()

    # ---------------------------------------------------------------------------------------------- start / stop
    @classmethod
    def start(cls, *, storage_units: int = 1, loopback: bool | None = None, storage_capacity: int | None = None,
              **bus_kwargs: Any) -> TransferQueueBus:
        """Start TransferQueue (controller + storage units, ``num_cpus=0``) and the ledger inside the running Ray
        session and return a bus that owns them: its :meth:`close` stops them. If they are already running, return a
        bus that only uses them. ``loopback`` (default: when the cluster has one node) binds them to 127.0.0.1."""
        import ray

        if not ray.is_initialized():
            raise DataBusError("TransferQueueBus.start needs a running Ray session (call ray.init first)")
        try:
            ray.get_actor(CONTROLLER_NAME, namespace=TQ_NAMESPACE)
            ray.get_actor(LEDGER_NAME, namespace=TQ_NAMESPACE)
            return cls(**bus_kwargs)
        except ValueError:
            pass
        bus = cls(**bus_kwargs)
        bus._system = start_system(storage_units, loopback, storage_capacity)
        return bus

    async def close(self) -> None:
        """Close this bus's connection; a bus returned by :meth:`start` also stops TransferQueue and the ledger."""
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            client.close()
        system, self._system = self._system, None
        if system is not None:
            await asyncio.to_thread(system.stop)

    # ---------------------------------------------------------------------------------------------- the contract
    async def open_partition(self, partition: int, *, expected_rows: int | None = None,
                             group_size: int | None = None) -> None:
        await self._call("open", check_partition(partition), expected_rows, group_size)

    async def put(self, partition: int, rows: list[dict[str, Any]], *,
                  media: Mapping[str, torch.Tensor] | None = None) -> None:
        ids, bodies = check_rows(partition, rows)
        media = check_media(partition, media)
        if not ids and not media:
            return
        clash = [sid for sid in ids if sid.startswith(MEDIA_ROW)]
        if clash:
            raise DataBusInputError(f"partition {partition}: sample_id {clash[0]!r} starts with {MEDIA_ROW!r}, which "
                                    f"names the partition's media on this bus")
        names = list(dict.fromkeys(k for b in bodies for k in b))
        dtypes = column_dtypes(partition, {n: [b[n] for b in bodies if n in b] for n in names})
        client = await self._connect()
        if ids:  # replace_unbound: a producer that died between registering these rows and writing them left them
            await self._call("register", partition, ids, [b.get(self.group_field) for b in bodies], dtypes,
                             self.group_field, replace_unbound=True)
        try:
            await self._put_media(client, partition, media)  # before the rows: their references must resolve
            if not ids:
                return
            meta = await client.async_kv_retrieve_meta(keys=ids, partition_id=self._pid(partition), create=True)
            # rows with the same fields go in one write; rows that lack some field get their own
            signatures: dict[tuple[str, ...], list[int]] = {}
            for i, body in enumerate(bodies):
                signatures.setdefault(tuple(body), []).append(i)
            for signature, positions in signatures.items():
                data = self._tensordict({n: [bodies[i][n] for i in positions] for n in signature}, len(positions))
                await client.async_put(data, metadata=meta.select_samples(positions))
            await self._call("bind", partition, ids, list(meta.global_indexes))
        except BaseException:
            if ids:
                await asyncio.shield(self._call("unregister", partition, ids))
            raise
        self._stats.add("puts")
        self._stats.add("rows", len(ids))
        self._stats.add("bytes_put", payload_bytes(bodies) + payload_bytes(ids))

    async def _put_media(self, client: Any, partition: int, media: dict[str, torch.Tensor]) -> None:
        """Write the media the partition does not store yet as rows ``media:<key>`` of one field, ``media``, that
        the ledger never registers (so no fetch counts or hands them out; see :mod:`.media`), then record them."""
        if not media:
            return
        new = await self._call("media_missing", partition, list(media))
        for key in media.keys() - set(new):
            self._stats.add("media_reused")
            self._stats.add("media_bytes_reused", tensor_bytes(media[key]))
        if not new:
            return
        meta = await client.async_kv_retrieve_meta(keys=[MEDIA_ROW + k for k in new], partition_id=self._pid(partition),
                                                   create=True)
        # each tensor inside a dict, as mm_inputs travels: a non-tensor value sent as its raw buffer, with its own
        # dtype and shape (a plain tensor column would be packed into one nested tensor of one dtype)
        await client.async_put(self._tensordict({MEDIA_FIELD: [{"tensor": media[k]} for k in new]}, len(new)),
                               metadata=meta)
        sizes = {k: tensor_bytes(media[k]) for k in new}
        await self._call("media_bind", partition, sizes)
        self._stats.add("media_put", len(new))
        self._stats.add("media_bytes_put", sum(sizes.values()))
        self._stats.add("bytes_put", sum(sizes.values()))

    async def get_media(self, partition: int, keys: list[str]) -> dict[str, torch.Tensor]:
        keys = check_media_keys(check_partition(partition), keys)
        client = await self._connect()
        await self._call("media_check", partition, keys)
        meta = await client.async_kv_retrieve_meta(keys=[MEDIA_ROW + k for k in keys], partition_id=self._pid(partition),
                                                   create=False)
        if meta.size != len(keys):
            raise DataBusError(f"partition {partition}: TransferQueue holds {meta.size} of the {len(keys)} media "
                               f"read (was the partition dropped meanwhile?)")
        data = await client.async_get_data(meta.select_fields([MEDIA_FIELD]))
        values = _unpack(dict(data.items())[MEDIA_FIELD])
        out = {k: v["tensor"] for k, v in zip(keys, values, strict=True)}
        self._stats.add("media_gets")
        self._stats.add("media_bytes_got", sum(tensor_bytes(t) for t in out.values()))
        return out

    async def put_fields(self, partition: int, sample_ids: list[str], fields: dict[str, list[Any]]) -> None:
        ids, columns = check_columns(partition, sample_ids, fields)
        client = await self._connect()
        await self._call("add_fields", partition, ids, column_dtypes(partition, columns))
        meta = await client.async_kv_retrieve_meta(keys=ids, partition_id=self._pid(partition), create=False)
        if meta.size != len(ids):
            raise DataBusError(f"partition {partition}: TransferQueue knows {meta.size} of the {len(ids)} rows "
                               f"put_fields names (was the partition dropped meanwhile?)")
        await client.async_put(self._tensordict(columns, len(ids)), metadata=meta)
        await self._call("touch", partition)  # wakes the fetches waiting for these fields
        self._stats.add("put_fields")
        self._stats.add("bytes_put", payload_bytes(columns))

    async def seal(self, partition: int, n_rows: int) -> None:
        await self._call("seal", check_partition(partition), n_rows)

    async def fetch(self, partition: int, task: str, fields: list[str], batch_size: int, *,
                    whole_groups: bool = False, timeout: float | None = None) -> BusBatch | None:
        need = check_fetch(partition, task, fields, batch_size, timeout)
        client = await self._connect()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        seen: int | None = None  # the ledger's change counter, read once the first look found nothing
        try:
            while True:
                ready = await self._ready_indexes(client, partition, need)
                pick = await self._pick(partition, task, batch_size, ready, whole_groups)
                if pick.verdict == BATCH:
                    assert pick.lease is not None
                    return await self._deliver(client, pick, partition, task, fields, need)
                now = time.monotonic()
                if pick.verdict == EXHAUSTED or (deadline is not None and now >= deadline):
                    self._stats.add("empty_fetches")
                    return None
                if seen is None:  # read the counter, then look once more: a write that landed after the first
                    seen = await self._changes(partition, -1, 0)  # look shows now, any later one bumps the counter
                    continue
                seen = await self._changes(partition, seen, self.recheck_s if deadline is None
                                           else min(self.recheck_s, deadline - now))
        finally:
            self._stats.add("fetch_wait_s", time.monotonic() - start)

    async def ack(self, batch: BusBatch) -> None:
        n = await self._call("ack", batch.lease_id, batch.partition, batch.task)
        self._stats.add("acks")
        self._stats.add("acked_rows", n)

    async def give_back(self, batch: BusBatch) -> None:
        self._stats.add("given_back", await self._call("give_back", batch.lease_id, batch.partition, batch.task))

    async def release_task(self, task: str, partition: int | None = None) -> int:
        n = await self._call("release_task", check_task(task), None if partition is None else check_partition(partition))
        self._stats.add("given_back", n)
        return n

    async def drop_partition(self, partition: int) -> None:
        client = await self._connect()
        await self._call("drop", check_partition(partition))
        await client.async_clear_partition(self._pid(partition))

    async def progress(self, partition: int, task: str | None = None) -> dict[str, Any]:
        """Row, seal and (for ``task``) acked/leased counts of one partition."""
        return await self._call("progress", check_partition(partition), task)

    def stats(self) -> dict[str, float]:
        return self._stats.snapshot()

    # ---------------------------------------------------------------------------------------------- internals
    def _pid(self, partition: int) -> str:
        return f"{self.scope}/step{partition}"

    @staticmethod
    def _tensordict(columns: dict[str, list[Any]], n: int) -> Any:
        from tensordict import TensorDict

        return TensorDict({name: _pack(values) for name, values in columns.items()}, batch_size=n)

    async def _changes(self, partition: int, seen: int, timeout: float) -> int:
        """The ledger's change counter of ``partition`` once it is not ``seen`` (or after ``timeout`` seconds)."""
        await self._connect()
        if seen >= 0:
            self._stats.add("waits")
        return await self._ledger_actor.wait_change.remote(self.scope, partition, seen, timeout)

    async def _ready_indexes(self, client: Any, partition: int, need: list[str]) -> list[int]:
        """Storage indexes of the rows that have every field in ``need`` (one controller request)."""
        self._stats.add("polls")
        indexes, status = await client.async_get_production_status(data_fields=need, partition_id=self._pid(partition))
        if indexes is None or status is None or status.numel() == 0:
            return []
        return indexes[status.bool().all(dim=1)].tolist()

    async def _pick(self, partition: int, task: str, batch_size: int, ready: list[int], whole_groups: bool) -> Pick:
        """Ask the ledger for a lease. If this fetch is cancelled while the answer travels, a lease that was granted
        anyway is given back as soon as it arrives, so the rows do not wait for the lease deadline."""
        call = asyncio.ensure_future(self._call("pick", partition, task, batch_size, ready_indexes=ready,
                                                whole_groups=whole_groups))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            def give_back_granted(done: asyncio.Future) -> None:
                if not done.cancelled() and done.exception() is None and done.result().lease is not None:
                    lease = done.result().lease
                    self._background(self._call("give_back", lease.lease_id, partition, task))

            call.add_done_callback(give_back_granted)
            raise

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _deliver(self, client: Any, pick: Pick, partition: int, task: str, fields: list[str],
                       need: list[str]) -> BusBatch:
        lease = pick.lease
        assert lease is not None
        ids = list(lease.sample_ids)
        try:
            meta = await client.async_kv_retrieve_meta(keys=ids, partition_id=self._pid(partition), create=False)
            if meta.size != len(ids):
                raise DataBusError(f"partition {partition}: {len(ids) - meta.size} leased rows vanished from "
                                   f"TransferQueue (was the partition dropped meanwhile?)")
            data = await client.async_get_data(meta.select_fields(need))
            got = dict(data.items())
            missing = [f for f in need if f not in got]
            if missing:
                raise DataBusError(f"partition {partition}: TransferQueue returned no {missing} for task {task!r}")
            columns = {f: (list(ids) if f == SAMPLE_ID else _unpack(got[f])) for f in dict.fromkeys(fields)}
        except BaseException:
            await asyncio.shield(self._call("give_back", lease.lease_id, partition, task))
            raise
        self._stats.add("fetches")
        self._stats.add("fetched_rows", len(ids))
        return BusBatch(partition, task, ids, columns, lease.lease_id)

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        await self._connect()
        reply = await self._ledger_actor.call.remote(self.scope, self.lease_timeout, method, args, kwargs)
        if reply[0] == "ok":
            return reply[1]
        raise ERRORS.get(reply[1], DataBusError)(reply[2])

    async def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._client is None:
                self._client, self._ledger_actor = await asyncio.to_thread(connect_client)
        return self._client


