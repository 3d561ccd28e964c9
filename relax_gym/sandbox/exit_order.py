"""Sandbox clean-up at interpreter exit, ordered before Python stops its thread pools.

At exit, Python runs ``threading``'s exit hooks before the ``atexit`` ones, and one of them (registered by
``concurrent.futures``) stops every thread pool: a pool that is asked for work after that answers "cannot schedule
new futures after shutdown". A sandbox pool closed from an ``atexit`` hook is too late: its sandboxes' resets and
destroys go through such pools (the Docker backend's, the sandbox loop's default one) and fail, and the sandboxes
are left to the backends' last-resort hooks. Hooks registered here run among ``threading``'s exit hooks, which run
last-registered first, so after everything registered later and before the thread pools (registered when
``concurrent.futures`` was imported, earlier) stop. They run before non-daemon threads are joined, too: a thread
still using a sandbox when the main thread ends finds it closed.

:func:`exiting` is true from the first of these hooks on: work that fails because its sandbox was closed for the
exit (an agent program's thread, say) can say so quietly instead of warning.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

_exiting = threading.Event()


def exiting() -> bool:
    """True once the interpreter has started closing this process's sandboxes for its exit."""
    return _exiting.is_set()


def before_thread_pools_stop(hook: Callable[[], None]) -> None:
    """Run ``hook`` at interpreter exit while thread pools still take work (see the module doc)."""

    def run() -> None:
        _exiting.set()
        hook()

    register = getattr(threading, "_register_atexit", None)  # CPython 3.9+
    if register is not None:
        try:
            register(run)
            return
        except RuntimeError:  # threading is already shutting down: the best left is atexit
            pass
    atexit.register(run)
