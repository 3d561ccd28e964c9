"""How the bytes of a push reach the engines.

- ``tcp``: SGLang's ``/update_weights_from_distributed``, bucket by bucket (the actor is rank 0), its bytes over
  one of two wires (``wire=``):

  - ``socket`` (ours, :mod:`~relax_gym.trainer.dcs.wire`): a plain TCP stream per engine; the actor listens on
    ``master_address``, the engines connect (``/init_weights_update_group`` with ``backend="socket"``), and each
    call's tensors are ``sendmsg``-ed from their own memory (no flatten copy) and ``recv_into``-ed by the engine
    straight into the buffer it keeps them in (the staging buffer it later swaps in), after a 44-byte header
    naming the call (its index on the stream, bytes, tensors, ``stage_id`` tag and ``seq``). A staged push
    announces all its calls in one request (``/stage_weights_from_distributed``, ours), answered once the engine
    holds them all (the acknowledgement), so the calls follow each other on the wire without a round trip
    between them. Picked by default (``wire=None``) exactly when every engine lists ``socket``
    in ``/get_server_info``'s ``weight_update_backends`` (the embedded engine with the DCS's ``GroupReceiver``
    does; SGLang does not).
  - ``gloo``: a torch.distributed ``gloo`` group (:class:`~relax_gym.trainer.dcs.group.WeightUpdateGroup`), what
    every other engine gets. When the engines accept SGLang's ``load_format="flattened_bucket"`` (the embedded
    engine advertises it in ``/get_server_info``), each bucket travels as one ``uint8`` broadcast per dtype;
    otherwise as one broadcast per tensor. Every engine receives the same broadcast, so N engines cost one send
    per bucket from the actor's side of the group.

  Either way a call carries one dtype (a bucket is split by dtype with ``flattened_bucket``), so the engine reads
  every tensor back as an aligned view of the call's buffer.
- ``nccl``: the same code with backend ``nccl`` and CUDA tensors (needs CUDA on the actor and on the engines).
- ``disk``: each bucket is written as a ``.safetensors`` shard into a fresh directory *before* the engines pause
  (so their pause only covers loading), then every engine loads the directory with ``/update_weights_from_disk``.
  The engines must see the actor's filesystem. The newest ``keep`` directories are kept (a restarting engine can
  load the committed weights from there), older ones are removed.

Each transport has two steps: :meth:`Transport.stage` runs while the engines still generate, :meth:`Transport.load`
while they are paused. The last load call of a push carries the new ``weight_version``, so an engine's version
changes only when all its tensors have arrived.

``tcp`` / ``nccl`` pipeline their buckets. Over a process group the actor flattens call i+1 while call i is on the
wire (:class:`~relax_gym.trainer.dcs.pipeline.FlattenAhead`, two reusable buffers); the socket wire has nothing to
flatten. Engines that advertise
``weight_update_staging`` (the embedded engine) receive the whole push during :meth:`Transport.stage`, into buffers
of their own while they keep generating (each call names a ``stage_id`` and its ``seq``, so the actor announces
call i+1 while call i is still being broadcast and the engine still receives them in order); the paused part
is one ``/apply_staged_weights`` per engine, a pointer swap per tensor
(:mod:`~relax_gym.trainer.engines.weight_staging`). Other engines (SGLang) get the calls while paused, as before.
A push that fails while staging has not touched any engine's weights or version, and no engine was paused.

Failures over the socket wire are handled as over gloo: an engine that refuses a call (its HTTP answer, watched
while the bytes go out) or whose stream breaks (it died: reset / end of stream) fails the push with a
:class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming that engine, found at once rather than at a timeout;
a stream that takes no byte for ``group_timeout_s`` is an error too. The wire is then closed on the actor's side
(every engine's stream of it; an engine closes its end when its stream ends or goes out of step) and the next
push forms a new one, as a topology change (a new epoch) does.
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
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import torch

from relax_gym.trainer.dcs.coordinator import TRANSPORTS, Bucket, TensorMeta, Version
from relax_gym.trainer.dcs.errors import DCSEngineError
from relax_gym.trainer.dcs.group import FLATTENED_BUCKET, WeightUpdateGroup, check_backend
from relax_gym.trainer.dcs.pipeline import Call, FlattenAhead
from relax_gym.trainer.dcs.wire import SOCKET, STREAMS, SocketWire, WireError

if TYPE_CHECKING:
    from relax_gym.trainer.dcs.link import EngineLink, StageRequest

__all__ = ["TRANSPORTS", "WIRES", "DiskTransport", "DistributedTransport", "NcclTransport", "StagedPush", "TcpTransport",
           "Transport", "make_transport"]

logger = logging.getLogger(__name__)

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

Items = Sequence[tuple[TensorMeta, torch.Tensor]]
WIRES = ("socket", "gloo")  # what the tcp transport's bytes travel over (``wire=``; None: socket where every engine takes it)


class Transport(ABC):
    """Base: ``stage`` (engines still generating) then ``load`` (engines paused). ``load`` returns the bytes
    it moved to each engine and raises :class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming the engine
    that failed."""

    name = "base"

    def stage(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version, *,
              epoch: int, pool: ThreadPoolExecutor) -> Any:
        """Work that can happen while the engines still generate; returns what :meth:`load` needs. Raises
        :class:`~relax_gym.trainer.dcs.errors.DCSEngineError` naming an engine that failed (none is paused yet,
        and no engine's weights changed)."""
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
                   device: torch.device | str | None = None, staged: bool | None = None,
                   wire: str | None = None) -> Transport:
    """The transport called ``name`` (``tcp``, ``nccl`` or ``disk``). ``nccl`` raises a ``RuntimeError``
    saying so where CUDA or NCCL is missing; an unknown name is a ``ValueError`` listing the choices.
    ``staged``: see :class:`DistributedTransport`; ``wire`` (``tcp`` only): see :class:`TcpTransport`."""
    if name == "tcp":
        return TcpTransport(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s, staged=staged,
                            wire=wire)
    if wire is not None:
        raise ValueError(f"wire={wire!r} applies to the tcp transport only, not {name!r}")
    if name == "nccl":
        return NcclTransport(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s, device=device,
                             staged=staged)
    if name == "disk":
        return DiskTransport(disk_dir)
    raise ValueError(f"unknown DCS transport {name!r} (choose from {', '.join(TRANSPORTS)})")


# ---------------------------------------------------------------------------------------------- distributed


@dataclass(frozen=True)
class StagedPush:
    """What :meth:`DistributedTransport.stage` left on the engines: the stage's id, its number of calls, the
    bytes each engine received and the engines holding it."""

    stage_id: str
    calls: int
    nbytes: int
    links: tuple[EngineLink, ...]


class DistributedTransport(Transport):
    """Broadcast over a weight-update group (see the module doc). ``flatten``: True / False, or None to use
    ``flattened_bucket`` exactly when every engine advertises it. ``staged``: receive the push while the engines
    generate and only swap it in while they are paused; True / False, or None to stage exactly when every engine
    advertises ``weight_update_staging``. ``master_address``: where engines reach the actor's store (default:
    loopback when every engine is local, else the local address facing the first engine)."""

    backend = "gloo"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None,
                 group_timeout_s: float = 120.0, device: torch.device | str = "cpu", staged: bool | None = None,
                 wire: str | None = None) -> None:
        check_backend(self.backend)
        self.flatten = flatten
        self.staged = staged
        self.wire = wire if self.backend == "gloo" else self.backend  # None: decided per group (tcp, see TcpTransport)
        self.master_address = master_address
        self.group_timeout_s = float(group_timeout_s)
        self.device = torch.device(device)
        self._group: WeightUpdateGroup | SocketWire | None = None
        self._members: tuple[str, ...] = ()
        self._epoch: int | None = None
        self._features: tuple[bool, bool, bool] | None = None  # (flattened, staging, socket) the engines advertise
        self._ahead = FlattenAhead(self.device)
        self._stale: list[tuple[str, tuple[str, ...]]] = []  # groups discarded after a failure: (name, members)

    @property
    def group(self) -> WeightUpdateGroup | SocketWire | None:
        """The current group: a :class:`WeightUpdateGroup`, or the ``socket`` wire's :class:`SocketWire`."""
        return self._group

    def stage(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version, *,
              epoch: int, pool: ThreadPoolExecutor) -> StagedPush | None:
        """Form the group if needed; on staging engines also send every call (the engines keep generating).
        None when the calls are left to :meth:`load`."""
        group = self._ensure_group(links, epoch, pool)
        flat, staging, _ = self._use(links, pool)
        if not staging:
            return None
        stage_id = uuid.uuid4().hex
        calls = _calls(buckets, items, flat)
        try:
            sent = self._send(links, group, calls, flat, pool, stage_id=stage_id)
        except BaseException:
            _discard_on(links, stage_id, pool)
            raise
        return StagedPush(stage_id, len(calls), sent, tuple(links))

    def load(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version,
             staged: Any, *, epoch: int, pool: ThreadPoolExecutor) -> int:
        if isinstance(staged, StagedPush):
            if len(links) == 1:  # in this thread: no hand-over to the pool and back while the engine is paused
                links[0].apply_staged(staged.stage_id, staged.calls, str(version))
                return staged.nbytes
            futures = [pool.submit(link.apply_staged, staged.stage_id, staged.calls, str(version)) for link in links]
            _raise_first_failure(futures)
            return staged.nbytes
        group = self._ensure_group(links, epoch, pool)
        flat, _, _ = self._use(links, pool)
        return self._send(links, group, _calls(buckets, items, flat), flat, pool, version=version)

    def discard(self, staged: Any) -> None:
        """Drop what the engines staged for a push that did not go live (best effort: frees their buffers)."""
        if isinstance(staged, StagedPush):
            for link in staged.links:
                link.discard_staged(staged.stage_id)

    def close(self, links: Sequence[EngineLink]) -> None:
        """Leave the current group and any discarded one on the engines still listed; destroy our end."""
        group, self._group, self._epoch, self._features = self._group, None, None, None
        self._ahead.close()
        if group is not None:
            self._stale.append((group.group_name, self._members))
        for name, members in self._stale:
            for link in links:
                if link.url in members:
                    link.leave_group(name)
        self._stale.clear()
        if group is not None:
            group.destroy()

    def _send(self, links: Sequence[EngineLink], group: WeightUpdateGroup | SocketWire, calls: Sequence[Call], flat: bool,
              pool: ThreadPoolExecutor, *, stage_id: str | None = None, version: Version | None = None) -> int:
        """Send ``calls`` in order, each announced to every engine over HTTP; returns the bytes sent.

        With ``stage_id`` the engines stage the calls and call i+1 is announced while call i is on the wire (the
        engine orders them by ``seq``); the actor waits for call i's answers only before announcing call i+3, so
        at most three calls per engine are open (waiting for call i-1's answer before sending call i would leave
        the wire idle while the engine drains call i-1's tail and answers). Without, call i+1 is announced once
        every engine has answered call i (an engine applies the calls in the order its requests arrive), and the
        last call carries ``version``. A gloo / nccl group broadcasts each call's payload (flattened ahead, see
        :class:`~relax_gym.trainer.dcs.pipeline.FlattenAhead`); the socket wire sends the call's tensors as they
        are, and a staged push over it announces every call in one request instead (:meth:`_stream`)."""
        fmt = FLATTENED_BUCKET if flat else None
        last = len(calls) - 1

        def announce(i: int) -> list[Future]:
            metas = [m for m, _ in calls[i]]
            if stage_id is not None:
                return [pool.submit(link.stage_distributed, metas, group.group_name, fmt, stage_id, i) for link in links]
            weight_version = str(version) if i == last else None
            return [pool.submit(link.receive_distributed, metas, group.group_name, fmt, weight_version) for link in links]

        if isinstance(group, SocketWire) and stage_id is not None:
            return self._stream(links, group, calls, fmt, pool, stage_id)
        if isinstance(group, SocketWire):  # unstaged: each call announced, sent and answered in turn
            def put(i: int, watched: Sequence[Future]) -> None:
                group.send([t for _, t in calls[i]], check=lambda: _raise_first_failure(watched, only_done=True))
            puts: Any = (lambda watched, i=i: put(i, watched) for i in range(len(calls)))
        else:
            puts = ((lambda watched, payloads=payloads: [self._broadcast(group, p, watched) for p in payloads])
                    for payloads in self._ahead.payloads(calls, flat))

        open_calls: dict[int, list[Future]] = {}
        sent = 0
        try:
            for i, send in enumerate(puts):
                if i not in open_calls:
                    open_calls[i] = announce(i)
                if stage_id is not None and i + 1 <= last:
                    if i - 2 in open_calls:  # long answered: call i-1 was read after it
                        _raise_first_failure(open_calls.pop(i - 2))
                    open_calls[i + 1] = announce(i + 1)
                send([f for futures in open_calls.values() for f in futures])
                if stage_id is None:
                    _raise_first_failure(open_calls.pop(i))
                sent += sum(m.nbytes for m, _ in calls[i])
            for i in sorted(open_calls):
                _raise_first_failure(open_calls.pop(i))
        except DCSEngineError:
            self._discard_group()  # the engines and the actor may be out of step now
            raise
        except WireError as exc:
            # one engine's stream broke (it died, or closed it): blame that engine -- its HTTP call's error when
            # it says more -- not the others, whose calls fail too once the wire is closed below
            self._discard_group()
            named = [j for j, link in enumerate(links) if link.rank == exc.rank]
            if not named:
                raise DCSEngineError(", ".join(link.url for link in links), "weight_stream", exc) from exc
            culprit = _first_failure([futures[named[0]] for futures in open_calls.values()], timeout=2.0)
            if culprit is not None:
                raise culprit from exc
            raise DCSEngineError(links[named[0]].url, "weight_stream", exc) from exc
        except RuntimeError as exc:
            self._discard_group()
            culprit = _first_failure([f for futures in open_calls.values() for f in futures], timeout=5.0)
            if culprit is not None:
                raise culprit from exc
            raise DCSEngineError(", ".join(link.url for link in links), "broadcast", exc) from exc
        return sent

    def _stream(self, links: Sequence[EngineLink], wire: SocketWire, calls: Sequence[Call], fmt: str | None,
                pool: ThreadPoolExecutor, stage_id: str) -> int:
        """A staged push over the socket wire: every call announced to each engine in one request
        (``/stage_weights_from_distributed``, sent from this thread before the first byte), then sent back to back;
        the engines' answers, once they hold every call, are the acknowledgement. Errors as in :meth:`_send`."""
        metas = [[m for m, _ in call] for call in calls]
        requests: list[StageRequest] = []
        try:
            for link in links:
                requests.append(link.stage_all(metas, wire.group_name, fmt, stage_id))

            def check() -> None:  # an engine that refuses a call stops reading: raise its answer, not a timeout
                for request in requests:
                    request.poll()

            wire.send_calls([[t for _, t in call] for call in calls], stage_id=stage_id, check=check)
            for request in requests:
                request.wait()
        except DCSEngineError:
            self._discard_group()
            raise
        except WireError as exc:
            self._discard_group()
            named = [j for j, link in enumerate(links) if link.rank == exc.rank]
            if not named or named[0] >= len(requests):
                raise DCSEngineError(", ".join(link.url for link in links), "weight_stream", exc) from exc
            try:  # its answer says more (the engine refused the call, or its connection reset: it died)
                requests[named[0]].wait(timeout_s=2.0)
            except DCSEngineError as culprit:
                raise culprit from exc
            raise DCSEngineError(links[named[0]].url, "weight_stream", exc) from exc
        except BaseException:  # the actor's side failed mid-call: the streams are out of step
            self._discard_group()
            raise
        finally:
            for request in requests:
                request.close()
        return sum(m.nbytes for call in metas for m in call)

    # ------------------------------------------------------------------------------------------ internals

    def _use(self, links: Sequence[EngineLink], pool: ThreadPoolExecutor) -> tuple[bool, bool, bool]:
        """(flattened, staged, socket wire) for this push: as configured, else what every engine advertises (asked
        once per group: a restarted engine joins a new group, and the question is asked again)."""
        if self._features is None:
            wanted = None in (self.flatten, self.staged, self.wire)
            answers = list(pool.map(lambda link: link.features(), links)) if wanted else []
            self._features = (all(a[0] for a in answers), all(a[1] for a in answers), all(a[2] for a in answers))
        flat = self.flatten if self.flatten is not None else self._features[0]
        staged = self.staged if self.staged is not None else self._features[1]
        socket_wire = self.wire == SOCKET if self.wire is not None else self._features[2]
        return flat, staged, socket_wire

    def _ensure_group(self, links: Sequence[EngineLink], epoch: int, pool: ThreadPoolExecutor) -> WeightUpdateGroup | SocketWire:
        """The current group, rebuilt when the topology changed or the last push broke it: the socket wire where
        the engines take it (see :class:`TcpTransport`), else a process group."""
        members = tuple(link.url for link in links)
        if self._group is not None and self._group.alive and self._epoch == epoch and self._members == members:
            return self._group
        self.close(links)
        address = self.master_address or _master_address([link.url for link in links])
        if self._use(links, pool)[2]:
            group: WeightUpdateGroup | SocketWire = self._form_wire(links, address, pool)
        else:
            group = self._form_group(links, address, pool)
        self._group, self._members, self._epoch = group, members, epoch
        return group

    def _form_group(self, links: Sequence[EngineLink], address: str, pool: ThreadPoolExecutor) -> WeightUpdateGroup:
        members = tuple(link.url for link in links)
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
        return box["group"]

    def _form_wire(self, links: Sequence[EngineLink], address: str, pool: ThreadPoolExecutor) -> SocketWire:
        """The socket wire: the actor listens on ``address``, every engine is asked (``/init_weights_update_group``
        with ``backend="socket"``) to connect; raises :class:`DCSEngineError` naming an engine that refused or did
        not connect in time."""
        members = tuple(link.url for link in links)
        name = f"relax-dcs-{uuid.uuid4().hex}"  # also the stream's password: it travels only over the engines' API
        wire = SocketWire(address, [link.rank for link in links], group_name=name, timeout_s=self.group_timeout_s,
                          streams=getattr(self, "streams", STREAMS))
        futures = [pool.submit(link.join_group, address, wire.port, 1 + len(links), name, SOCKET) for link in links]
        try:
            try:
                wire.accept(time.monotonic() + self.group_timeout_s,
                            check=lambda: _raise_first_failure(futures, only_done=True))
            except WireError as exc:
                _raise_first_failure(futures, only_done=True)
                late = [link.url for link in links if link.rank in wire.missing] or list(members)
                raise DCSEngineError(", ".join(late), "init_weights_update_group", exc) from exc
            _raise_first_failure(futures)
        except BaseException:
            self._stale.append((name, members))  # engines that joined leave it at the next close / rebuild
            wire.destroy()
            raise
        return wire

    def _discard_group(self) -> None:
        group, self._group, self._epoch, self._features = self._group, None, None, None
        if group is not None:
            self._stale.append((group.group_name, self._members))
            logger.warning("weight update group %s discarded after a failed push; the next push forms a new one",
                           group.group_name)
            if isinstance(group, SocketWire):
                group.destroy()  # closes its sockets: never waits
            else:
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
    """``tcp``: CPU tensors over TCP. ``wire``: ``"socket"`` (a plain TCP stream per engine -- ``streams`` of them,
    default :data:`~relax_gym.trainer.dcs.wire.STREAMS` (1), each call's bytes then cut into that many ranges moved
    in parallel; the tensors sent from their own memory and received straight into the engine's buffers;
    :mod:`~relax_gym.trainer.dcs.wire`), ``"gloo"`` (a gloo group's broadcast, what SGLang engines take), or None
    (default) for ``socket`` exactly when every engine lists it in ``/get_server_info``'s ``weight_update_backends``
    (the embedded engine with the DCS's receiver does; SGLang does not)."""

    name = "tcp"
    backend = "gloo"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None, group_timeout_s: float = 120.0,
                 staged: bool | None = None, wire: str | None = None, streams: int = STREAMS) -> None:
        if wire not in (None, *WIRES):
            raise ValueError(f"unknown wire {wire!r} for the tcp transport (choose from {', '.join(WIRES)}, or None)")
        if not 1 <= int(streams) <= 16:
            raise ValueError(f"streams must be in 1..16, got {streams}")
        self.streams = int(streams)
        super().__init__(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s, device="cpu",
                         staged=staged, wire=wire)


class NcclTransport(DistributedTransport):
    """``nccl``: NCCL, CUDA tensors (``device``: the actor's CUDA device, the current one by default). Raises a
    ``RuntimeError`` on a machine without CUDA."""

    name = "nccl"
    backend = "nccl"

    def __init__(self, *, flatten: bool | None = None, master_address: str | None = None, group_timeout_s: float = 120.0,
                 device: torch.device | str | None = None, staged: bool | None = None) -> None:
        check_backend("nccl")  # before touching torch.cuda
        super().__init__(flatten=flatten, master_address=master_address, group_timeout_s=group_timeout_s,
                         device=device if device is not None else torch.device("cuda", torch.cuda.current_device()),
                         staged=staged)


def _calls(buckets: Sequence[Bucket], items: Items, flat: bool) -> list[Call]:
    """The update calls of a push: one per bucket, or with ``flat`` one per dtype in each bucket (in first-seen
    order), so each flattened payload holds a single dtype and every tensor in it starts aligned."""
    tensors = {meta.name: (meta, tensor) for meta, tensor in items}
    calls: list[Call] = []
    for bucket in buckets:
        entries = [tensors[name] for name in bucket.names]
        if not flat:
            calls.append(entries)
            continue
        by_dtype: dict[str, list[tuple[TensorMeta, torch.Tensor]]] = {}
        for meta, tensor in entries:
            by_dtype.setdefault(meta.dtype, []).append((meta, tensor))
        calls.extend(by_dtype.values())
    return calls


def _discard_on(links: Sequence[EngineLink], stage_id: str, pool: ThreadPoolExecutor) -> None:
    """Ask every engine to drop ``stage_id`` (best effort, a few seconds at most: an engine that does not answer
    drops it anyway when the next push begins)."""
    futures = [pool.submit(link.discard_staged, stage_id) for link in links]
    _first_failure(futures, timeout=5.0)


def _first_failure(futures: Sequence[Future], timeout: float) -> Exception | None:
    """The first error among ``futures`` (in their order among those that failed), waiting at most ``timeout``
    seconds for one to fail; None when none failed by then (a call still waiting is not a failure)."""
    wait(futures, timeout=timeout, return_when=FIRST_EXCEPTION)
    for future in futures:
        if future.done() and future.exception() is not None:
            return future.exception()
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

    def stage(self, links: Sequence[EngineLink], items: Items, buckets: Sequence[Bucket], version: Version, *,
              epoch: int = 0, pool: ThreadPoolExecutor | None = None) -> Path:
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
