"""``nccl`` with ``disk`` as the fallback: the transport a real SGLang engine is pushed to.

SGLang receives weights over a weight-update group (``/init_weights_update_group`` +
``/update_weights_from_distributed``, NCCL between GPUs) or from safetensors files (``/update_weights_from_disk``).
:class:`NcclOrDiskTransport` pushes over NCCL while it can and switches to disk for good when it cannot:

- the actor process has no CUDA / no NCCL (the NCCL transport cannot even be built), or
- the group does not form (an engine refuses ``/init_weights_update_group`` or never joins; no tensor moved yet).

A failure after tensors started moving is not hidden: it is raised as the DCS reports it (the engines may hold a
mix of old and new tensors, see :mod:`relax_gym.trainer.dcs.client`). After a switch, pushes stage their shards
before the engines pause, as the ``disk`` transport always does. The group is formed before the engines pause, so
the push that switches writes its shards before the pause too (only a group lost between stage and load makes
that push write them while the engines are paused). :attr:`NcclOrDiskTransport.name` says which transport is active (``PushReport.transport``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relax_gym.trainer.dcs.coordinator import Bucket, Version
from relax_gym.trainer.dcs.errors import DCSEngineError
from relax_gym.trainer.dcs.transports import DiskTransport, Items, NcclTransport, Transport

if TYPE_CHECKING:
    from relax_gym.trainer.dcs.link import EngineLink

__all__ = ["NcclOrDiskTransport"]

logger = logging.getLogger(__name__)

# engine steps that fail before any tensor is broadcast: safe to redo the whole push from disk
_GROUP_STEPS = frozenset({"init_weights_update_group", "get_server_info"})


class NcclOrDiskTransport(Transport):
    """NCCL broadcast, or safetensors shards in ``disk_dir`` once NCCL proved unusable (see the module doc).
    ``nccl_factory`` builds the primary transport (default :class:`NcclTransport`; tests pass another
    distributed transport); any exception it raises means "no NCCL here"."""

    def __init__(self, *, disk_dir: str | Path | None = None, flatten: bool | None = None,
                 master_address: str | None = None, group_timeout_s: float = 120.0,
                 nccl_factory: Callable[[], Transport] | None = None) -> None:
        self._disk_dir = disk_dir
        self._disk: DiskTransport | None = None
        self.reason: str | None = None  # why the push moved to disk (None while NCCL is used)
        factory = nccl_factory or (lambda: NcclTransport(flatten=flatten, master_address=master_address,
                                                         group_timeout_s=group_timeout_s))
        self._primary: Transport | None
        try:
            self._primary = factory()
        except Exception as exc:  # noqa: BLE001 - no CUDA / no NCCL in this process: disk from the start
            self._primary = None
            self._switch(f"{type(exc).__name__}: {exc}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return self._primary.name if self._primary is not None else "disk"

    @property
    def active(self) -> Transport:
        return self._primary if self._primary is not None else self._disk_transport()

    def stage(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version, *,
              epoch: int, pool: ThreadPoolExecutor) -> Any:
        """The active transport's stage; a group that does not form here (where the group is built before the
        engines pause) switches to disk at once, and the shards are written while the engines still generate."""
        if self._primary is None:
            return self._disk_transport().stage(links, items, buckets, version)
        primary = self._primary
        try:
            return primary.stage(links, items, buckets, version, epoch=epoch, pool=pool)
        except DCSEngineError as exc:
            if exc.step not in _GROUP_STEPS:
                raise
            self._give_up(primary, links, exc)
        return self._disk_transport().stage(links, items, buckets, version)

    def load(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version,
             staged: Any, *, epoch: int, pool: ThreadPoolExecutor) -> int:
        if self._primary is None:
            return self._disk_transport().load(links, items, buckets, version, staged, epoch=epoch, pool=pool)
        primary = self._primary
        try:
            return primary.load(links, items, buckets, version, staged, epoch=epoch, pool=pool)
        except DCSEngineError as exc:
            if exc.step not in _GROUP_STEPS:
                raise
            self._give_up(primary, links, exc)
        disk = self._disk_transport()
        staged = disk.stage(links, items, buckets, version)  # the engines are paused: this one push pays for the write
        try:
            sent = disk.load(links, items, buckets, version, staged, epoch=epoch, pool=pool)
        except BaseException:
            disk.discard(staged)
            raise
        self._switched_staging = staged
        return sent

    def committed(self, staged: Any) -> None:
        self.active.committed(self._take_switched(staged))

    def discard(self, staged: Any) -> None:
        self.active.discard(self._take_switched(staged))

    def close(self, links: Sequence[EngineLink]) -> None:
        if self._primary is not None:
            self._primary.close(links)
        if self._disk is not None:
            self._disk.close(links)

    # ------------------------------------------------------------------------------------------ internals

    _switched_staging: Any = None

    def _take_switched(self, staged: Any) -> Any:
        """The disk directory written by the push that switched (its ``staged`` came from the NCCL transport)."""
        switched, self._switched_staging = self._switched_staging, None
        return switched if switched is not None else staged

    def _give_up(self, primary: Transport, links: Sequence[EngineLink], exc: DCSEngineError) -> None:
        """NCCL failed before any tensor moved: close it and push through disk for good."""
        self._primary = None
        try:
            primary.close(links)
        except Exception:  # noqa: BLE001 - the group never formed; leaving it is best effort
            logger.debug("closing the failed NCCL transport raised", exc_info=True)
        self._switch(str(exc))

    def _disk_transport(self) -> DiskTransport:
        if self._disk is None:
            self._disk = DiskTransport(self._disk_dir)
        return self._disk

    def _switch(self, reason: str) -> None:
        self.reason = reason
        logger.warning("DCS: NCCL weight pushes are not possible (%s); pushing through /update_weights_from_disk "
                       "from now on (engines must see %s)", reason, self._disk_dir or "this machine's temporary directory")
