"""The in-process side of fault injection (:mod:`~relax_gym.trainer.faults.schedule` decides when): an engine that raises,
sandbox commands that hang, and the colocate trainer's step hook.

- :class:`EngineFaults` wraps one engine's ``generate``: once armed with ``count``, the next ``count`` calls raise
  :class:`~relax_gym.trainer.faults.schedule.InjectedFault` (the HTTP server answers 500, the episode ends
  ``engine_error`` and is masked, as for any engine failure).
- :class:`SandboxHangs` (process-wide): once armed, the next ``count`` sandbox commands run ``sleep`` instead of
  what they were asked to, with the caller's timeout, so the sandbox's own kill-timeout has to end them
  (``ExecResult.timed_out``) and the tool reports a timeout to the agent.
- :class:`LocalFaults`: a colocate run's faults at the start of each step (all roles live in its process, so a
  kill stops the run with :class:`~relax_gym.trainer.faults.schedule.InjectedCrash`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

from relax_gym.trainer.faults.schedule import FaultSchedule, InjectedCrash, InjectedFault

__all__ = ["EngineFaults", "LocalFaults", "SandboxHangs"]

log = logging.getLogger(__name__)

HANG_S = 86_400  # what a hung command sleeps: far longer than any exec timeout


class EngineFaults:
    """``EngineFaults(engine).arm(n)``: the engine's next ``n`` generate calls raise."""

    def __init__(self, engine: Any) -> None:
        if not callable(getattr(engine, "generate", None)):
            raise TypeError(f"engine_error faults need an engine with generate(); got {type(engine).__name__} "
                            "(they work with inference.engine=embedded)")
        self._lock = threading.Lock()
        self._armed = 0
        self.raised = 0
        original = engine.generate

        def generate(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                fire = self._armed > 0
                if fire:
                    self._armed -= 1
                    self.raised += 1
            if fire:
                raise InjectedFault(f"injected engine error (fault injection, #{self.raised})")
            return original(*args, **kwargs)

        engine.generate = generate  # the HTTP server looks the method up on each request

    def arm(self, count: int) -> None:
        with self._lock:
            self._armed += int(count)


class SandboxHangs:
    """Process-wide: ``SandboxHangs.arm(n)`` makes the next ``n`` sandbox commands hang until their timeout."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _armed: ClassVar[int] = 0
    hung: ClassVar[int] = 0
    _installed: ClassVar[bool] = False

    @classmethod
    def arm(cls, count: int) -> None:
        with cls._lock:
            cls._install()
            cls._armed += int(count)

    @classmethod
    def disarm(cls) -> None:
        with cls._lock:
            cls._armed = 0

    @classmethod
    def _take(cls) -> bool:
        with cls._lock:
            if cls._armed <= 0:
                return False
            cls._armed -= 1
            cls.hung += 1
            return True

    @classmethod
    def _install(cls) -> None:
        if cls._installed:
            return
        from relax_gym.sandbox.base import Sandbox

        original = Sandbox.exec

        async def exec(self: Any, cmd: Any, timeout: float | None = None, stdin: Any = None) -> Any:
            if cls._take():
                log.warning("sandbox %s: injected hang instead of %r", getattr(self, "id", "?"), cmd)
                cmd, stdin = ["sleep", str(HANG_S)], None
            return await original(self, cmd, timeout, stdin)

        Sandbox.exec = exec  # every backend runs commands through the base class's exec
        cls._installed = True


class LocalFaults:
    """A colocate run's faults: ``start_step(k)`` fires what is due at step k (``engine``: the run's embedded
    engine, or None when the run hosts another engine)."""

    def __init__(self, schedule: FaultSchedule, engine: Any = None) -> None:
        self.schedule = schedule
        self._engine = engine
        self._engine_faults: EngineFaults | None = None

    def start_step(self, step: int) -> None:
        for fault in self.schedule.due(step):
            spec = fault.spec
            if spec.kind == "kill":
                self.schedule.record(fault, target="trainer process")
                raise InjectedCrash(f"fault injection: {spec.role} killed at step {step}; in colocate mode every role "
                                    "lives in the trainer process, so the run stops here (relax-gym train --resume RUN_DIR)")
            if spec.kind == "engine_error":
                if self._engine_faults is None:
                    self._engine_faults = EngineFaults(self._engine)
                self._engine_faults.arm(spec.count)
            else:
                SandboxHangs.arm(spec.count)
            self.schedule.record(fault)
