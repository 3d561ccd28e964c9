"""A virtual-time asyncio event loop: ``loop.time()`` is a simulated clock that jumps to the next timer.

    from relax_gym.trainer.plan.clock import run_virtual

    async def main():
        await asyncio.sleep(3600)                   # returns at once in wall time
        return asyncio.get_running_loop().time()    # 3600.0

    assert run_virtual(main()) == 3600.0

Code written for asyncio runs unchanged on it: ``asyncio.sleep``, ``call_later``, ``wait_for`` timeouts,
``Condition`` / ``Event`` / ``Queue`` wake-ups all use the loop's clock. When no callback is ready the loop does
not sleep: it moves its clock to the earliest timer and runs it. So an hour of simulated work takes the CPU time
of its callbacks, and the same program gives the same order of events on every run (asyncio runs ready callbacks
in FIFO order and timers in time order, ties in an order fixed by its heap operations; nothing here depends on
wall time).

What the loop refuses, because its result would arrive at a wall-clock moment that means nothing on the virtual
clock (and would make runs differ): threads (``run_in_executor``, hence ``asyncio.to_thread``), sockets, pipes,
subprocesses, DNS, file-descriptor readers and writers. Each raises :class:`VirtualTimeError` naming the call.
Blocking calls that bypass the loop (``time.sleep``, a blocking read) cannot be detected: they cost wall time and
no virtual time. ``time.monotonic()`` / ``time.perf_counter()`` keep reading the real clock: code that measures
durations with them (instead of ``loop.time()``) measures wall time.

A program in which every task waits and no timer is set can never continue (a missing wake-up): the loop raises
:class:`VirtualDeadlock` instead of hanging.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualDeadlock", "VirtualTimeError", "VirtualTimeLoop", "loop_time", "run_virtual"]

T = TypeVar("T")


class VirtualTimeError(RuntimeError):
    """A call that needs real time (a thread, a socket, a subprocess) was made on a virtual-time loop."""


class VirtualDeadlock(RuntimeError):
    """Every task waits, nothing is ready and no timer is set: the program cannot continue."""


class _VirtualSelector(selectors.BaseSelector):
    """The loop's selector: a real one for the loop's own wake-up pipe (``call_soon_threadsafe``), polled without
    blocking; a wait of ``timeout`` seconds advances the loop's virtual clock instead of sleeping."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._real.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise VirtualDeadlock(
                f"virtual-time deadlock at t={self.loop.time() if self.loop else float('nan'):.6f}s: every task "
                f"waits, no callback is ready and no timer is set (a missing wake-up, or a wait on something that "
                f"only real time would bring)")
        assert self.loop is not None
        self.loop._advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):  # type: ignore[misc,valid-type]
    """An asyncio loop on a virtual clock starting at ``start`` seconds (see the module docstring)."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _VirtualSelector()
        self._now = float(start)
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def _advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    # -- what needs real time -------------------------------------------------------------------------------------

    def _refuse(self, what: str) -> VirtualTimeError:
        return VirtualTimeError(f"{what} on a virtual-time loop: its answer would come at a wall-clock moment that "
                                f"means nothing on the virtual clock (simulate it with a sleep of its cost instead)")

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:
        inner = func.args[0] if isinstance(func, functools.partial) and func.args else func  # to_thread's ctx.run(f)
        name = getattr(inner, "__qualname__", repr(inner))
        raise self._refuse(f"run_in_executor({name}) (a thread: asyncio.to_thread, loop.run_in_executor)")

    def set_default_executor(self, executor: Any) -> None:
        raise self._refuse("set_default_executor")

    def add_reader(self, fd: Any, callback: Any, *args: Any) -> None:
        raise self._refuse("add_reader (waiting on a file descriptor)")

    def add_writer(self, fd: Any, callback: Any, *args: Any) -> None:
        raise self._refuse("add_writer (waiting on a file descriptor)")

    async def getaddrinfo(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("getaddrinfo (DNS)")

    async def getnameinfo(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("getnameinfo (DNS)")

    async def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("create_connection (a socket)")

    async def create_server(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("create_server (a socket)")

    async def create_datagram_endpoint(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("create_datagram_endpoint (a socket)")

    async def create_unix_connection(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("create_unix_connection (a socket)")

    async def create_unix_server(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("create_unix_server (a socket)")

    async def connect_accepted_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("connect_accepted_socket (a socket)")

    async def connect_read_pipe(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("connect_read_pipe (a pipe)")

    async def connect_write_pipe(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("connect_write_pipe (a pipe)")

    async def subprocess_exec(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("subprocess_exec (a subprocess)")

    async def subprocess_shell(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("subprocess_shell (a subprocess)")

    async def sock_recv(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_recv (a socket)")

    async def sock_recv_into(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_recv_into (a socket)")

    async def sock_sendall(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_sendall (a socket)")

    async def sock_connect(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_connect (a socket)")

    async def sock_accept(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_accept (a socket)")

    async def sock_sendfile(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sock_sendfile (a socket)")

    async def sendfile(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("sendfile (a socket)")


def run_virtual(main: Coroutine[Any, Any, T], *, start: float = 0.0, debug: bool | None = None) -> T:
    """``asyncio.run`` on a :class:`VirtualTimeLoop` whose clock starts at ``start``: run ``main`` to the end,
    cancel the tasks it left, close the loop."""
    with asyncio.Runner(debug=debug, loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main)


def loop_time() -> float:
    """The running loop's clock: on a :class:`VirtualTimeLoop` its virtual seconds. What the planner hands the
    controller (and its supervisor, carry feeder and schedule) as their clock."""
    return asyncio.get_running_loop().time()
