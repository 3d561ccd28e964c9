"""The watchdog process of :mod:`relax_gym.watchdog`, run as a script with ``python -S`` (no site import: it starts in
~20 ms and depends on nothing that could be broken in the parent's environment; stdlib only).

argv: the parent's pid, the poll interval in seconds. stdin: one guarded pid per line, written by the parent.
"""

from __future__ import annotations

import os
import select
import signal
import sys


def start_time(pid: int) -> bytes | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): with the pid it names one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except OSError:
        return None


class Guarded:
    """The parent's guarded children, each held by a pidfd where the kernel has them (else pid + start time)."""

    def __init__(self) -> None:
        self.children: dict[int, tuple[int | None, bytes | None]] = {}

    def add(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = None
        self.children[pid] = (fd, start_time(pid))

    @staticmethod
    def alive(pid: int, fd: int | None, started: bytes | None) -> bool:
        if fd is not None:
            return not select.select([fd], [], [], 0)[0]  # a pidfd turns readable when its process exits
        return started is not None and start_time(pid) == started

    def prune(self) -> None:
        """Forget children that exited (the parent reaps them; their pids may be reused)."""
        for pid, (fd, started) in list(self.children.items()):
            if not self.alive(pid, fd, started):
                if fd is not None:
                    os.close(fd)
                del self.children[pid]

    def kill_all(self) -> None:
        """SIGKILL each live child: its whole process group when it leads one."""
        for pid, (fd, started) in self.children.items():
            if not self.alive(pid, fd, started):
                continue
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                elif fd is not None:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def main(parent: int, poll_s: float) -> None:
    guarded = Guarded()
    pending = b""
    while True:
        if os.getppid() != parent:  # reparented: the parent died (a forked copy may still hold the pipe open)
            break
        if not select.select([0], [], [], poll_s)[0]:
            guarded.prune()
            continue
        data = os.read(0, 4096)
        if not data:  # every write end closed: the parent died or exited
            break
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                guarded.add(int(line))
    guarded.kill_all()


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
