"""The trainer's data bus: rollout data flowing between roles as columns of per-step partitions.

One partition per rollout step (key: the int step), one row per episode (key: a unique string ``sample_id``), one
column per field. Env workers ``put`` new rows (``input_ids, loss_mask, rollout_logprobs, mm, reward, group_id,
policy_version, status, ...``); later roles ``put_fields`` new columns onto existing rows (``ref_logprobs``,
``old_logprobs``, ``advantages``). A consumer task ("reference", "actor", ...) ``fetch``-es the fields it needs in
micro-batches as soon as enough rows have all of them:

- each row goes to each task once: a fetch leases its rows; ``ack`` settles them, ``give_back`` (or
  ``release_task`` for a consumer that died, or a lease left unacked past ``lease_timeout``) makes them fetchable
  again for that task — no row lost, none delivered twice to live consumers, checkable by ``sample_id``;
- ``whole_groups=True`` hands out complete groups of the partition's ``group_size`` (by the ``group_id`` field);
- once the producer has ``seal``-ed the partition with its final row count, a smaller last batch is returned instead
  of waiting, and ``None`` once everything is acked or out on a lease for that task; ``timeout`` bounds the wait;
- tensors come back as one plain tensor per row (lengths may differ), dict fields such as ``mm`` as one dict of
  tensors per row, bit-identical with the same dtypes; Python scalars stay Python values (tuples become lists).
- media shared by several rows (a group's video) go with a put once, by key (``put(rows, media={key: tensor})``;
  a key the partition already stores is not written again), and are read back by key (``get_media``); they are
  not rows: no sample id, not counted by ``expected_rows``, a seal or a group, never fetched, dropped with the
  partition (see :mod:`.media`).

Two implementations keep one contract: :class:`InProcessBus` (asyncio, one process — unit tests) and
:class:`TransferQueueBus` (TransferQueue + a shared ledger actor in the Ray session; see its module for how it works
around TransferQueue's limits). Pick one with :func:`make_bus`.
"""

from __future__ import annotations

from typing import Any, Literal

from relax_gym.trainer.databus.protocol import (
    SAMPLE_ID,
    BusBatch,
    DataBus,
    DataBusError,
    DataBusInputError,
    DuplicateRowError,
    LeaseError,
)
from relax_gym.trainer.databus.tq import TransferQueueBus
from relax_gym.trainer.databus.twin import InProcessBus

__all__ = [
    "SAMPLE_ID",
    "BusBatch",
    "DataBus",
    "DataBusError",
    "DataBusInputError",
    "DuplicateRowError",
    "InProcessBus",
    "LeaseError",
    "TransferQueueBus",
    "make_bus",
]


def make_bus(kind: Literal["inprocess", "transferqueue"], **kw: Any) -> DataBus:
    """Build a bus. ``inprocess`` takes ``lease_timeout`` and ``group_field``; ``transferqueue`` also ``scope``,
    ``recheck_s`` and ``start=True`` to launch TransferQueue in the running Ray session (plus
    ``storage_units``, ``loopback``, ``storage_capacity``; see :meth:`TransferQueueBus.start`)."""
    if kind == "inprocess":
        return InProcessBus(**kw)
    if kind == "transferqueue":
        if kw.pop("start", False):
            return TransferQueueBus.start(**kw)
        return TransferQueueBus(**kw)
    raise DataBusInputError(f"unknown data bus kind {kind!r}; choose 'inprocess' or 'transferqueue'")
