"""How tests wait without betting on the machine's speed.

- :func:`run_on_virtual_clock` runs a coroutine on the planner's virtual-time loop: ``asyncio.sleep``, ``wait_for``
  timeouts and timers take no wall time and happen in the same order on every run. Code under test that reads a
  clock is handed :func:`loop_clock`, so its deadlines are on that simulated clock too.
- :func:`wait_until` waits for a state that another thread or process reaches (never for time to pass); its limit
  is only how long to wait before reporting the state as never reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from relax_gym.trainer.plan.clock import VirtualTimeLoop

T = TypeVar("T")

__all__ = ["loop_clock", "run_on_virtual_clock", "wait_until"]


class _InlineThreadsLoop(VirtualTimeLoop):
    """The virtual-time loop, except that work handed to a thread (``asyncio.to_thread``) runs at once on the
    loop's own thread. Meant for fakes whose blocking calls return at once (a fake backend's ``reap``): a call
    that really blocked would stall the loop, and it would still cost no simulated time."""

    def run_in_executor(self, executor: Any, func: Callable[..., Any], *args: Any) -> asyncio.Future:
        done = self.create_future()
        try:
            done.set_result(func(*args))
        except BaseException as exc:  # handed to the awaiting task, as a thread's failure would be
            done.set_exception(exc)
        return done


def run_on_virtual_clock(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on a virtual clock starting at 0 (see the module docstring)."""
    with asyncio.Runner(loop_factory=_InlineThreadsLoop) as runner:
        return runner.run(main)


def loop_clock() -> float:
    """The running event loop's clock: simulated seconds on a virtual-time loop, ``time.monotonic()`` otherwise."""
    return asyncio.get_running_loop().time()


def wait_until(condition: Callable[[], bool], limit_s: float = 30.0, poll_s: float = 0.005) -> bool:
    """Wait for a state another thread or process reaches (not for time to pass): True once ``condition()`` holds,
    False if it still does not after ``limit_s`` (a generous limit: reaching it means the state never came)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
