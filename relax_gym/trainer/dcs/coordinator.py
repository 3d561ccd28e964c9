"""The DCS coordinator: who receives weights, what the weights are, which version is live, how pushes are cut.

It is plain Python holding only picklable values (no locks, no sockets, no Ray), so it can live inside the actor
process next to its :class:`~relax_gym.trainer.dcs.client.DCSClient` or be wrapped as a Ray actor by the roles
and shared by several processes (every method takes and returns plain data). A client calls only three methods:
:meth:`~DCSCoordinator.push_plan`, :meth:`~DCSCoordinator.set_weights` and :meth:`~DCSCoordinator.commit`, so a
synchronous proxy of a Ray actor exposing those three is enough.

- **Topology**: the engines, as :class:`EngineInfo` (URL and rank in the weight-update group: the actor is rank 0,
  engines 1..n in registration order). Any change (an engine added, removed or restarted) bumps
  :attr:`DCSCoordinator.topology_epoch`, which tells clients to rebuild their process group before the next push.
- **Weight metadata**: :class:`WeightMetadata`, one :class:`TensorMeta` (HF checkpoint name, shape, dtype, bytes)
  per tensor to send, in the actor's ``state_dict`` order; tensors that alias an earlier one (tied embeddings)
  are not sent twice but listed in ``aliases``.
- **Versions**: :attr:`DCSCoordinator.version` is the version every engine was last brought to by a complete
  push; :meth:`DCSCoordinator.commit` is the only thing that moves it (a failed push leaves it unchanged).
- **Buckets**: :func:`plan_buckets` cuts the tensors, in order, into buckets of at most ``bucket_mb`` MiB (a
  tensor larger than that travels alone); each tensor is in exactly one bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bucket", "DCSCoordinator", "EngineInfo", "PushPlan", "TensorMeta", "Version", "WeightMetadata", "plan_buckets", "renamer"]

Version = int | str
TRANSPORTS = ("tcp", "nccl", "disk")  # the transport names (built by dcs.transports.make_transport)
MIB = 1 << 20


@dataclass(frozen=True)
class TensorMeta:
    """One tensor as the engines will receive it: its HF checkpoint ``name``, ``shape``, ``dtype`` (torch's
    spelling without ``torch.``, e.g. ``"bfloat16"``) and size in bytes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int


@dataclass(frozen=True)
class WeightMetadata:
    """The tensors a push sends (``tensors``, in order) and the names left out because they alias a sent one
    (``aliases``: left-out name → sent name)."""

    tensors: tuple[TensorMeta, ...]
    aliases: Mapping[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def by_name(self) -> dict[str, TensorMeta]:
        return {t.name: t for t in self.tensors}

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any],
                        names: Mapping[str, str] | Callable[[str], str] | None = None) -> WeightMetadata:
        """Metadata of a torch ``state_dict``. ``names`` maps its keys to the names engines load (a dict, a
        function, or None for the keys themselves; :func:`~relax_gym.trainer.dcs.names.checkpoint_names` gives
        a transformers model's checkpoint spellings). A tensor sharing storage, offset, shape and strides with an
        earlier one is an alias: recorded, not sent."""
        from relax_gym.trainer.dcs.group import dtype_name

        rename = renamer(names)
        tensors: list[TensorMeta] = []
        aliases: dict[str, str] = {}
        seen: dict[tuple, str] = {}
        for key, tensor in state_dict.items():
            name = rename(key)
            identity = _alias_key(tensor)
            if identity is not None and identity in seen:
                aliases[name] = seen[identity]
                continue
            if identity is not None:
                seen[identity] = name
            tensors.append(TensorMeta(name, tuple(int(s) for s in tensor.shape), dtype_name(tensor.dtype),
                                      int(tensor.numel()) * int(tensor.element_size())))
        duplicated = _duplicates(t.name for t in tensors)
        if duplicated:
            raise ValueError(f"the name mapping sends two tensors under the same name: {duplicated[:5]}")
        return cls(tuple(tensors), aliases)


@dataclass(frozen=True)
class Bucket:
    """A run of consecutive tensors sent together: their names (in order) and total bytes."""

    index: int
    names: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True)
class EngineInfo:
    """An engine that receives weights: its base URL and its rank in the weight-update group (1..n)."""

    url: str
    rank: int


@dataclass(frozen=True)
class PushPlan:
    """What a client needs for one push, in one call (:meth:`DCSCoordinator.push_plan`): the engines, the
    topology epoch, the committed version, the weight metadata (None before the first push) and its buckets."""

    engines: tuple[EngineInfo, ...]
    epoch: int
    version: Version
    weights: WeightMetadata | None
    buckets: tuple[Bucket, ...]
    transport: str


def plan_buckets(tensors: Sequence[TensorMeta], bucket_bytes: int) -> list[Bucket]:
    """Cut ``tensors`` in their order into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket
    of its own). Deterministic: the same tensors and size always give the same buckets."""
    if bucket_bytes < 1:
        raise ValueError(f"the bucket size must be at least 1 byte, got {bucket_bytes}")
    buckets: list[Bucket] = []
    names: list[str] = []
    size = 0
    for t in tensors:
        if names and size + t.nbytes > bucket_bytes:
            buckets.append(Bucket(len(buckets), tuple(names), size))
            names, size = [], 0
        names.append(t.name)
        size += t.nbytes
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), size))
    return buckets


class DCSCoordinator:
    """Topology, weight metadata, versions and bucket plans (see the module doc). ``transport``: ``"tcp"``,
    ``"nccl"`` or ``"disk"`` (what clients use unless told otherwise); ``bucket_mb``: the bucket size in MiB."""

    def __init__(self, engines: Iterable[str] = (), *, bucket_mb: float = 256.0, transport: str = "tcp",
                 version: Version = 0) -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown transport {transport!r} (choose from {', '.join(TRANSPORTS)})")
        self.bucket_mb = _check_bucket_mb(bucket_mb)
        self.transport = transport
        self._urls: list[str] = []
        self._epoch = 0
        self._version: Version = version
        self._engine_versions: dict[str, Version | None] = {}
        self._meta: WeightMetadata | None = None
        for url in engines:
            self.add_engine(url)

    # ------------------------------------------------------------------------------------------ topology

    @property
    def engines(self) -> tuple[EngineInfo, ...]:
        return tuple(EngineInfo(url, rank) for rank, url in enumerate(self._urls, start=1))

    @property
    def world_size(self) -> int:
        """Ranks of the weight-update group: the actor and every engine."""
        return 1 + len(self._urls)

    @property
    def topology_epoch(self) -> int:
        return self._epoch

    def add_engine(self, url: str) -> EngineInfo:
        """Register an engine by base URL (idempotent: a known URL keeps its rank)."""
        url = _norm_url(url)
        if url not in self._urls:
            self._urls.append(url)
            self._engine_versions[url] = None
            self._epoch += 1
        return EngineInfo(url, self._urls.index(url) + 1)

    def remove_engine(self, url: str) -> None:
        """Forget an engine; the ranks after it move down by one. ``KeyError`` naming it if unknown."""
        url = _norm_url(url)
        if url not in self._urls:
            raise KeyError(f"engine {url} is not registered with the DCS coordinator")
        self._urls.remove(url)
        self._engine_versions.pop(url, None)
        self._epoch += 1

    def engine_restarted(self, url: str) -> None:
        """An engine came back at the same URL (a level-1 restart): it left the weight-update group and its
        weights are not the committed version any more. The next push rebuilds the group and reloads it."""
        url = _norm_url(url)
        if url not in self._urls:
            raise KeyError(f"engine {url} is not registered with the DCS coordinator")
        self._engine_versions[url] = None
        self._epoch += 1

    # ------------------------------------------------------------------------------------------ weights

    @property
    def weights(self) -> WeightMetadata | None:
        return self._meta

    def set_weights(self, meta: WeightMetadata) -> None:
        """Set the weight metadata (the first push does it from the actor's state dict)."""
        if not isinstance(meta, WeightMetadata):
            raise TypeError(f"expected WeightMetadata, got {type(meta).__name__}")
        if not meta.tensors:
            raise ValueError("the weight metadata lists no tensors")
        self._meta = meta

    def buckets(self, bucket_mb: float | None = None) -> list[Bucket]:
        """The bucket plan of the registered weights (``bucket_mb`` overrides the coordinator's size)."""
        if self._meta is None:
            raise RuntimeError("no weight metadata registered yet (set_weights, or push once)")
        size = _check_bucket_mb(bucket_mb) if bucket_mb is not None else self.bucket_mb
        return plan_buckets(self._meta.tensors, max(1, int(size * MIB)))

    def push_plan(self, bucket_mb: float | None = None) -> PushPlan:
        """Everything a push needs, as one picklable value (a Ray-wrapped coordinator answers it in one call)."""
        buckets = tuple(self.buckets(bucket_mb)) if self._meta is not None else ()
        return PushPlan(self.engines, self._epoch, self._version, self._meta, buckets, self.transport)

    # ------------------------------------------------------------------------------------------ versions

    @property
    def version(self) -> Version:
        return self._version

    @property
    def engine_versions(self) -> dict[str, Version | None]:
        """URL → the version that engine last received completely (None: unknown / not since it joined)."""
        return dict(self._engine_versions)

    def commit(self, version: Version, engines: Iterable[str] | None = None) -> None:
        """Record a complete push of ``version`` to ``engines`` (default: all). The coordinator's version moves
        only when every registered engine holds ``version``."""
        urls = [_norm_url(u) for u in engines] if engines is not None else list(self._urls)
        unknown = [u for u in urls if u not in self._engine_versions]
        if unknown:
            raise KeyError(f"engine(s) {unknown} are not registered with the DCS coordinator")
        for url in urls:
            self._engine_versions[url] = version
        if all(self._engine_versions.get(u) == version for u in self._urls):
            self._version = version

    # ------------------------------------------------------------------------------------------ state

    def snapshot(self) -> dict[str, Any]:
        """Everything as plain data (for a checkpoint or another process); :meth:`restore` reads it back."""
        return {"engines": list(self._urls), "epoch": self._epoch, "version": self._version,
                "engine_versions": dict(self._engine_versions), "bucket_mb": self.bucket_mb,
                "transport": self.transport, "weights": self._meta}

    @classmethod
    def restore(cls, state: Mapping[str, Any]) -> DCSCoordinator:
        coordinator = cls(state["engines"], bucket_mb=state["bucket_mb"], transport=state["transport"],
                          version=state["version"])
        coordinator._epoch = int(state["epoch"])
        coordinator._engine_versions.update(state.get("engine_versions", {}))
        coordinator._meta = state.get("weights")
        return coordinator

    def __repr__(self) -> str:
        return (f"DCSCoordinator({len(self._urls)} engine(s), version {self._version!r}, transport {self.transport!r}, "
                f"bucket {self.bucket_mb} MiB, epoch {self._epoch})")


# ---------------------------------------------------------------------------------------------- helpers


def _check_bucket_mb(value: float) -> float:
    value = float(value)
    if not value > 0:
        raise ValueError(f"bucket_mb must be positive, got {value}")
    return value


def _norm_url(url: str) -> str:
    url = str(url).strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"an engine URL must start with http:// or https://, got {url!r}")
    return url


def renamer(names: Mapping[str, str] | Callable[[str], str] | None) -> Callable[[str], str]:
    """A state_dict key → engine name function from a mapping (unmapped keys keep their name), a function or None."""
    if names is None:
        return str
    if callable(names) and not isinstance(names, Mapping):
        return lambda key: str(names(key))
    return lambda key: str(names.get(key, key))


def _alias_key(tensor: Any) -> tuple | None:
    """What makes two tensors the same memory: storage pointer, offset, shape, strides, dtype (None for a tensor
    without storage, e.g. a meta tensor)."""
    try:
        ptr = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    if not ptr or tensor.numel() == 0:
        return None
    return (ptr, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device)


def _duplicates(names: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    dup = []
    for n in names:
        if n in seen:
            dup.append(n)
        seen.add(n)
    return dup
