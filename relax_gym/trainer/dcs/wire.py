"""The ``socket`` wire: a push's bytes over a plain TCP stream per engine, straight from the actor's tensors into the
engine's buffers.

A gloo broadcast costs a flatten copy on the actor (a bucket's tensors put back to back), gloo's own handling per
byte, and on the receiver whatever gloo does before the bytes land. Engines that advertise ``socket`` in
``/get_server_info``'s ``weight_update_backends`` (the embedded engine with the DCS's
:class:`~relax_gym.trainer.dcs.group.GroupReceiver`) take the ``tcp`` transport's calls over sockets instead:
the actor ``sendmsg``s the call's tensors as they are (scatter/gather over their memory, no flatten copy) and the
engine receives them with ``recv_into`` (``MSG_WAITALL``) right into the buffer it keeps them in (a staged push:
the staging buffer it later swaps in), so each byte is copied once by the kernel on each side, as in a raw
socket transfer.

**Streams.** Each engine gets ``streams`` connections (:data:`STREAMS`: one by default) and every call is cut into
that many contiguous byte ranges, one per stream, sent and received in parallel (a thread per stream on each side;
the copies themselves run in the kernel, outside the GIL; each stream takes its range of every call in turn, so
streams never wait for one another between calls). One TCP stream's sender and receiver mostly take turns, so on
an idle machine two streams move a raw buffer faster (~1.6x between two processes on two free cores); inside a
push on a busy two-core machine the extra threads cost what they save (``benchmarks/weight_sync.py`` shows both),
hence one by default.

**Who connects.** The actor (rank 0) listens on ``master_address`` -- the address a gloo group's store would use:
loopback when every engine is local, else the local address facing the engines -- on a port the kernel picks,
bound to that address only. SGLang's ``/init_weights_update_group`` with ``backend="socket"`` (ours) tells each
engine where; it connects and says hello (``group_name``, its rank, stream 0); the actor's welcome says how many
streams to open, and the engine opens the others the same way. Anything else that connects is closed.
``group_name`` is random (128 bits) and travels only over the engines' HTTP API, so it doubles as the streams'
password. Bytes flow from the actor to the engine only.

**Calls.** The calls are announced over HTTP (names, dtypes, shapes): a staged push all at once, in one
``/stage_weights_from_distributed`` request (ours) that the engine answers once it holds every call, so the calls
follow each other on the streams with no request, answer or thread hand-over between them; an unstaged call by
SGLang's ``/update_weights_from_distributed``, one at a time. On each stream a call is a 44-byte header -- magic,
the call's index on this stream, the bytes of its range, its tensor count, ``seq`` and a 16-byte tag of
``stage_id`` -- then its range of the tensors' bytes back to back in the announced order (the ``flattened_bucket``
layout, whatever the ``load_format``). The engine checks every header against the call it expects before
receiving a byte; a mismatch (an actor and engine out of step) closes the streams and fails the call. The
engine's HTTP answer is the acknowledgement.

**Failures.** A send or receive that fails (the peer died: reset / end of stream) or makes no progress for
``timeout_s`` raises :class:`WireError` (``rank``: the engine whose stream failed, on the actor's side) and closes
that engine's streams; the actor's sends come back every ``POLL_S`` seconds to run the caller's ``check`` (the DCS
watches the engines' HTTP answers there, so an engine that refuses a call fails the push at once instead of after
a timeout). Closed streams are not reopened: the DCS forms new ones at the next push.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import torch

__all__ = ["SOCKET", "STREAMS", "SocketEnd", "SocketWire", "WireError", "byte_view", "split_bytes", "stage_tag"]

SOCKET = "socket"  # the backend name of /init_weights_update_group for this wire
STREAMS = 1  # connections per engine (more: a call's bytes are cut into that many ranges, moved in parallel)
MAX_STREAMS = 16
POLL_S = 0.05  # how often a blocked send returns to run the caller's check
HELLO_S = 5.0  # how long a new connection has to say hello before it is closed
_HEADER = struct.Struct("!4sQQII16s")  # magic, index, nbytes (of this stream's range), count, seq, stage tag
_HELLO = struct.Struct("!4sIHH")  # magic, rank, stream, len(group_name); then group_name
_WELCOME = struct.Struct("!4sH")  # magic, streams
_CALL, _HI, _OK = b"RXW1", b"RXWH", b"RXWK"
_NO_SEQ = 0xFFFFFFFF
_IOV_MAX = 512  # buffers per sendmsg (the kernel takes at most IOV_MAX, 1024 on Linux)
_MAX_NAME = 1024
_ALIGN = 4096  # range boundaries fall on page multiples of the call's bytes


class WireError(RuntimeError):
    """A stream failed (its peer is gone, it stalled, or the two ends are out of step). ``rank``: the engine whose
    stream it is (None on the engine's side)."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


def stage_tag(stage_id: str | None) -> bytes:
    """The 16 bytes that name a staged push on the stream (zeros for an unstaged call)."""
    return hashlib.sha256(stage_id.encode()).digest()[:16] if stage_id is not None else bytes(16)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a CPU tensor as a flat ``memoryview`` over its memory (no copy when it is contiguous on the CPU;
    a contiguous CPU copy otherwise)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def split_bytes(buffers: Sequence[memoryview], parts: int) -> list[list[memoryview]]:
    """``buffers`` (their bytes back to back) cut into ``parts`` contiguous ranges, each a list of slices; the
    boundaries fall on multiples of 4 KiB (the last range takes the rest, a range may be empty)."""
    total = sum(b.nbytes for b in buffers)
    cuts = [min(total, (total * i // parts) // _ALIGN * _ALIGN) for i in range(parts)] + [total]
    out: list[list[memoryview]] = [[] for _ in range(parts)]
    offset = 0
    for buf in buffers:
        start, end = offset, offset + buf.nbytes
        for p in range(parts):
            lo, hi = max(start, cuts[p]), min(end, cuts[p + 1])
            if lo < hi:
                out[p].append(buf[lo - start:hi - start])
        offset = end
    return out


def _timeval(seconds: float) -> bytes:
    whole = int(seconds)
    return struct.pack("@ll", whole, int((seconds - whole) * 1e6))


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
    except OSError:
        pass
    sock.close()


def _recv_exact(sock: socket.socket, view: memoryview, timeout_s: float, what: str) -> None:
    """Fill ``view`` from ``sock`` (blocking, ``SO_RCVTIMEO`` set); ``WireError`` when the stream ends or brings
    no byte for ``timeout_s``."""
    got, size = 0, len(view)
    last = time.monotonic()
    while got < size:
        try:
            n = sock.recv_into(view[got:], size - got, socket.MSG_WAITALL)
        except (BlockingIOError, TimeoutError):  # SO_RCVTIMEO expired with nothing read
            n = -1
        except OSError as exc:
            raise WireError(f"{what}: {type(exc).__name__}: {exc}") from exc
        if n == 0:
            raise WireError(f"{what}: the peer closed the stream after {got} of {size} bytes")
        if n > 0:
            got, last = got + n, time.monotonic()
        elif time.monotonic() - last > timeout_s:
            raise WireError(f"{what}: no byte arrived for {timeout_s:g} s ({got} of {size} bytes in)")


def _recv_timeout(conn: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a socket that has a Python timeout set (``TimeoutError`` / ``OSError`` otherwise)."""
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError("closed during the hello")
        got += n


def _run(jobs: Sequence[Callable[[], None]], pool: ThreadPoolExecutor | None,
         check: Callable[[], None] | None) -> None:
    """Run ``jobs`` (the last in this thread, the others on ``pool``) and wait for all; the first error is raised.
    ``check`` runs every ``POLL_S`` seconds while the pool's jobs are still running."""
    futures: list[Future] = [pool.submit(job) for job in jobs[:-1]] if pool is not None else []
    try:
        jobs[-1]()
    finally:
        while futures:
            done, pending = wait(futures, timeout=POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                if future.exception() is not None:
                    raise future.exception()
            futures = list(pending)
            if futures and check is not None:
                check()


class SocketWire:
    """The actor's end: listens on ``address`` for the engines of ``ranks``, ``streams`` connections each, then
    sends them each call.

    ``accept`` waits for every engine's streams; ``send`` puts one call on every stream (a thread per stream when
    there is more than one); ``destroy`` closes everything. ``timeout_s`` bounds each step."""

    device = torch.device("cpu")

    def __init__(self, address: str, ranks: Sequence[int], *, group_name: str, timeout_s: float = 120.0,
                 streams: int = STREAMS) -> None:
        if not 1 <= int(streams) <= MAX_STREAMS:
            raise ValueError(f"streams must be in 1..{MAX_STREAMS}, got {streams}")
        self.address, self.group_name, self.timeout_s = address, group_name, float(timeout_s)
        self.ranks = tuple(int(r) for r in ranks)
        self.streams = int(streams)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener: socket.socket | None = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.bind((address, 0))  # this address only, a port the kernel picks
            self._listener.listen(max(8, 2 * len(self.ranks) * self.streams))
        except OSError:
            self._listener.close()
            raise
        self.port = int(self._listener.getsockname()[1])
        self._conns: dict[tuple[int, int], socket.socket] = {}  # (rank, stream) -> connection
        self._index = 0
        self._senders: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def missing(self) -> list[int]:
        """Ranks with a stream not connected yet."""
        return [r for r in self.ranks if any((r, s) not in self._conns for s in range(self.streams))]

    def accept(self, deadline: float, check: Callable[[], None] | None = None) -> None:
        """Welcome every expected stream by ``deadline`` (``time.monotonic()``), running ``check`` between
        attempts; ``WireError`` naming the first rank missing a stream on timeout. Connections that do not say a
        valid hello for a stream still expected are closed. The listener is closed once all are in."""
        listener = self._listener
        if listener is None:
            raise WireError(f"weight stream {self.group_name!r} was closed")
        listener.settimeout(POLL_S)
        while self.missing:
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise WireError(f"rank(s) {self.missing} did not connect to {self.address}:{self.port} within "
                                f"{self.timeout_s:g} s", rank=self.missing[0])
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._closed:
                    raise WireError(f"weight stream {self.group_name!r} was closed") from exc
                raise
            key = self._hello(conn, min(deadline, time.monotonic() + HELLO_S))
            if key is None:
                _close(conn)
                continue
            _tune(conn)
            conn.settimeout(None)  # blocking; SO_SNDTIMEO brings a stalled send back every POLL_S
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(POLL_S))
            self._conns[key] = conn
        self._listener = None
        listener.close()

    def _hello(self, conn: socket.socket, deadline: float) -> tuple[int, int] | None:
        """The (rank, stream) a new connection says hello as, once welcomed; None for anything else."""
        try:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            head = bytearray(_HELLO.size)
            _recv_timeout(conn, memoryview(head))
            magic, rank, stream, length = _HELLO.unpack(head)
            if magic != _HI or length > _MAX_NAME:
                return None
            name = bytearray(length)
            _recv_timeout(conn, memoryview(name))
            if (not hmac.compare_digest(bytes(name), self.group_name.encode()) or rank not in self.ranks
                    or stream >= self.streams or (rank, stream) in self._conns):
                return None
            conn.sendall(_WELCOME.pack(_OK, self.streams))
            return int(rank), int(stream)
        except OSError:
            return None

    def send(self, tensors: Sequence[torch.Tensor], *, stage: tuple[str, int] | None = None,
             check: Callable[[], None] | None = None) -> int:
        """Put one call on every engine's streams (``stage``: the staged push's id and the call's ``seq``); see
        :meth:`send_calls`. Returns the call's bytes."""
        stage_id, seq = stage if stage is not None else (None, 0)
        return self.send_calls([tensors], stage_id=stage_id, first_seq=seq, check=check)

    def send_calls(self, calls: Sequence[Sequence[torch.Tensor]], *, stage_id: str | None = None, first_seq: int = 0,
                   check: Callable[[], None] | None = None) -> int:
        """Put calls on every engine's streams: each call's tensors' bytes back to back, cut into one range per
        stream, each range after a header (with ``stage_id``: calls ``first_seq``, ``first_seq + 1``, ... of that
        staged push). Each stream sends its range of every call in turn (a thread per stream when there is more
        than one), so no stream waits for another between calls. Returns the bytes of the calls. ``check`` runs
        while the sends wait (what it raises is raised here). ``WireError`` naming the engine whose stream failed
        or stalled for ``timeout_s``; the wire is then unusable."""
        if self._closed or self.missing:
            raise WireError(f"weight stream {self.group_name!r} is {'closed' if self._closed else 'not connected'}")
        tag = stage_tag(stage_id)
        per_stream: list[list[memoryview]] = [[] for _ in range(self.streams)]
        nbytes = 0
        for k, tensors in enumerate(calls):
            views = [v for v in (byte_view(t) for t in tensors) if v.nbytes]
            nbytes += sum(v.nbytes for v in views)
            seq = first_seq + k if stage_id is not None else _NO_SEQ
            for s, part in enumerate(split_bytes(views, self.streams)):
                header = _HEADER.pack(_CALL, self._index + k, sum(v.nbytes for v in part), len(tensors), seq, tag)
                per_stream[s] += [memoryview(header), *part]
        self._index += len(calls)
        if len(self.ranks) * self.streams == 1:
            ((rank, _),) = self._conns
            self._send_to(rank, self._conns[(rank, 0)], per_stream[0], check)
            return nbytes
        jobs = [lambda r=rank, c=self._conns[(rank, s)], b=per_stream[s]: self._send_to(r, c, b, None)
                for rank in self.ranks for s in range(self.streams)]
        if self._senders is None:
            self._senders = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="dcs-wire")
        _run([*jobs, lambda: None], self._senders, check)  # every job on the pool: this thread watches and waits
        return nbytes

    def _send_to(self, rank: int, conn: socket.socket, buffers: Sequence[memoryview], check: Callable[[], None] | None) -> None:
        bufs = list(buffers)
        i, stalled_since = 0, time.monotonic()
        while i < len(bufs):
            try:
                n = conn.sendmsg(bufs[i:i + _IOV_MAX])
            except (BlockingIOError, TimeoutError):  # SO_SNDTIMEO expired before a byte went out
                n = 0
            except OSError as exc:
                raise WireError(f"the weight stream to rank {rank} broke: {type(exc).__name__}: {exc}", rank=rank) from exc
            if n:
                stalled_since = time.monotonic()
            while n and i < len(bufs):
                if n >= bufs[i].nbytes:
                    n -= bufs[i].nbytes
                    i += 1
                else:
                    bufs[i], n = bufs[i][n:], 0
            if i < len(bufs):
                if check is not None:
                    check()
                if self._closed:
                    raise WireError(f"weight stream {self.group_name!r} was closed while sending", rank=rank)
                if time.monotonic() - stalled_since > self.timeout_s:
                    raise WireError(f"rank {rank} took no bytes of the weight stream for {self.timeout_s:g} s", rank=rank)

    def destroy(self) -> None:
        """Close the listener and every stream (an engine blocked on its stream sees it end)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for conn in self._conns.values():
            _close(conn)
        if self._senders is not None:
            self._senders.shutdown(wait=False)

    def __repr__(self) -> str:
        return (f"SocketWire({self.group_name!r}, {self.address}:{self.port}, ranks {list(self.ranks)} x "
                f"{self.streams} streams, {'alive' if self.alive else 'closed'})")


class SocketEnd:
    """An engine's end of a weight stream (what :class:`~relax_gym.trainer.dcs.group.GroupReceiver` joins with
    ``backend="socket"``): :meth:`connect` (all the streams the actor asks for), then :meth:`receive` each call in
    order; :meth:`destroy`."""

    device = torch.device("cpu")

    def __init__(self, socks: Sequence[socket.socket], *, group_name: str, rank: int, timeout_s: float) -> None:
        self._socks: list[socket.socket] | None = list(socks)
        self.group_name, self.rank, self.timeout_s = group_name, int(rank), float(timeout_s)
        self.streams = len(self._socks)
        self._index = 0
        self._buffer: torch.Tensor | None = None  # reused for calls that bring no buffer of their own
        self._helpers = (ThreadPoolExecutor(max_workers=self.streams - 1, thread_name_prefix="dcs-wire-rx")
                         if self.streams > 1 else None)

    @classmethod
    def connect(cls, address: str, port: int, rank: int, *, group_name: str, timeout_s: float = 120.0) -> SocketEnd:
        """Connect every stream of the actor's wire as ``rank`` (``WireError`` otherwise, within ``timeout_s``)."""
        name = group_name.encode()
        if len(name) > _MAX_NAME:
            raise WireError(f"group_name is longer than {_MAX_NAME} bytes")
        socks: list[socket.socket] = []
        try:
            streams = 1
            while len(socks) < streams:
                sock, streams = cls._open(address, port, rank, len(socks), name, timeout_s)
                socks.append(sock)
                if not 1 <= streams <= MAX_STREAMS:
                    raise WireError(f"the weight stream at {address}:{port} asked for {streams} streams")
        except BaseException:
            for sock in socks:
                _close(sock)
            raise
        return cls(socks, group_name=group_name, rank=rank, timeout_s=timeout_s)

    @staticmethod
    def _open(address: str, port: int, rank: int, stream: int, name: bytes, timeout_s: float) -> tuple[socket.socket, int]:
        try:
            sock = socket.create_connection((address, int(port)), timeout=timeout_s)
        except OSError as exc:
            raise WireError(f"could not connect to the weight stream at {address}:{port}: {exc}") from exc
        try:
            _tune(sock)
            sock.sendall(_HELLO.pack(_HI, int(rank), stream, len(name)) + name)
            welcome = bytearray(_WELCOME.size)
            _recv_timeout(sock, memoryview(welcome))
            magic, streams = _WELCOME.unpack(welcome)
            if magic != _OK:
                raise ConnectionError(f"unexpected answer {bytes(welcome)!r}")
            sock.settimeout(None)  # blocking; SO_RCVTIMEO bounds each wait
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(min(timeout_s, 1.0)))
        except OSError as exc:
            _close(sock)
            raise WireError(f"the weight stream at {address}:{port} did not welcome rank {rank} (stream {stream}): "
                            f"{exc}") from exc
        return sock, int(streams)

    @property
    def alive(self) -> bool:
        """Open, and the actor has not closed its end (streams the actor dropped, or whose actor died, are closed
        here when this is asked)."""
        socks = self._socks
        if socks is None:
            return False
        try:
            ended = socks[0].recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):  # nothing to read: open
            return True
        except OSError:
            ended = True
        if ended:
            self.destroy()
        return not ended

    def buffer(self, nbytes: int) -> torch.Tensor:
        """A ``uint8`` buffer of at least ``nbytes`` kept by this end (reused call after call)."""
        if self._buffer is None or self._buffer.numel() < nbytes:
            self._buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self._buffer[:nbytes]

    def receive(self, buffers: Sequence[memoryview], *, count: int, stage: tuple[str, int] | None = None) -> None:
        """Receive the next call into ``buffers`` (filled in order; their sizes add up to the call's bytes); see
        :meth:`receive_calls` (``stage``: the staged push's id and the call's ``seq``)."""
        stage_id, seq = stage if stage is not None else (None, 0)
        self.receive_calls([(buffers, count)], stage_id=stage_id, first_seq=seq)

    def receive_calls(self, calls: Sequence[tuple[Sequence[memoryview], int]], *, stage_id: str | None = None,
                      first_seq: int = 0) -> None:
        """Receive the next ``len(calls)`` calls, each ``(buffers, count)``: filled in order, after checking every
        header (this end's next call, ``count`` tensors, the range's bytes, and with ``stage_id`` that staged push's
        call ``first_seq + k``). Each stream's thread takes its range of every call in turn, so the streams never
        wait for one another between calls. ``WireError`` (the streams are closed then) on a mismatch, an ended
        stream, or no byte for ``timeout_s``."""
        socks = self._socks
        if socks is None:
            raise WireError(f"the weight stream of group {self.group_name!r} is closed (a new group is formed at the next push)")
        tag = stage_tag(stage_id)
        ranges = [split_bytes([b.cast("B") if b.format != "B" else b for b in buffers], len(socks)) for buffers, _ in calls]
        base = self._index
        first: list[BaseException] = []  # the failure that broke the calls (the other streams fail after it)

        def take(s: int) -> None:
            try:
                for k, (_, count) in enumerate(calls):
                    head = bytearray(_HEADER.size)
                    _recv_exact(socks[s], memoryview(head), self.timeout_s, f"waiting for call {base + k}'s header")
                    got = _HEADER.unpack(head)
                    seq = first_seq + k if stage_id is not None else _NO_SEQ
                    want = (_CALL, base + k, sum(p.nbytes for p in ranges[k][s]), int(count), seq, tag)
                    if got != want:
                        raise WireError(f"the weight stream is out of step with the request: it carries "
                                        f"{_describe(got)}, the request announced {_describe(want)}")
                    for part in ranges[k][s]:
                        _recv_exact(socks[s], part, self.timeout_s, f"receiving call {base + k}")
            except BaseException as exc:
                first.append(exc)
                self.destroy()  # out of step or broken: these streams carry nothing more (and the others stop)
                raise

        try:
            _run([lambda s=s: take(s) for s in range(1, len(socks))] + [lambda: take(0)], self._helpers, None)
        except BaseException as exc:
            self.destroy()
            if first and first[0] is not exc:
                raise first[0] from None
            raise
        self._index += len(calls)

    def destroy(self) -> None:
        socks, self._socks = self._socks, None
        for sock in socks or ():
            _close(sock)
        if self._helpers is not None:
            self._helpers.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"SocketEnd({self.group_name!r}, rank {self.rank}, {self.streams} streams, {'alive' if self.alive else 'closed'})"


def _describe(header: tuple) -> str:
    magic, index, nbytes, count, seq, tag = header
    if magic != _CALL:
        return f"no call header (magic {magic!r})"
    where = "unstaged" if seq == _NO_SEQ else f"seq {seq} of stage {tag.hex()[:8]}"
    return f"call {index} ({count} tensors, {nbytes} bytes, {where})"
