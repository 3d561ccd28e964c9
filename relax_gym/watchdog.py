"""A parent-death watchdog for the processes relax-gym starts (SGLang servers, env servers, engine processes,
graders, agent programs): when the process that started them dies, even by SIGKILL, they die too.

``guard(child)`` hands the child's pid to one small watchdog process per parent process (started on first use). The
watchdog holds a pidfd per guarded child and reads the parent's registrations on a pipe. When the parent dies, the
pipe's write end closes (and, should a forked child still hold a copy of it, the watchdog's parent pid changes to
the reaper's): the watchdog then SIGKILLs every guarded child that is still alive — its whole process group when the
child leads one (``start_new_session=True``), so a server's own workers go too — and exits. It also exits with
nothing to do when the parent closes it normally.

Why a process and not ``prctl(PR_SET_PDEATHSIG)``: Linux sends the death signal when the *thread* that forked the
child exits, not the process; a child started from a worker thread (``asyncio.to_thread``, a Serve replica's
executor) would be killed when that thread ends. A pidfd (Linux 5.3+) names the child itself, so a pid reused after
the child exited is never signalled; without pidfds the watchdog falls back to checking the pid's start time.

The module imports nothing from relax_gym: every package may use it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

POLL_S = 0.25  # how often the watchdog checks its parent pid when the pipe stays open
CHILD_SCRIPT = Path(__file__).with_name("watchdog_child.py")


class _HasPid(Protocol):
    pid: int | None


_lock = threading.Lock()
_watchdog: tuple[int, subprocess.Popen, int] | None = None  # (owner pid, watchdog process, write end of its pipe)


def guard(child: _HasPid | int) -> None:
    """Kill ``child`` (a ``subprocess.Popen``, ``multiprocessing.Process`` or pid) when this process dies; its
    process group too when it leads one. Safe to call from any thread; a forked child process gets its own
    watchdog on its first call."""
    pid = child if isinstance(child, int) else child.pid
    if pid is None:
        raise ValueError(f"cannot guard {child!r}: it has not started (no pid)")
    line = f"{pid}\n".encode()
    with _lock:
        for _ in range(2):  # a watchdog that died (killed by someone) is replaced once
            fd = _ensure_watchdog()
            try:
                os.write(fd, line)
                return
            except BrokenPipeError:
                _forget_watchdog()
        raise RuntimeError("the parent-death watchdog could not be started")


def watchdog_pid() -> int | None:
    """The pid of this process's watchdog, or None before the first ``guard`` (for tests and diagnostics)."""
    with _lock:
        return _watchdog[1].pid if _watchdog is not None and _watchdog[0] == os.getpid() else None


def _ensure_watchdog() -> int:
    global _watchdog
    if _watchdog is not None and _watchdog[0] == os.getpid() and _watchdog[1].poll() is None:
        return _watchdog[2]
    if _watchdog is not None and _watchdog[0] == os.getpid():
        _forget_watchdog()
    # a forked child inherits the parent's entry: it is not ours, leave the parent's pipe alone
    read_end, write_end = os.pipe()  # both non-inheritable; Popen passes read_end as the watchdog's stdin only
    try:
        proc = subprocess.Popen([sys.executable, "-S", str(CHILD_SCRIPT), str(os.getpid()), str(POLL_S)], stdin=read_end,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                close_fds=True)
    finally:
        os.close(read_end)
    _watchdog = (os.getpid(), proc, write_end)
    return write_end


def _forget_watchdog() -> None:
    global _watchdog
    if _watchdog is not None and _watchdog[0] == os.getpid():
        try:
            os.close(_watchdog[2])
        except OSError:
            pass
        _watchdog[1].poll()
    _watchdog = None




def _drop_parents_watchdog_in_child() -> None:
    """A forked child must not register its own children with its parent's watchdog: it closes its copy of the
    pipe (the parent's stays open) and starts its own watchdog on its first ``guard``. The lock is replaced in case
    another thread held it at the fork."""
    global _watchdog, _lock
    _lock = threading.Lock()
    if _watchdog is not None:
        try:
            os.close(_watchdog[2])
        except OSError:
            pass
    _watchdog = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_parents_watchdog_in_child)
