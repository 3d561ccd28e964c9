"""The torch.distributed side of SGLang's ``init_weights_update_group`` / ``update_weights_from_distributed``.

A weight-update group is a process group of ``world_size`` ranks outside the default group: the trainer is
rank 0, each engine joins as rank ``rank_offset`` (the embedded engine has one tensor-parallel rank). The group
meets through a ``TCPStore`` served by rank 0 at ``master_address:master_port`` (keys under ``group_name/``).
For each ``update_weights_from_distributed`` call the engine receives, in the order of ``names``, one broadcast
from rank 0 per tensor, allocated with the announced ``dtypes`` / ``shapes`` -- or, with SGLang's
``load_format="flattened_bucket"``, a single broadcast of one ``uint8`` tensor holding every announced tensor's
bytes back to back in that order (:func:`flatten_tensors` / :func:`unflatten_tensors`). Senders keep one dtype
per flattened call, so every tensor starts at a multiple of its element size and is read back as a view.

Backends: ``gloo`` (CPU tensors) and ``nccl`` (CUDA tensors; refused with a clear error where CUDA or NCCL is
missing). The group is created from public torch classes (``TCPStore``, ``PrefixStore``, ``ProcessGroupGloo`` /
``ProcessGroupNCCL``) and used directly, without registering it as a default or ``new_group`` group, so a
process can hold it next to its own default group. Its store keys follow the layout SGLang's end produces (its
``init_custom_process_group`` over torch's ``_new_process_group_helper``, see :func:`group_store`), so the NCCL
end meets a real SGLang server; a CPU test checks the layout against torch's helper with gloo.

Trainer side, against an engine that serves SGLang's protocol (``client``: anything with the engine client's
``init_weights_update_group`` / ``update_weights_from_distributed`` methods)::

    group = init_weights_update_group_pair(client, "127.0.0.1", port)       # both ends meet
    push_weights_distributed(client, group, model.state_dict(), weight_version="7")
    client.destroy_weights_update_group(); group.destroy()

Engine side: :class:`GroupReceiver` is what an engine joins and receives with (a gloo / nccl group, or the
``tcp`` transport's plain socket stream, :mod:`~relax_gym.trainer.dcs.wire`, with ``backend="socket"``). The embedded engine does not import
this package; whoever composes engine and DCS hands it one (``start_engine(..., weight_receiver=GroupReceiver())``,
``EmbeddedEngine(..., weight_receiver=...)``); without one the engine refuses ``/init_weights_update_group``.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from relax_gym.trainer.dcs.wire import SOCKET, SocketEnd, byte_view

__all__ = [
    "BACKENDS", "FLATTENED_BUCKET", "GroupReceiver", "WeightUpdateGroup", "check_backend", "dtype_from_name", "dtype_name",
    "flatten_tensors", "group_store", "init_weights_update_group_pair", "push_weights_distributed", "tensor_digest",
    "unflatten_tensors",
]

DEFAULT_GROUP_NAME = "weight_update_group"
FLATTENED_BUCKET = "flattened_bucket"  # SGLang's load_format for one broadcast per call
BACKENDS = ("gloo", "nccl")
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _loopback_listener(address: str, port: int) -> int:
    """The file descriptor of a TCP socket listening on loopback ``address:port``; the store that receives it owns
    it (and closes it) from then on."""
    family, host = (socket.AF_INET6, "::1") if address == "::1" else (socket.AF_INET, "127.0.0.1")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (the spelling trainers send in ``dtypes``)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"`` or ``"torch.bfloat16"`` → ``torch.bfloat16``; ``ValueError`` for anything else."""
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return value


def check_backend(backend: str) -> None:
    """Raise a ``ValueError`` / ``RuntimeError`` saying why ``backend`` cannot build a group in this process:
    an unknown name, or ``nccl`` without CUDA / without NCCL in this torch build."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not supported for weight updates (choose from {', '.join(BACKENDS)})")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend 'nccl' needs CUDA, but torch.cuda.is_available() is False on this machine "
                               "(use 'gloo' -- the tcp transport -- or the disk transport)")
        if not dist.is_nccl_available():
            raise RuntimeError("backend 'nccl' needs a torch build with NCCL; this one has none (use 'gloo')")


def group_store(store: Any, group_name: str, device_type: str) -> Any:
    """``store`` wrapped the way SGLang's end of a weight-update group wraps it, so both ends read and write the
    same keys: SGLang's ``init_custom_process_group`` prefixes the rendezvous store with ``group_name``, then
    torch's ``_new_process_group_helper`` adds ``"<group_name>/"`` and ``"<device type>/"`` (``cuda`` for NCCL)."""
    return dist.PrefixStore(f"{device_type}/", dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store)))


class WeightUpdateGroup:
    """One end of a weight-update process group (see the module doc). ``rank`` 0 serves the store.
    ``backend="nccl"`` needs CUDA (``device``: the CUDA device this rank uses; the current one by default)."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = DEFAULT_GROUP_NAME, backend: str = "gloo", timeout_s: float = 60.0,
                 device: torch.device | str | None = None) -> None:
        check_backend(backend)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}")
        self.master_address, self.master_port = master_address, int(master_port)
        self.rank, self.world_size = int(rank), int(world_size)
        self.group_name, self.backend = group_name, backend
        timeout = datetime.timedelta(seconds=timeout_s)
        # torch's store listens on every interface whatever address it is given; on loopback, hand it a socket
        # that listens on loopback only (the store serves unauthenticated reads and writes to whoever connects)
        listen_fd = _loopback_listener(master_address, self.master_port) if rank == 0 and master_address in _LOOPBACK else None
        self._store = dist.TCPStore(master_address, self.master_port, world_size, is_master=(rank == 0),
                                    timeout=timeout, wait_for_workers=False, master_listen_fd=listen_fd)
        prefix = group_store(self._store, group_name, "cuda" if backend == "nccl" else "cpu")
        if backend == "nccl":
            self.device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
            torch.cuda.set_device(self.device)
            nccl_options = dist.ProcessGroupNCCL.Options()
            nccl_options._timeout = timeout
            self._pg: Any = dist.ProcessGroupNCCL(prefix, self.rank, self.world_size, nccl_options)
            return
        self.device = torch.device("cpu")
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        if master_address in _LOOPBACK:
            options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        else:
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
        self._pg = dist.ProcessGroupGloo(prefix, self.rank, self.world_size, options)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, *, async_op: bool = False) -> Any:
        """Broadcast ``tensor`` (contiguous; CPU for gloo, CUDA for nccl) from ``src`` in place. Returns the
        tensor, or with ``async_op`` the pending work (``.is_completed()``, ``.wait()``)."""
        if self._pg is None:
            raise RuntimeError(f"weight update group {self.group_name!r} was destroyed")
        options = dist.BroadcastOptions()
        options.rootRank = int(src)
        work = self._pg.broadcast([tensor], options)
        if async_op:
            return work
        work.wait()
        return tensor

    def barrier(self) -> None:
        if self._pg is None:
            raise RuntimeError(f"weight update group {self.group_name!r} was destroyed")
        self._pg.barrier().wait()

    def destroy(self) -> None:
        pg, self._pg = self._pg, None
        if pg is not None:
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - best effort; older torch builds lack shutdown()
                pass
        self._store = None

    @property
    def alive(self) -> bool:
        return self._pg is not None

    def __repr__(self) -> str:
        return (f"WeightUpdateGroup({self.group_name!r}, rank {self.rank}/{self.world_size}, "
                f"{self.master_address}:{self.master_port}, {'alive' if self.alive else 'destroyed'})")


def flatten_tensors(tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """The bytes of ``tensors`` back to back in one contiguous ``uint8`` tensor (on the tensors' device), the
    payload of one ``flattened_bucket`` broadcast. ``out``: a ``uint8`` buffer at least that long to write into
    (reusing one avoids touching fresh memory on every call); the result is then its leading slice."""
    if not tensors:
        raise ValueError("cannot flatten an empty list of tensors")
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors]
    if out is None:
        return torch.cat(parts)
    total = sum(p.numel() for p in parts)
    if out.dtype != torch.uint8 or out.numel() < total:
        raise ValueError(f"out must be a uint8 tensor of at least {total} elements")
    if out.device.type != "cpu" or any(p.device.type != "cpu" for p in parts):
        return torch.cat(parts, out=out[:total])
    # on CPU a plain memcpy per tensor: torch's threaded copy stalls when its threads compete for busy cores
    dst, offset = out.numpy(), 0
    for part in parts:
        n = part.numel()
        dst[offset:offset + n] = part.numpy()
        offset += n
    return out[:total]


def unflatten_tensors(flat: torch.Tensor, dtypes: Sequence[torch.dtype], shapes: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Inverse of :func:`flatten_tensors`: tensors of the given dtypes / shapes read from ``flat`` (``uint8``),
    views where the offset is aligned to the element size, copies otherwise. ``ValueError`` when the sizes
    do not add up to ``flat``'s length."""
    sizes = [torch.Size(tuple(int(x) for x in shape)).numel() * torch.empty((), dtype=dtype).element_size()
             for dtype, shape in zip(dtypes, shapes)]
    if sum(sizes) != flat.numel():
        raise ValueError(f"the announced tensors take {sum(sizes)} bytes, the flattened bucket holds {flat.numel()}")
    out, offset = [], 0
    for dtype, shape, size in zip(dtypes, shapes, sizes):
        chunk = flat[offset:offset + size]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset % itemsize:
            chunk = chunk.clone()
        out.append(chunk.view(dtype).reshape(tuple(int(x) for x in shape)))
        offset += size
    return out


def tensor_digest(tensor: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's dtype, shape and raw bytes: equal digests mean bit-identical tensors (the
    digest the engines' ``/get_weights_checksum`` answers, see ``engines.admin_protocol.tensor_digest``)."""
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{dtype_name(t.dtype)}{list(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy())  # the tensor's own bytes: no copy (a 0.6 GB one at real widths)
    return h.hexdigest()


class GroupReceiver:
    """The engine's end of weight-update groups, injected into an engine by whoever composes engine and DCS.

    ``join`` builds this engine's :class:`WeightUpdateGroup` (``ValueError`` / ``RuntimeError`` when it cannot), or
    with ``backend="socket"`` (ours) connects a :class:`~relax_gym.trainer.dcs.wire.SocketEnd` to the actor's
    weight stream; ``receive`` takes one ``update_weights_from_distributed`` call's tensors off a group: one
    broadcast per tensor, or with ``load_format="flattened_bucket"`` one broadcast into a ``uint8`` buffer kept per
    group and reused (touching fresh memory for every bucket costs more than the copy itself); off a socket the
    bytes are read straight into the same buffers. Callers serialise receives per group. Picklable (it holds no
    state until it joins), so it can be handed to an engine in a child process."""

    load_formats = (FLATTENED_BUCKET,)
    backends = ("gloo", "nccl", SOCKET)  # what join takes (nccl where the engine's model is on CUDA)
    receives_into = True  # receive(..., out=buffer, stage=...): staged pushes keep each bucket in a buffer of their own

    def __init__(self) -> None:
        self._buffers: dict[int, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._buffers = {}

    def join(self, master_address: str, master_port: int, rank: int, world_size: int, *, group_name: str,
             backend: str, timeout_s: float, device: torch.device | str | None = None) -> WeightUpdateGroup | SocketEnd:
        if backend == SOCKET:
            return SocketEnd.connect(master_address, master_port, rank, group_name=group_name, timeout_s=timeout_s)
        return WeightUpdateGroup(master_address, master_port, rank, world_size, group_name=group_name,
                                 backend=backend, timeout_s=timeout_s, device=device if backend == "nccl" else None)

    def receive(self, group: WeightUpdateGroup | SocketEnd, dtypes: Sequence[str], shapes: Sequence[Sequence[int]],
                load_format: str | None = None, *, out: torch.Tensor | None = None,
                stage: tuple[str, int] | None = None) -> list[torch.Tensor]:
        """The announced tensors, received from rank 0. ``ValueError`` for an unknown dtype (nothing received).
        ``out``: with ``flattened_bucket``, the ``uint8`` buffer (on the group's device, at least the bucket's
        size) to receive into instead of the group's reused one, so the tensors outlive the next receive.
        ``stage``: the staged push (``stage_id``, ``seq``) the call belongs to, checked against a socket stream's
        header (a gloo broadcast carries none)."""
        stage_id, seq = stage if stage is not None else (None, 0)
        return self.receive_calls(group, [(dtypes, shapes, out)], load_format, stage_id=stage_id, first_seq=seq)[0]

    def receive_calls(self, group: WeightUpdateGroup | SocketEnd,
                      calls: Sequence[tuple[Sequence[str], Sequence[Sequence[int]], torch.Tensor | None]],
                      load_format: str | None = None, *, stage_id: str | None = None,
                      first_seq: int = 0) -> list[list[torch.Tensor]]:
        """Several calls at once, each ``(dtypes, shapes, out)`` as :meth:`receive` takes them (calls
        ``first_seq``, ``first_seq + 1``, ... of ``stage_id``): off a socket stream back to back with no hand-over
        between calls (every call of a staged push in one request), off a process group one after the other.
        ``ValueError`` for an unknown dtype or an ``out`` that does not fit (nothing received)."""
        flattened = load_format == FLATTENED_BUCKET
        specs = []
        for dtypes, shapes, out in calls:
            torch_dtypes = [dtype_from_name(d) for d in dtypes]
            dims = [tuple(int(s) for s in shape) for shape in shapes]
            if flattened:
                total = sum(torch.Size(d).numel() * torch.empty((), dtype=t).element_size() for t, d in zip(torch_dtypes, dims))
                if out is not None and (out.dtype != torch.uint8 or out.numel() < total or out.device != group.device):
                    raise ValueError(f"out must be a uint8 tensor of at least {total} bytes on {group.device}")
                specs.append((torch_dtypes, dims, out[:total] if out is not None else None, total))
            else:
                specs.append((torch_dtypes, dims, None, 0))
        if len(specs) > 1 and flattened and any(flat is None for _, _, flat, _ in specs):
            raise ValueError("receiving several flattened calls at once needs an out buffer for each")
        if not isinstance(group, SocketEnd):
            return [self._receive_one(group, dtypes, dims, flattened, flat, total)
                    for dtypes, dims, flat, total in specs]
        results: list[list[torch.Tensor]] = []
        wire: list[tuple[list[memoryview], int]] = []
        for dtypes, dims, flat, total in specs:
            if flattened:
                flat = flat if flat is not None else group.buffer(total)
                results.append([flat])
                wire.append(([byte_view(flat)], len(dims)))
            else:
                tensors = [torch.empty(dim, dtype=dtype, device=group.device) for dtype, dim in zip(dtypes, dims)]
                results.append(tensors)
                wire.append(([byte_view(t) for t in tensors], len(tensors)))
        group.receive_calls(wire, stage_id=stage_id, first_seq=first_seq)
        if flattened:
            return [unflatten_tensors(got[0], dtypes, dims) for got, (dtypes, dims, _, _) in zip(results, specs)]
        return results

    def _receive_one(self, group: WeightUpdateGroup, dtypes: Sequence[torch.dtype], dims: Sequence[tuple[int, ...]],
                     flattened: bool, flat: torch.Tensor | None, total: int) -> list[torch.Tensor]:
        if flattened:
            flat = flat if flat is not None else self._buffer(group, total)
            group.broadcast(flat, src=0)
            return unflatten_tensors(flat, dtypes, dims)
        return [group.broadcast(torch.empty(dim, dtype=dtype, device=group.device), src=0)
                for dtype, dim in zip(dtypes, dims)]

    def leave(self, group: WeightUpdateGroup | SocketEnd) -> None:
        self._buffers.pop(id(group), None)
        group.destroy()

    def _buffer(self, group: WeightUpdateGroup, nbytes: int) -> torch.Tensor:
        buf = self._buffers.get(id(group))
        if buf is None or buf.numel() < nbytes or buf.device != group.device:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=group.device)
            self._buffers[id(group)] = buf
        return buf[:nbytes]


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def init_weights_update_group_pair(client: Any, master_address: str, master_port: int, *, world_size: int = 2,
                                   rank_offset: int = 1, group_name: str = DEFAULT_GROUP_NAME,
                                   timeout_s: float = 60.0) -> WeightUpdateGroup:
    """Trainer side: ask the engine (``client``: the engine's HTTP client, e.g. ``EngineClient``) to
    join as ``rank_offset`` while this process joins as rank 0; returns the trainer's end. With ``world_size``
    above 2 the other engines must be asked to join (by their own clients) before this returns."""
    thread, box = _in_thread(lambda: client.init_weights_update_group(
        master_address, master_port, rank_offset, world_size, group_name=group_name, backend="gloo"))
    try:
        group = WeightUpdateGroup(master_address, master_port, 0, world_size, group_name=group_name, timeout_s=timeout_s)
    finally:
        thread.join(timeout_s)
    if "error" in box:
        raise box["error"]
    return group


def push_weights_distributed(client: Any, group: WeightUpdateGroup,
                             named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *,
                             weight_version: str | None = None, flush_cache: bool = True,
                             timeout_s: float = 300.0) -> Any:
    """Trainer side of one ``update_weights_from_distributed``: announce names / dtypes / shapes over HTTP (in a
    thread) and broadcast each tensor from rank 0 in that order. Returns the engine's response."""
    items = [(str(n), t.detach().to("cpu").contiguous()) for n, t in
             (named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)]
    names = [n for n, _ in items]
    dtypes = [dtype_name(t.dtype) for _, t in items]
    shapes = [list(t.shape) for _, t in items]
    thread, box = _in_thread(lambda: client.update_weights_from_distributed(
        names, dtypes, shapes, group_name=group.group_name, weight_version=weight_version, flush_cache=flush_cache))
    try:
        for _, tensor in items:
            group.broadcast(tensor, src=0)
    finally:
        thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"the engine did not answer update_weights_from_distributed within {timeout_s} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")
