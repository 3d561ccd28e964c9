"""The host's end of a docker sandbox's command channel: requests to its PID 1 (:mod:`docker_init`) over the
container's attached stdin/stdout, one socket per sandbox, kept open for the sandbox's life.

A command costs one write and the reads of its output (~0.2 ms of channel time) instead of the three engine calls
and the ``runc exec`` of a ``docker exec`` (~60-80 ms, much of it CPU in dockerd, containerd and runc).

Wire format (see :mod:`relax_gym.sandbox.docker_init`): requests ``>II`` (total length, JSON length) + JSON head +
body; answers arrive inside docker's stream frames (8-byte headers; stream 1 is PID 1's stdout, stream 2 its
stderr, which we only log) as ``>cI`` messages: ``o`` / ``e`` output chunks, then one ``d`` JSON status.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from typing import Any

from relax_gym.sandbox.base import OutputCap

log = logging.getLogger(__name__)

REQ = struct.Struct(">II")
MSG = struct.Struct(">cI")
FRAME = 8  # docker's stream frame header: stream id, 3 zero bytes, big-endian size
CLOSE_WAIT_S = 10.0  # how long close() waits for a woken call to leave before it leaves the closing to that call
INIT_SOURCE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docker_init.py")


class ChannelBroken(Exception):
    """The channel failed (the socket closed or a reply never came); the sandbox may be gone."""


class ChannelClosed(ChannelBroken):
    """The host closed the channel (the sandbox is being removed) while a call waited on it."""


@functools.lru_cache(maxsize=1)
def init_source() -> str:
    """The in-container program, passed to ``python3 -c``: without docstrings and comments, so PID 1's command
    line (what ``ps`` and ``/proc/1/cmdline`` show) stays short."""
    with open(INIT_SOURCE_FILE, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body[0] = ast.Pass()
    return ast.unparse(tree)


def request(head: dict[str, Any], body: bytes = b"") -> bytes:
    data = json.dumps(head).encode()
    return REQ.pack(len(data) + len(body), len(data)) + data + body


class Channel:
    """One attached socket to a sandbox's PID 1. ``call`` is one request and its answer; callers serialise."""

    def __init__(self, sock: Any, name: str) -> None:
        self._holder = sock  # the SDK's wrapper: keep it alive with the socket it wraps
        self.sock: socket.socket = getattr(sock, "_sock", sock)
        self.sock.setblocking(False)
        self.name = name
        self.broken = False
        self.closed_here = False  # close() was called (not a failure of the sandbox's end)
        self._frames = bytearray()  # docker-framed bytes not yet split
        self._msgs = bytearray()  # our protocol's bytes (stream 1) not yet parsed
        self._err = bytearray()
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the channel for good, also from another thread while a call waits on it: the socket is shut down
        first, so that call wakes at once (end of stream) and raises :class:`ChannelClosed`; only then is it
        closed (closing a descriptor that another thread polls leaves that poll blind until its deadline)."""
        self.closed_here = self.broken = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._lock.acquire(timeout=CLOSE_WAIT_S):  # else the call's own thread closes it on its way out
            try:
                self._close_now()
            finally:
                self._lock.release()

    def _close_now(self) -> None:
        self.broken = True
        # the SDK's HTTP response first: closed after its socket, it fails to flush when collected ("Exception
        # ignored in: <HTTPResponse ...> ValueError: I/O operation on closed file")
        for closable in (getattr(self._holder, "_response", None), self._holder, self.sock):
            try:
                if closable is not None:
                    closable.close()
            except (OSError, ValueError):
                pass

    def call(self, head: dict[str, Any], body: bytes = b"", *, out: OutputCap | None = None,
             err: OutputCap | None = None, reply_by: float, cancel: threading.Event | None = None,
             on_cancel: bytes | None = None) -> dict[str, Any]:
        """Send one request, feed ``o`` / ``e`` chunks to ``out`` / ``err``, return the ``d`` status. ``reply_by``
        (monotonic) is when to give up on the sandbox; a set ``cancel`` sends ``on_cancel`` (a kill request) once.
        Raises :class:`ChannelBroken` (:class:`ChannelClosed` when :meth:`close` was called); the channel is then
        unusable."""
        with self._lock:
            try:
                self._check_open()
                return self._call(request(head, body), out, err, reply_by, cancel, on_cancel)
            except ChannelBroken:
                self.broken = True
                raise
            except OSError as e:
                self.broken = True
                raise (ChannelClosed if self.closed_here else ChannelBroken)(f"channel to {self.name}: {e}") from e
            finally:
                if self.broken:  # this call failed, or close() ran in another thread (the socket only shut down)
                    self._close_now()

    def _check_open(self) -> None:
        if self.closed_here:
            raise ChannelClosed(f"channel to {self.name} is closed")
        if self.broken:
            raise ChannelBroken(f"channel to {self.name} is broken")

    def _call(self, data: bytes, out: OutputCap | None, err: OutputCap | None, reply_by: float,
              cancel: threading.Event | None, on_cancel: bytes | None) -> dict[str, Any]:
        pending = memoryview(data)
        poller = select.poll()
        poller.register(self.sock, select.POLLIN | select.POLLOUT)
        cancelled = False
        while True:
            self._check_open()
            if cancel is not None and cancel.is_set() and not cancelled and on_cancel:
                cancelled = True
                pending = memoryview(bytes(pending) + on_cancel)
                poller.modify(self.sock, select.POLLIN | select.POLLOUT)
            left = reply_by - time.monotonic()
            if left <= 0:
                raise ChannelBroken(f"no answer from {self.name} in time")
            events = 0
            for _, ev in poller.poll(min(left, 0.25) * 1000):
                events |= ev
            if events & select.POLLOUT and pending:
                try:
                    pending = pending[self.sock.send(pending[: 1 << 20]):]
                except BlockingIOError:
                    pass
                if not pending:
                    poller.modify(self.sock, select.POLLIN)
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                try:
                    chunk = self.sock.recv(1 << 18)
                except BlockingIOError:
                    continue
                if not chunk:
                    self._check_open()
                    raise ChannelBroken(f"{self.name} closed its channel")
                self._feed(chunk)
                status = self._deliver(out, err)
                if status is not None:
                    if pending:  # the answer came before the whole request went out (e.g. a kill never sent)
                        self._finish_send(pending, reply_by)
                    return status

    def _finish_send(self, pending: memoryview, reply_by: float) -> None:
        poller = select.poll()  # not select(): a busy process has descriptors above FD_SETSIZE
        poller.register(self.sock, select.POLLOUT)
        while pending:
            if time.monotonic() > reply_by:
                raise ChannelBroken(f"cannot write to {self.name}")
            poller.poll(250)
            try:
                pending = pending[self.sock.send(pending):]
            except BlockingIOError:
                pass

    def _feed(self, chunk: bytes) -> None:
        buf = self._frames
        buf += chunk
        pos = 0
        while len(buf) - pos >= FRAME:
            size = int.from_bytes(buf[pos + 4 : pos + 8], "big")
            if len(buf) - pos - FRAME < size:
                break
            payload = buf[pos + FRAME : pos + FRAME + size]
            if buf[pos] == 1:
                self._msgs += payload
            else:
                self._log_stderr(payload)
            pos += FRAME + size
        if pos:
            del buf[:pos]

    def _log_stderr(self, payload: bytes) -> None:
        self._err += payload
        *lines, rest = self._err.split(b"\n")
        self._err = bytearray(rest)
        for line in lines:
            log.warning("sandbox %s init: %s", self.name, line.decode(errors="replace"))

    def _deliver(self, out: OutputCap | None, err: OutputCap | None) -> dict[str, Any] | None:
        msgs = self._msgs
        pos = 0
        status = None
        while status is None and len(msgs) - pos >= MSG.size:
            kind, size = MSG.unpack_from(msgs, pos)
            if len(msgs) - pos - MSG.size < size:
                break
            payload = bytes(msgs[pos + MSG.size : pos + MSG.size + size])
            pos += MSG.size + size
            if kind == b"d":
                status = json.loads(payload)
            else:
                sink = out if kind == b"o" else err
                if sink is not None:
                    sink.feed(payload)
        if pos:
            del msgs[:pos]
        return status
