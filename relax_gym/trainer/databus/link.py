"""How every process of an async run reaches the same data bus.

A :class:`BusLink` is small and picklable: the controller makes one and passes it to each role's constructor, and
``link.connect()`` inside the replica returns a :class:`~relax_gym.trainer.databus.DataBus`:

- ``transferqueue``: TransferQueue's controller and storage actors are started once by the controller
  (``make_bus("transferqueue", ...)``); replicas connect to them with the same options.
- ``hosted``: one :class:`~relax_gym.trainer.databus.InProcessBus` lives in a Ray actor (:class:`BusHost`) and
  every process talks to it through :class:`RemoteBus`, a DataBus whose methods are actor calls. Quick to start
  (no TransferQueue actors), for tests and small runs; the same code paths as TransferQueue otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BusHost", "BusLink", "RemoteBus"]


@dataclass(frozen=True)
class BusLink:
    kind: Literal["transferqueue", "hosted"]
    host: Any = None  # the BusHost actor handle (hosted)
    options: dict[str, Any] = field(default_factory=dict)  # make_bus keyword arguments (transferqueue)

    def connect(self) -> Any:
        if self.kind == "hosted":
            if self.host is None:
                raise ValueError("a hosted bus link needs the BusHost actor handle")
            return RemoteBus(self.host)
        from relax_gym.trainer.databus import make_bus

        return make_bus(self.kind, **self.options)


class BusHost:
    """The Ray actor (async, so waiting fetches do not block puts) that owns an in-process bus."""

    def __init__(self, **options: Any) -> None:
        from relax_gym.trainer.databus import make_bus

        self.bus = make_bus("inprocess", **options)

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await getattr(self.bus, method)(*args, **kwargs)

    def stats(self) -> dict[str, float]:
        return self.bus.stats()


class RemoteBus:
    """A DataBus whose every method is a call on a :class:`BusHost` actor."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self._last_stats: dict[str, float] = {}

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.host.call.remote(method, *args, **kwargs)

    async def open_partition(self, partition: int, *, expected_rows: int | None = None, group_size: int | None = None) -> None:
        await self._call("open_partition", partition, expected_rows=expected_rows, group_size=group_size)

    async def put(self, partition: int, rows: list[dict[str, Any]], *, media: dict[str, Any] | None = None) -> None:
        await self._call("put", partition, rows, media=media)

    async def get_media(self, partition: int, keys: list[str]) -> dict[str, Any]:
        return await self._call("get_media", partition, keys)

    async def put_fields(self, partition: int, sample_ids: list[str], fields: dict[str, list[Any]]) -> None:
        await self._call("put_fields", partition, sample_ids, fields)

    async def seal(self, partition: int, n_rows: int) -> None:
        await self._call("seal", partition, n_rows)

    async def fetch(self, partition: int, task: str, fields: list[str], batch_size: int, *, whole_groups: bool = False,
                    timeout: float | None = None) -> Any:
        return await self._call("fetch", partition, task, fields, batch_size, whole_groups=whole_groups, timeout=timeout)

    async def ack(self, batch: Any) -> None:
        await self._call("ack", batch)

    async def give_back(self, batch: Any) -> None:
        await self._call("give_back", batch)

    async def release_task(self, task: str, partition: int | None = None) -> int:
        return await self._call("release_task", task, partition)

    async def drop_partition(self, partition: int) -> None:
        await self._call("drop_partition", partition)

    async def refresh_stats(self) -> dict[str, float]:
        self._last_stats = await self.host.stats.remote()
        return self._last_stats

    def stats(self) -> dict[str, float]:
        """The host's counters as of the last :meth:`refresh_stats` (a sync method cannot wait for the actor)."""
        return dict(self._last_stats)

    async def close(self) -> None:
        """The host owns the bus; closing a link closes nothing (the controller ends the host)."""
