"""How the bytes of a push reach the engines.

- ``tcp``: a torch.distributed ``gloo`` group (:class:`~relax_gym.trainer.dcs.group.WeightUpdateGroup`;
  the actor is rank 0) and SGLang's ``/update_weights_from_distributed``, bucket by bucket. When the engines
  accept SGLang's ``load_format="flattened_bucket"`` (the embedded engine advertises it in ``/get_server_info``),
  each bucket travels as one ``uint8`` broadcast per dtype; otherwise as one broadcast per tensor. Every engine
  receives the same broadcast, so N engines cost one send per bucket from the actor's side of the group.
- ``nccl``: the same code with backend ``nccl`` and CUDA tensors (needs CUDA on the actor and on the engines).
- ``disk``: each bucket is written as a ``.safetensors`` shard into a fresh directory *before* the engines pause
  (so their pause only covers loading), then every engine loads the directory with ``/update_weights_from_disk``.
  The engines must see the actor's filesystem. The newest ``keep`` directories are kept (a restarting engine can
  load the committed weights from there), older ones are removed.

Each transport has two steps: :meth:`Transport.stage` runs while the engines still generate, :meth:`Transport.load`
while they are paused. The last load call of a push carries the new ``weight_version``, so an engine's version
changes only when all its tensors have arrived.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import torch

from relax_gym.trainer.dcs.coordinator import TRANSPORTS, Bucket, TensorMeta, Version
from relax_gym.trainer.dcs.errors import DCSEngineError
from relax_gym.trainer.dcs.group import FLATTENED_BUCKET, WeightUpdateGroup, check_backend, flatten_tensors

if TYPE_CHECKING:
    from relax_gym.trainer.dcs.link import EngineLink

__all__ = ["TRANSPORTS", "DiskTransport", "DistributedTransport", "NcclTransport", "TcpTransport", "Transport", "make_transport"]

logger = logging.getLogger(__name__)

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

Items = Sequence[tuple[TensorMeta, torch.Tensor]]


class Transport(ABC):
    """Base: ``stage`` (engines still generating) then ``load`` (engines paused). ``load`` returns the bytes
    it moved to each engine and raises :class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming the engine
    that failed."""

    name = "base"

    def stage(self, items: Items, buckets: Sequence[Bucket], version: Version) -> Any:
        """Work that can happen while the engines still generate; returns what :meth:`load` needs."""
        return None

    @abstractmethod
    def load(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version,
             staged: Any, *, epoch: int, pool: ThreadPoolExecutor) -> int:
        """Bring every engine (all paused) to ``version``; the last call to each carries the version."""

    def committed(self, staged: Any) -> None:
        """The push that staged ``staged`` completed."""

    def discard(self, staged: Any) -> None:
        """The push that staged ``staged`` failed: drop what it staged."""

    def close(self, links: Sequence[EngineLink]) -> None:
        """Release what the transport holds (groups, files it no longer needs)."""


def make_transport(name: str, *, disk_dir: str | Path | None = None, flatten: bool | None = None,
                   master_address: str | None = None, group_timeout_s: float = 120.0,
                   device: torch.device | str | None = None) -> Transport:
    """The transport called ``name`` (``tcp``, ``nccl`` or ``disk``). ``nccl`` raises a ``RuntimeError``
    saying so where CUDA or NCCL is missing; an unknown name is a ``ValueError`` listing the choices."""
    if name == "tcp":
        return TcpTransport(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s)
    if name == "nccl":
        return NcclTransport(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s, device=device)
    if name == "disk":
        return DiskTransport(disk_dir)
    raise ValueError(f"unknown DCS transport {name!r} (choose from {', '.join(TRANSPORTS)})")


# ---------------------------------------------------------------------------------------------- distributed


class DistributedTransport(Transport):
    """Broadcast over a weight-update group (see the module doc). ``flatten``: True / False, or None to use
    ``flattened_bucket`` exactly when every engine advertises it. ``master_address``: where engines reach the
    actor's store (default: loopback when every engine is local, else the local address facing the first engine)."""

    backend = "gloo"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None,
                 group_timeout_s: float = 120.0, device: torch.device | str = "cpu") -> None:
        check_backend(self.backend)
        self.flatten = flatten
        self.master_address = master_address
        self.group_timeout_s = float(group_timeout_s)
        self.device = torch.device(device)
        self._group: WeightUpdateGroup | None = None
        self._members: tuple[str, ...] = ()
        self._epoch: int | None = None
        self._buffer: torch.Tensor | None = None
        self._stale: list[tuple[str, tuple[str, ...]]] = []  # groups discarded after a failure: (name, members)

    @property
    def group(self) -> WeightUpdateGroup | None:
        return self._group

    def load(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version,
             staged: Any, *, epoch: int, pool: ThreadPoolExecutor) -> int:
        group = self._ensure_group(links, epoch, pool)
        flat = self._use_flatten(links, pool)
        tensors = {meta.name: (meta, tensor) for meta, tensor in items}
        calls = [call for bucket in buckets for call in _calls(bucket, tensors, flat)]
        sent = 0
        for i, call in enumerate(calls):
            metas = [m for m, _ in call]
            wire = [t.detach().to(self.device).contiguous() for _, t in call]
            payloads = [flatten_tensors(wire, out=self._staging(sum(m.nbytes for m in metas)))] if flat else wire
            weight_version = str(version) if i == len(calls) - 1 else None
            futures = [pool.submit(link.receive_distributed, metas, group.group_name,
                                   FLATTENED_BUCKET if flat else None, weight_version) for link in links]
            try:
                for payload in payloads:
                    self._broadcast(group, payload, futures)
            except DCSEngineError:
                self._discard_group()  # the engines and the actor may be out of step now
                raise
            except RuntimeError as exc:
                self._discard_group()
                culprit = _first_failure(futures, timeout=5.0)
                if culprit is not None:
                    raise culprit from exc
                raise DCSEngineError(", ".join(link.url for link in links), "broadcast", exc) from exc
            _raise_first_failure(futures)
            sent += sum(m.nbytes for m in metas)
        return sent

    def close(self, links: Sequence[EngineLink]) -> None:
        """Leave the current group and any discarded one on the engines still listed; destroy our end."""
        group, self._group, self._epoch, self._buffer = self._group, None, None, None
        if group is not None:
            self._stale.append((group.group_name, self._members))
        for name, members in self._stale:
            for link in links:
                if link.url in members:
                    link.leave_group(name)
        self._stale.clear()
        if group is not None:
            group.destroy()

    # ------------------------------------------------------------------------------------------ internals

    def _staging(self, nbytes: int) -> torch.Tensor:
        """The reusable ``uint8`` buffer flattened payloads are written into (grown to the largest call)."""
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._buffer

    def _use_flatten(self, links: Sequence[EngineLink], pool: ThreadPoolExecutor) -> bool:
        if self.flatten is not None:
            return self.flatten
        return all(pool.map(lambda link: link.supports_flattened(), links))

    def _ensure_group(self, links: Sequence[EngineLink], epoch: int, pool: ThreadPoolExecutor) -> WeightUpdateGroup:
        """The current group, rebuilt when the topology changed or the last push broke it."""
        members = tuple(link.url for link in links)
        if self._group is not None and self._group.alive and self._epoch == epoch and self._members == members:
            return self._group
        self.close(links)
        address = self.master_address or _master_address([link.url for link in links])
        port = _free_port(address)
        name = f"relax-dcs-{uuid.uuid4().hex[:12]}"
        world_size = 1 + len(links)
        box: dict[str, Any] = {}

        def build() -> None:
            try:
                box["group"] = WeightUpdateGroup(address, port, 0, world_size, group_name=name, backend=self.backend,
                                                 timeout_s=self.group_timeout_s, device=self.device if self.backend == "nccl" else None)
            except BaseException as exc:  # noqa: BLE001 - reported below
                box["error"] = exc

        builder = threading.Thread(target=build, name="dcs-group-rank0", daemon=True)
        builder.start()  # rank 0 serves the store the engines connect to
        futures = [pool.submit(link.join_group, address, port, world_size, name, self.backend) for link in links]
        try:
            deadline = time.monotonic() + self.group_timeout_s
            while builder.is_alive() and time.monotonic() < deadline:
                _raise_first_failure(futures, only_done=True)  # an engine that refuses to join never will
                builder.join(0.01)
            if builder.is_alive() or "error" in box:
                _raise_first_failure(futures, only_done=True)
                cause = box.get("error") or TimeoutError(f"the group did not form within {self.group_timeout_s} s")
                raise DCSEngineError(", ".join(members), "init_weights_update_group", cause)
            _raise_first_failure(futures)
        except BaseException:
            self._stale.append((name, members))  # engines that joined leave it at the next close / rebuild
            if "group" in box:
                box["group"].destroy()
            raise
        self._group, self._members, self._epoch = box["group"], members, epoch
        return self._group

    def _discard_group(self) -> None:
        group, self._group, self._epoch = self._group, None, None
        if group is not None:
            self._stale.append((group.group_name, self._members))
            logger.warning("weight update group %s discarded after a failed push; the next push forms a new one",
                           group.group_name)
            threading.Thread(target=group.destroy, daemon=True).start()  # may wait on a stuck peer

    @staticmethod
    def _broadcast(group: WeightUpdateGroup, payload: torch.Tensor, futures: Sequence[Future]) -> None:
        """Broadcast from rank 0 while watching the engines' HTTP calls: an engine that refuses the call never
        joins the broadcast, so its error is raised instead of waiting for the group's timeout."""
        work = group.broadcast(payload, src=0, async_op=True)
        while not work.is_completed():
            _raise_first_failure(futures, only_done=True)
            time.sleep(0.0005)
        work.wait()


class TcpTransport(DistributedTransport):
    """``tcp``: gloo over TCP, CPU tensors."""

    name = "tcp"
    backend = "gloo"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None, group_timeout_s: float = 120.0) -> None:
        super().__init__(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s, device="cpu")


class NcclTransport(DistributedTransport):
    """``nccl``: NCCL, CUDA tensors (``device``: the actor's CUDA device, the current one by default). Raises a
    ``RuntimeError`` on a machine without CUDA."""

    name = "nccl"
    backend = "nccl"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None, group_timeout_s: float = 120.0,
                 device: torch.device | str | None = None) -> None:
        check_backend("nccl")  # before touching torch.cuda
        super().__init__(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s,
                         device=device if device is not None else torch.device("cuda", torch.cuda.current_device()))


def _calls(bucket: Bucket, tensors: dict[str, tuple[TensorMeta, torch.Tensor]], flat: bool) -> list[list[tuple[TensorMeta, torch.Tensor]]]:
    """One update call per bucket, or with ``flat`` one per dtype in the bucket (in first-seen order), so each
    flattened payload holds a single dtype and every tensor in it starts aligned."""
    entries = [tensors[name] for name in bucket.names]
    if not flat:
        return [entries]
    by_dtype: dict[str, list[tuple[TensorMeta, torch.Tensor]]] = {}
    for meta, tensor in entries:
        by_dtype.setdefault(meta.dtype, []).append((meta, tensor))
    return list(by_dtype.values())


def _first_failure(futures: Sequence[Future], timeout: float) -> Exception | None:
    """The first error among ``futures``, waiting at most ``timeout`` seconds in all."""
    end = time.monotonic() + timeout
    for future in futures:
        try:
            future.result(timeout=max(0.0, end - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - returned, raised by the caller
            return exc
    return None


def _raise_first_failure(futures: Sequence[Future], *, only_done: bool = False) -> None:
    """Raise the first engine call's error (link methods raise ``DCSEngineError`` naming their engine)."""
    for future in futures:
        if only_done and not future.done():
            continue
        exc = future.exception()
        if exc is not None:
            raise exc


def _master_address(urls: Sequence[str]) -> str:
    hosts = [urlsplit(u).hostname or "" for u in urls]
    if all(h in _LOOPBACK for h in hosts):
        return "127.0.0.1"
    first = urlsplit(urls[0])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent: only routing is asked
        probe.connect((first.hostname, first.port or 80))
        return probe.getsockname()[0]


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


# ---------------------------------------------------------------------------------------------- disk


class DiskTransport(Transport):
    """``disk``: safetensors shards in ``directory`` (default: a fresh temporary directory), one per bucket,
    loaded by every engine through ``/update_weights_from_disk``. ``keep``: how many pushed versions stay."""

    name = "disk"

    def __init__(self, directory: str | Path | None = None, *, keep: int = 1) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="relax-dcs-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self._written: list[Path] = []

    def stage(self, items: Items, buckets: Sequence[Bucket], version: Version) -> Path:
        """Write the shards of ``version`` into a new directory (atomically renamed into place); returns it."""
        from safetensors.torch import save_file

        tag = re.sub(r"[^A-Za-z0-9._-]", "_", str(version))[:64]
        final = self.directory / f"v{tag}-{uuid.uuid4().hex[:8]}"
        partial = final.with_name(final.name + ".partial")
        partial.mkdir()
        tensors = {meta.name: tensor for meta, tensor in items}
        try:
            for bucket in buckets:
                shard = {name: _owned(tensors[name]) for name in bucket.names}
                save_file(shard, str(partial / f"bucket-{bucket.index:05d}.safetensors"), metadata={"weight_version": str(version)})
            partial.rename(final)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        return final

    def load(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version,
             staged: Any, *, epoch: int, pool: ThreadPoolExecutor) -> int:
        futures = [pool.submit(link.load_from_disk, str(staged), str(version)) for link in links]
        _raise_first_failure(futures)
        return sum(p.stat().st_size for p in Path(staged).glob("*.safetensors"))

    def committed(self, staged: Any) -> None:
        self._written.append(Path(staged))
        while len(self._written) > self.keep:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)

    def discard(self, staged: Any) -> None:
        """Remove the shards of a push that did not complete."""
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    def close(self, links: Sequence[EngineLink]) -> None:
        """Remove the temporary directory this transport made (a directory given to it is left in place)."""
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor that owns all of its storage (safetensors refuses tensors sharing memory)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or t.storage_offset():
        t = t.clone()
    return t
