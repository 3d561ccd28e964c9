"""The delivery ledger both data-bus implementations keep: who holds what.

The ledger is the bus's memory of *who holds what*. It knows every row of every partition (by ``sample_id``, in put
order, with its group), the partition's declaration (expected rows, group size) and seal, and for each consumer task
which rows it has acknowledged and which rows are out on a lease. Given the rows that are ready for a task (all
requested fields written), :meth:`DeliveryLedger.pick` decides what one fetch gets — a full micro-batch, whole
groups, a tail batch of a sealed partition, nothing yet, or nothing ever again — and leases it. Acks make rows done
for that task; give-backs, released tasks and overdue leases make them fetchable again. Every row is therefore handed
to a task until one lease of it is acknowledged, and never to two live leases at once.

The in-process twin holds a ledger directly; the TransferQueue bus keeps one inside a small Ray actor so that every
process (producers, consumers, the controller releasing a dead consumer's leases) sees the same state. The ledger is
plain synchronous Python: each call is atomic where it runs.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from relax_gym.trainer.databus.checks import group_key
from relax_gym.trainer.databus.protocol import (
    DataBusInputError,
    DuplicateRowError,
    LeaseError,
)


@dataclass
class Lease:
    lease_id: str
    partition: int
    task: str
    sample_ids: list[str]
    deadline: float | None


@dataclass
class Pick:
    """The ledger's answer to one fetch attempt: a lease, or ``wait`` (maybe later), or ``exhausted`` (never)."""

    verdict: str
    lease: Lease | None = None


WAIT, EXHAUSTED, BATCH = "wait", "exhausted", "batch"


@dataclass
class _Row:
    seq: int
    group: Hashable | None
    index: int | None


@dataclass
class _Partition:
    expected_rows: int | None = None
    group_size: int | None = None
    sealed: int | None = None
    rows: dict[str, _Row] = field(default_factory=dict)
    by_index: dict[int, str] = field(default_factory=dict)
    groups: dict[Hashable, list[str]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)  # field -> the dtype of its tensors
    acked: dict[str, set[str]] = field(default_factory=dict)  # task -> sample ids done
    leased: dict[str, dict[str, str]] = field(default_factory=dict)  # task -> sample id -> lease id
    next_seq: int = 0
    media: dict[str, int] = field(default_factory=dict)  # stored media key -> its bytes (not rows: see media_*)


class DeliveryLedger:
    """Rows, declarations, seals and leases of every partition of one bus (see the module docstring)."""

    def __init__(self, lease_timeout: float | None = 600.0, clock: Callable[[], float] = time.monotonic):
        if lease_timeout is not None and lease_timeout <= 0:
            raise DataBusInputError(f"lease_timeout must be None or > 0 seconds, got {lease_timeout!r}")
        self.lease_timeout = lease_timeout
        self._clock = clock
        self._parts: dict[int, _Partition] = {}
        self._dropped: set[int] = set()
        self._leases: dict[str, Lease] = {}
        self._lapsed: OrderedDict[str, Lease] = OrderedDict()  # overdue leases, kept so a late ack can be judged
        self._closed: OrderedDict[str, str] = OrderedDict()  # lease id -> how it ended (for clear errors)

    # ---- partitions
    def _part(self, partition: int, *, create: bool) -> _Partition | None:
        if partition in self._dropped:
            raise DataBusInputError(f"partition {partition} was dropped; it takes no more rows or fetches")
        part = self._parts.get(partition)
        if part is None and create:
            part = self._parts[partition] = _Partition()
        return part

    def open(self, partition: int, expected_rows: int | None = None, group_size: int | None = None) -> None:
        for name, value in (("expected_rows", expected_rows), ("group_size", group_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise DataBusInputError(f"partition {partition}: {name} must be a positive int, got {value!r}")
        part = self._part(partition, create=True)
        assert part is not None
        for name, value in (("expected_rows", expected_rows), ("group_size", group_size)):
            old = getattr(part, name)
            if value is not None and old is not None and old != value:
                raise DataBusInputError(f"partition {partition}: opened again with {name}={value}, was {old}")
        if expected_rows is not None and len(part.rows) > expected_rows:
            raise DataBusInputError(
                f"partition {partition}: expected_rows={expected_rows} but {len(part.rows)} rows are already in")
        if expected_rows is not None and part.sealed is not None and part.sealed > expected_rows:
            raise DataBusInputError(
                f"partition {partition}: expected_rows={expected_rows} is below its seal at {part.sealed} rows")
        if group_size is not None:
            ungrouped = [sid for sid, row in part.rows.items() if row.group is None]
            if ungrouped:
                raise DataBusInputError(f"partition {partition}: group_size={group_size} declared but row "
                                        f"{ungrouped[0]!r} was put without a group")
            for g, members in part.groups.items():
                if len(members) > group_size:
                    raise DataBusInputError(
                        f"partition {partition}: group {g!r} already has {len(members)} rows > group_size {group_size}")
        part.expected_rows = expected_rows if expected_rows is not None else part.expected_rows
        part.group_size = group_size if group_size is not None else part.group_size

    def register(self, partition: int, sample_ids: list[str], groups: list[Any] | None = None,
                 dtypes: dict[str, str] | None = None, group_field: str = "group_id", *,
                 replace_unbound: bool = False) -> None:
        """Record new rows (all or nothing). ``groups[i]`` is row i's group value or None when it has none;
        ``dtypes`` the tensor dtype of each field the rows carry (see :func:`column_dtypes`). With
        ``replace_unbound``, rows registered before but never bound to storage (their producer died between
        registering and writing them) are forgotten first, so the retried put goes through."""
        part = self._part(partition, create=True)
        assert part is not None
        self._check_dtypes(partition, part, dtypes or {})
        if replace_unbound:
            self.unregister(partition, [s for s in sample_ids if s in part.rows and part.rows[s].index is None])
        for sid in sample_ids:
            if sid in part.rows:
                raise DuplicateRowError(f"partition {partition}: duplicate sample_id {sid!r} (already put)")
        total = len(part.rows) + len(sample_ids)
        if part.sealed is not None and total > part.sealed:
            raise DataBusInputError(
                f"partition {partition} is sealed at {part.sealed} rows; {len(sample_ids)} more would make {total}")
        if part.expected_rows is not None and total > part.expected_rows:
            raise DataBusInputError(
                f"partition {partition} expects {part.expected_rows} rows; {len(sample_ids)} more would make {total}")
        keys: list[Hashable | None] = []
        growth: dict[Hashable, int] = {}
        for i, sid in enumerate(sample_ids):
            value = groups[i] if groups is not None else None
            if value is None:
                if part.group_size is not None:
                    raise DataBusInputError(f"partition {partition} declares group_size={part.group_size} but row "
                                            f"{sid!r} has no {group_field!r}")
                keys.append(None)
                continue
            key = group_key(partition, sid, value)
            growth[key] = growth.get(key, 0) + 1
            size = len(part.groups.get(key, ())) + growth[key]
            if part.group_size is not None and size > part.group_size:
                raise DataBusInputError(
                    f"partition {partition}: group {key!r} would have {size} rows, more than group_size "
                    f"{part.group_size}")
            keys.append(key)
        for i, sid in enumerate(sample_ids):
            part.rows[sid] = _Row(part.next_seq, keys[i], None)
            part.next_seq += 1
            if keys[i] is not None:
                part.groups.setdefault(keys[i], []).append(sid)
        part.dtypes.update(dtypes or {})

    def bind(self, partition: int, sample_ids: list[str], indexes: list[int]) -> None:
        """Attach storage indexes to rows, so that ``pick`` can be told what is ready by index."""
        part = self._part(partition, create=False)
        if part is None:
            return
        for sid, index in zip(sample_ids, indexes, strict=True):
            row = part.rows.get(sid)
            if row is not None:
                row.index = index
                part.by_index[index] = sid

    def add_fields(self, partition: int, sample_ids: list[str], dtypes: dict[str, str] | None = None) -> None:
        """Check that new columns go to rows that exist, with the dtypes their fields already hold."""
        part = self._part(partition, create=False)
        missing = [sid for sid in sample_ids if part is None or sid not in part.rows]
        if missing:
            shown = ", ".join(repr(s) for s in missing[:5])
            shown += f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise DataBusInputError(f"partition {partition}: put_fields names rows that were never put: {shown}")
        assert part is not None
        self._check_dtypes(partition, part, dtypes or {})
        part.dtypes.update(dtypes or {})

    def unregister(self, partition: int, sample_ids: list[str]) -> None:
        """Forget rows whose data never got written (a failed put), so that the put can be retried."""
        part = self._parts.get(partition)
        if part is None:
            return
        for sid in sample_ids:
            row = part.rows.pop(sid, None)
            if row is None:
                continue
            if row.index is not None:
                part.by_index.pop(row.index, None)
            if row.group is not None:
                members = part.groups.get(row.group, [])
                if sid in members:
                    members.remove(sid)
                if not members:
                    part.groups.pop(row.group, None)

    def seal(self, partition: int, n_rows: int) -> None:
        if isinstance(n_rows, bool) or not isinstance(n_rows, int) or n_rows < 0:
            raise DataBusInputError(f"partition {partition}: seal needs a row count >= 0, got {n_rows!r}")
        part = self._part(partition, create=True)
        assert part is not None
        if part.sealed is not None and part.sealed != n_rows:
            raise DataBusInputError(f"partition {partition} is already sealed at {part.sealed} rows, not {n_rows}")
        if len(part.rows) > n_rows:
            raise DataBusInputError(
                f"partition {partition} already holds {len(part.rows)} rows; cannot seal at {n_rows}")
        if part.expected_rows is not None and n_rows > part.expected_rows:
            raise DataBusInputError(f"partition {partition}: seal at {n_rows} rows exceeds expected_rows "
                                    f"{part.expected_rows}")
        part.sealed = n_rows

    def drop(self, partition: int) -> int:
        """Forget a partition and its leases; later puts and fetches on it are errors. Returns its row count."""
        part = self._parts.pop(partition, None)
        self._dropped.add(partition)
        for lease_id in [k for k, v in self._leases.items() if v.partition == partition]:
            self._close(self._leases.pop(lease_id), "its partition was dropped")
        for lease_id in [k for k, v in self._lapsed.items() if v.partition == partition]:
            self._lapsed.pop(lease_id)
        return len(part.rows) if part is not None else 0

    # ---- media (tensors stored once per partition by key; not rows: no sample id, never counted or fetched)
    def media_missing(self, partition: int, keys: list[str]) -> list[str]:
        """The ``keys`` the partition does not store yet (a put writes only those). Opens the partition, as a put
        does; refused on a dropped one."""
        part = self._part(partition, create=True)
        assert part is not None
        return [k for k in dict.fromkeys(keys) if k not in part.media]

    def media_bind(self, partition: int, sizes: dict[str, int]) -> None:
        """Record media keys whose tensors have landed in storage (``sizes``: key -> bytes), so that later puts
        skip them and reads find them."""
        part = self._part(partition, create=True)
        assert part is not None
        part.media.update(sizes)

    def media_check(self, partition: int, keys: list[str]) -> None:
        """Refuse a read of media keys the partition does not store, naming the partition and the first keys."""
        part = self._part(partition, create=False)
        unknown = [k for k in keys if part is None or k not in part.media]
        if unknown:
            shown = ", ".join(repr(k) for k in unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
            raise DataBusInputError(f"partition {partition} stores no media under {shown}")

    # ---- delivery
    def pick(self, partition: int, task: str, batch_size: int, *, ready_ids: Iterable[str] | None = None,
             ready_indexes: Iterable[int] | None = None, whole_groups: bool = False) -> Pick:
        """Lease what one fetch of ``task`` gets, given the rows whose requested fields are all written."""
        self.expire()
        part = self._part(partition, create=False)
        if part is None:
            return Pick(WAIT)  # nobody has opened or written it yet
        if whole_groups and part.group_size is None:
            raise DataBusInputError(f"partition {partition}: task {task!r} wants whole groups but the partition has no "
                                    f"group_size (pass group_size to open_partition)")
        if whole_groups and batch_size < part.group_size:
            raise DataBusInputError(f"partition {partition}: batch_size {batch_size} is smaller than one group "
                                    f"({part.group_size} rows)")
        acked = part.acked.setdefault(task, set())
        leased = part.leased.setdefault(task, {})
        ids = list(ready_ids or ())
        ids += [part.by_index[i] for i in (ready_indexes or ()) if i in part.by_index]
        free = sorted({s for s in ids if s in part.rows and s not in acked and s not in leased},
                      key=lambda s: part.rows[s].seq)
        unowned = None if part.sealed is None else part.sealed - len(acked) - len(leased)
        final = unowned is not None and len(free) == unowned  # nothing else can ever become fetchable
        if final and unowned == 0:
            return Pick(EXHAUSTED)
        chosen: list[str] = []
        if not whole_groups:
            if len(free) >= batch_size or final:
                chosen = free[:batch_size]
        else:
            assert part.group_size is not None
            k = batch_size // part.group_size
            groups: dict[Hashable, list[str]] = {}
            for sid in free:
                groups.setdefault(part.rows[sid].group, []).append(sid)
            complete = [m for m in groups.values() if len(m) == part.group_size]
            if len(complete) >= k:
                chosen = [s for m in complete[:k] for s in m]
            elif final:  # groups the producer left short are delivered as they are once nothing else can come
                chosen = [s for m in list(groups.values())[:k] for s in m]
        if not chosen:
            return Pick(WAIT)
        deadline = None if self.lease_timeout is None else self._clock() + self.lease_timeout
        lease = Lease(uuid.uuid4().hex, partition, task, chosen, deadline)
        self._leases[lease.lease_id] = lease
        for sid in chosen:
            leased[sid] = lease.lease_id
        return Pick(BATCH, lease)

    def ack(self, lease_id: str, partition: int, task: str) -> int:
        self.expire()
        lease = self._leases.get(lease_id)
        lapsed = lease is None
        if lapsed:
            lease = self._lapsed.get(lease_id)
        if lease is None:
            raise LeaseError(f"partition {partition}: lease {lease_id} of task {task!r} is not outstanding "
                             f"({self._closed.get(lease_id, 'unknown lease')})")
        self._check_owner(lease, partition, task)
        part = self._parts[lease.partition]  # dropping a partition ends its leases, so it is still here
        acked = part.acked.setdefault(task, set())
        if lapsed:
            if (acked | part.leased.get(task, {}).keys()) & set(lease.sample_ids):
                raise LeaseError(f"partition {partition}: lease {lease_id} of task {task!r} ran past its deadline "
                                 f"and its rows were handed out again; this ack is refused")
            del self._lapsed[lease_id]
        else:
            del self._leases[lease_id]
            self._release_rows(lease)
        acked.update(lease.sample_ids)
        self._close(lease, "already acked")
        return len(lease.sample_ids)

    def give_back(self, lease_id: str, partition: int, task: str) -> int:
        self.expire()
        lease = self._leases.get(lease_id)
        if lease is None:
            lapsed = self._lapsed.pop(lease_id, None)
            if lapsed is not None:
                self._close(lapsed, "given back after it ran out")
                return 0  # its rows were made fetchable again when it ran out
            raise LeaseError(f"partition {partition}: lease {lease_id} of task {task!r} is not outstanding "
                             f"({self._closed.get(lease_id, 'unknown lease')})")
        self._check_owner(lease, partition, task)
        del self._leases[lease_id]
        self._release_rows(lease)
        self._close(lease, "already given back")
        return len(lease.sample_ids)

    def release_task(self, task: str, partition: int | None = None) -> int:
        self.expire()
        given = 0
        for lease_id in [k for k, v in self._leases.items() if v.task == task and partition in (None, v.partition)]:
            lease = self._leases.pop(lease_id)
            self._release_rows(lease)
            self._close(lease, f"released with task {task!r}")
            given += len(lease.sample_ids)
        return given

    def expire(self) -> int:
        """Make the rows of overdue leases fetchable again; returns how many rows that freed."""
        now = self._clock()
        freed = 0
        for lease_id in [k for k, v in self._leases.items() if v.deadline is not None and v.deadline <= now]:
            lease = self._leases.pop(lease_id)
            self._release_rows(lease)
            self._lapsed[lease_id] = lease
            while len(self._lapsed) > 10_000:
                self._lapsed.popitem(last=False)
            freed += len(lease.sample_ids)
        return freed

    def next_deadline(self) -> float | None:
        deadlines = [v.deadline for v in self._leases.values() if v.deadline is not None]
        return min(deadlines) if deadlines else None

    def seconds_to_next_deadline(self) -> float | None:
        """How long until the next lease runs out (0 if one is overdue; None: no lease can run out)."""
        deadline = self.next_deadline()
        return None if deadline is None else max(0.0, deadline - self._clock())

    def progress(self, partition: int, task: str | None = None) -> dict[str, Any]:
        """Counts for one partition (and one task): rows, sealed, expected, acked, leased."""
        part = self._parts.get(partition)
        if part is None:
            return {"rows": 0, "sealed": None, "expected_rows": None, "group_size": None, "dropped":
                    partition in self._dropped, "acked": 0, "leased": 0, "media": 0, "media_bytes": 0}
        out: dict[str, Any] = {"rows": len(part.rows), "sealed": part.sealed, "expected_rows": part.expected_rows,
                               "group_size": part.group_size, "dropped": False, "media": len(part.media),
                               "media_bytes": sum(part.media.values())}
        if task is not None:
            out["acked"] = len(part.acked.get(task, ()))
            out["leased"] = len(part.leased.get(task, {}))
        return out

    def acked_ids(self, partition: int, task: str) -> set[str]:
        part = self._parts.get(partition)
        return set(part.acked.get(task, ())) if part else set()

    # ---- helpers
    @staticmethod
    def _check_dtypes(partition: int, part: _Partition, dtypes: dict[str, str]) -> None:
        for name, dtype in dtypes.items():
            old = part.dtypes.get(name)
            if old is not None and old != dtype:
                raise DataBusInputError(f"partition {partition}: field {name!r} holds {old} tensors; got {dtype}")

    def _release_rows(self, lease: Lease) -> None:
        part = self._parts.get(lease.partition)
        if part is None:
            return
        leased = part.leased.get(lease.task, {})
        for sid in lease.sample_ids:
            if leased.get(sid) == lease.lease_id:
                del leased[sid]

    def _close(self, lease: Lease, how: str) -> None:
        self._closed[lease.lease_id] = how
        while len(self._closed) > 10_000:
            self._closed.popitem(last=False)

    @staticmethod
    def _check_owner(lease: Lease, partition: int, task: str) -> None:
        if lease.partition != partition or lease.task != task:
            raise LeaseError(f"lease {lease.lease_id} belongs to task {lease.task!r} on partition {lease.partition}, "
                             f"not task {task!r} on partition {partition}")


class Stats:
    """Per-bus-instance counters behind ``DataBus.stats()``."""

    KEYS = ("puts", "rows", "put_fields", "fetches", "fetched_rows", "empty_fetches", "acks", "acked_rows",
            "given_back", "fetch_wait_s", "polls", "waits", "bytes_put", "media_put", "media_bytes_put", "media_reused",
            "media_bytes_reused", "media_gets", "media_bytes_got")

    def __init__(self) -> None:
        self._v = dict.fromkeys(self.KEYS, 0.0)

    def add(self, key: str, value: float = 1.0) -> None:
        self._v[key] += value

    def snapshot(self) -> dict[str, float]:
        return dict(self._v)
