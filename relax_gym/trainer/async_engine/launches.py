"""The hand-off between the controller's launcher and its training loop: one :class:`LaunchedStep` per step.

The launcher opens step k's partition once the staleness gate allows it and starts its rollout and its streaming
calls (advantages, reference, critic values); it publishes them as a :class:`LaunchedStep`. The training loop
takes step k (waiting until it is launched), trains, then collects the rollout's answer and the streams' answers
from it. A stopped run abandons what :meth:`Launches.unfinished` still holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LaunchedStep", "Launches"]


@dataclass
class LaunchedStep:
    """Step ``step``'s (counted from 0) rollout task and its streaming calls' tasks, until they are collected."""

    step: int
    rollout: asyncio.Task | None
    streams: list[asyncio.Task] = field(default_factory=list)

    async def rollout_answer(self) -> dict[str, Any]:
        """The rollout's answer (``episodes``, ``time_rollout_s``); from here on the step no longer owns the task."""
        task, self.rollout = self.rollout, None
        assert task is not None, f"step {self.step}: its rollout was collected already"
        return await task

    async def stream_answers(self) -> list[Any]:
        """The streaming calls' answers, in launch order (the advantages role's first)."""
        tasks, self.streams = self.streams, []
        return list(await asyncio.gather(*tasks))

    def pending(self) -> list[asyncio.Task]:
        """The tasks not collected yet."""
        return [t for t in [self.rollout, *self.streams] if t is not None]


class Launches:
    """Steps launched and not yet fully collected, by step."""

    def __init__(self) -> None:
        self._steps: dict[int, LaunchedStep] = {}
        self._ready: dict[int, asyncio.Event] = {}

    def _event(self, step: int) -> asyncio.Event:
        return self._ready.setdefault(step, asyncio.Event())

    def publish(self, launched: LaunchedStep) -> None:
        for k in [k for k, s in self._steps.items() if not s.pending()]:  # collected: nothing left to abandon
            del self._steps[k]
        self._steps[launched.step] = launched
        self._event(launched.step).set()

    async def take(self, step: int) -> LaunchedStep:
        """Step ``step`` once the launcher has started it."""
        await self._event(step).wait()
        self._ready.pop(step, None)
        return self._steps[step]

    def unfinished(self) -> list[LaunchedStep]:
        """The launched steps that still hold tasks, in step order; each is forgotten here."""
        left = [self._steps.pop(k) for k in sorted(self._steps)]
        return [s for s in left if s.pending()]
