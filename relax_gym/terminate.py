"""SIGTERM as a clean exit: what a job scheduler, ``timeout``, ``docker stop`` or ``kill`` sends first.

Python's default for SIGTERM ends the process at once: no ``finally`` blocks, no ``atexit`` hooks, so the
sandboxes, servers and Ray instance a run holds would be left to the next start's reaping. :func:`exit_on_sigterm`
turns the signal into ``SystemExit(143)`` raised in the main thread, so a run unwinds as on Ctrl-C: its ``close()``
paths and the atexit backstops (sandbox pools, Docker containers) run before the process ends. A second SIGTERM
during that unwinding exits at once.

The module imports nothing from relax_gym: every package may use it.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

EXIT_CODE = 128 + signal.SIGTERM


def exit_on_sigterm() -> bool:
    """Install the handler, from the main thread, unless the process already chose its own (anything other than
    the default). Answers whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, _at_once)  # a second one: no more waiting
    raise SystemExit(EXIT_CODE)


def _at_once(signum: int, frame: FrameType | None) -> None:
    os._exit(EXIT_CODE)
