"""The data bus contract: the batch type, the errors and the :class:`DataBus` protocol both implementations
(the in-process twin and the TransferQueue adapter) satisfy; the contract suite in tests/trainer/databus/test_databus.py runs on both."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

SAMPLE_ID = "sample_id"


class DataBusError(Exception):
    """Base class of the errors the data bus raises on purpose."""


class DataBusInputError(DataBusError, ValueError):
    """A call named a bad partition, row, field, size or task; the message names the culprit."""


class LeaseError(DataBusError):
    """An ack or give-back named a lease that is not (or no longer) outstanding."""


class DuplicateRowError(DataBusInputError):
    """A put named a sample id that is already on the partition (e.g. a retried producer whose first put landed)."""


ERRORS: dict[str, type[DataBusError]] = {c.__name__: c for c in (DataBusError, DataBusInputError, LeaseError,
                                                                 DuplicateRowError)}


@dataclass
class BusBatch:
    """One micro-batch handed to a consumer task: columns of the requested fields, row-aligned with ``sample_ids``.

    Tensor fields come back as one plain tensor per row (lengths may differ), scalars as Python values, dict fields
    (``mm``) as one dict per row. ``lease_id`` identifies the delivery; pass the batch to ``ack`` once processed or
    to ``give_back`` to let another fetch of the same task have the rows."""

    partition: int
    task: str
    sample_ids: list[str]
    fields: dict[str, list[Any]]
    lease_id: str

    def __len__(self) -> int:
        return len(self.sample_ids)


@runtime_checkable
class DataBus(Protocol):
    """What roles use. Every method but ``stats`` is a coroutine; errors on bad input name the partition and the
    field, row or lease at fault (:class:`DataBusInputError`, :class:`LeaseError`)."""

    async def open_partition(self, partition: int, *, expected_rows: int | None = None,
                             group_size: int | None = None) -> None:
        """Declare a partition: at most ``expected_rows`` rows, groups of ``group_size`` (needed for whole-group
        fetches; rows must then carry the group field). Idempotent; ``put`` also opens a partition implicitly."""

    async def put(self, partition: int, rows: list[dict[str, Any]], *,
                  media: Mapping[str, torch.Tensor] | None = None) -> None:
        """Add new rows; each has a unique ``sample_id`` and at least one field. ``media``: tensors by key that the
        rows reference (e.g. a group's shared video), stored once per partition (a key already there is not written
        again) and before the rows, so a fetched row's references always resolve. Media are not rows: they have no
        sample id, count for no ``expected_rows``, seal or group, are never fetched, and go with the partition."""

    async def put_fields(self, partition: int, sample_ids: list[str], fields: dict[str, list[Any]]) -> None:
        """Add (or overwrite) columns of existing rows; ``fields[name][i]`` belongs to ``sample_ids[i]``."""

    async def seal(self, partition: int, n_rows: int) -> None:
        """Declare the final row count: no more rows will come."""

    async def fetch(self, partition: int, task: str, fields: list[str], batch_size: int, *,
                    whole_groups: bool = False, timeout: float | None = None) -> BusBatch | None:
        """Lease up to ``batch_size`` rows that have all ``fields`` and that ``task`` has not had (or got back).
        Returns None on timeout or when the sealed partition has nothing left for the task."""

    async def get_media(self, partition: int, keys: list[str]) -> dict[str, torch.Tensor]:
        """Read stored media tensors by key (read-only; bit-identical to what was put). A key the partition does
        not store is a :class:`DataBusInputError` naming it."""

    async def ack(self, batch: BusBatch) -> None:
        """The batch is processed: its rows are done for its task."""

    async def give_back(self, batch: BusBatch) -> None:
        """The batch was not processed: its rows become fetchable again for its task."""

    async def release_task(self, task: str, partition: int | None = None) -> int:
        """Give back every unacked lease of ``task`` (its consumer died), only those on ``partition`` when given;
        returns the number of rows given back."""

    async def drop_partition(self, partition: int) -> None:
        """Delete a partition's rows and leases; later puts and fetches on it are errors."""

    def stats(self) -> dict[str, float]:
        """This instance's counters: puts, rows (rows put), put_fields, fetches, fetched_rows, empty_fetches, acks,
        acked_rows, given_back (rows), fetch_wait_s, polls (readiness reads), waits (sleeps on a wake-up);
        bytes_put (payload bytes of rows, columns and media put), media_put / media_bytes_put (tensors written),
        media_reused / media_bytes_reused (already stored: not written again), media_gets / media_bytes_got."""

    async def close(self) -> None:
        """Release this instance's resources."""
