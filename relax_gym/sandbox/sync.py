"""Synchronous access to the async sandbox API: one background event loop thread per process.

Gymnasium environments are synchronous; sandboxes and pools are async. ``run(coro)`` executes a coroutine on the
shared loop and waits for it, so sandboxes created from sync code all live on one loop (and one pool can serve
every env in the process). ``SyncSandbox`` is the blocking twin of :class:`~relax_gym.sandbox.base.Sandbox`.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from relax_gym.sandbox.base import ExecResult, Sandbox

T = TypeVar("T")
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed():
            _loop = asyncio.new_event_loop()
            _thread = threading.Thread(target=_loop.run_forever, name="relax-gym-sandbox-loop", daemon=True)
            _thread.start()
        return _loop


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coro`` on the shared loop and return its result (re-raising its exception)."""
    the_loop = loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is the_loop:
        coro.close()
        raise RuntimeError("relax_gym.sandbox.sync.run() called from the sandbox loop itself: await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, the_loop).result(timeout)


class SyncSandbox:
    """Blocking wrapper: same methods as Sandbox, without ``await``."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    @property
    def id(self) -> str:
        return self.sandbox.id

    def exec(self, cmd: str | list[str], timeout: float | None = None, stdin: bytes | str | None = None) -> ExecResult:
        return run(self.sandbox.exec(cmd, timeout, stdin))

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        run(self.sandbox.write_file(path, data, mode))

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        return run(self.sandbox.read_file(path, max_bytes))

    def reset(self) -> None:
        run(self.sandbox.reset())

    def close(self) -> None:
        run(self.sandbox.close())

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop_loop() -> None:
    """Stop the shared loop, wait for its thread to leave ``run_forever`` and close the loop (an open loop warns
    "unclosed event loop" when it is collected)."""
    with _lock:
        the_loop, thread = _loop, _thread
    if the_loop is None or the_loop.is_closed():
        return
    the_loop.call_soon_threadsafe(the_loop.stop)
    if thread is not None:
        thread.join(timeout=5.0)
    if not the_loop.is_running():
        the_loop.close()


atexit.register(_stop_loop)
