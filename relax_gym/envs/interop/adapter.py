"""What every adapter of a foreign framework shares: calling into the foreign env with a deadline, and turning what
goes wrong there into one error that names the framework, the env and the call.

An adapter is an :class:`~relax_gym.envs.core.AgentEnv` that runs inside the framework's venv (the env server's
process there). A foreign call that raises, returns something of the wrong shape, or does not return within
``call_timeout_s`` raises :class:`ForeignEnvError`; in a step the env contract turns it into an ``env_error``
status (the trainer masks the episode), in a reset the server answers 500 with its text. A call that timed out
leaves its thread behind (Python cannot stop it): the foreign env is then dropped and the next reset makes a new
one.
"""

from __future__ import annotations

import importlib
import math
import queue
import string
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import numpy as np

from relax_gym.envs.core import AgentEnv

T = TypeVar("T")


class _Worker:
    """One daemon thread running the calls submitted to it, in order (a ThreadPoolExecutor's threads are joined at
    interpreter exit, so a foreign call that hangs would hold the env server's exit up)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, fn: Callable[[], T]) -> Future:
        future: Future = Future()
        self._calls.put((fn, future))
        return future

    def stop(self) -> None:
        self._calls.put(None)  # after the call under way, if it ever returns

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
                    future.set_exception(exc)


class TaskFileError(ValueError):
    """A task file is not in its framework's layout; the message names the file, the row or line, and the field."""


class TaskPicker:
    """Which task a reset plays: drawn with the env's seeded generator (``"random"``: a seed picks the same task) or
    each in turn (``"cycle"``)."""

    def __init__(self, pick: str) -> None:
        if pick not in ("random", "cycle"):
            raise ValueError(f"pick must be 'random' or 'cycle', got {pick!r}")
        self.pick, self._next = pick, 0

    def next(self, count: int, rng: np.random.Generator) -> int:
        if self.pick == "random":
            return int(rng.integers(count))
        index, self._next = self._next % count, self._next % count + 1
        return index


class ForeignEnvError(RuntimeError):
    """A foreign env's call failed: the message starts with the framework, the env id and the call."""


class ForeignAgentEnv(AgentEnv):
    """Base of the adapters. Subclasses set ``framework_title`` and call :meth:`_call` for every foreign call."""

    framework_title = "?"
    media_kinds = ("image", "video", "audio")

    def __init__(self, env_id: str, *, call_timeout_s: float = 300.0, imports: list[str] | tuple[str, ...] = (),
                 **kwargs: Any) -> None:
        """``imports``: modules to import first (in the framework's venv), e.g. the user's package that registers its
        own envs with the framework."""
        super().__init__(**kwargs)
        if call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be > 0, got {call_timeout_s}")
        self.env_id = env_id
        self.call_timeout_s = float(call_timeout_s)
        self._stuck = False  # a call timed out: the foreign env may be mid-call forever
        self._worker: _Worker | None = None  # the thread foreign calls run on
        for module in imports:
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise ForeignEnvError(f"{self._where('import')} of {module!r} (imports=) failed: "
                                      f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()
        super().close()

    def _where(self, call: str) -> str:
        return f"{self.framework_title} {self.env_id}: {call}"

    def _call(self, call: str, fn: Callable[[], T]) -> T:
        """``fn()`` on this env's worker thread, within ``call_timeout_s``; any failure as :class:`ForeignEnvError`.
        A call that does not return keeps its thread (a daemon: it never holds the process's exit up); the next
        call gets a new one."""
        if self._worker is None:
            self._worker = _Worker(f"{self.framework_title}-env")
        future = self._worker.submit(fn)
        try:
            return future.result(timeout=self.call_timeout_s)
        except FutureTimeout:
            self._stuck = True
            self._worker.stop()
            self._worker = None
            raise ForeignEnvError(f"{self._where(call)} did not return within {self.call_timeout_s:g} s (call_timeout_s)") from None
        except Exception as exc:
            raise ForeignEnvError(f"{self._where(call)} raised {type(exc).__name__}: {exc}") from exc

    def _malformed(self, call: str, what: str) -> ForeignEnvError:
        return ForeignEnvError(f"{self._where(call)} returned {what}")

    def _reward(self, call: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            raise self._malformed(call, f"a reward of {value!r} ({type(value).__name__}), not a finite number")
        return float(value)


def fill_gold(template: str | None, fields: dict[str, Any], *, where: str) -> str:
    """A gold action from a ``str.format`` template over ``fields`` (the foreign task's own names); "" without a
    template. A field the template names but the task lacks is a configuration error, raised naming both."""
    if not template:
        return ""
    names = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(template) if name}
    missing = sorted(names - set(fields))
    if missing:
        raise ValueError(f"{where}: the gold template {template!r} names {', '.join(missing)}, which the task lacks "
                         f"(it has {', '.join(sorted(fields)) or 'nothing'})")
    return template.format(**fields)
