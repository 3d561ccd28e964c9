"""Staleness control for the async engine: one knob, ``max_staleness`` S.

Steps are counted from 0 here. ``trained`` is how many optimiser steps the actor has finished (and pushed to the
engines). The rollout for step ``k`` may start only while ``k - trained <= S``:

- S = 0: the rollout for step k waits until step k - 1 is trained and its weights are in the engines, so every
  sample is on-policy; the async engine still overlaps advantages and training with the tail of that rollout
  (streaming micro-batches).
- S >= 1: rollouts run up to S steps ahead of training; a sample used at step k was produced by a policy at most
  S versions older than the one being trained (its *staleness*), and the loss corrects for it with truncated
  importance sampling against the rollout log-probs.

:class:`StalenessGate` is the asyncio primitive the controller awaits (an event per change, no polling);
:func:`staleness` is the per-sample number the actor reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

__all__ = ["StalenessGate", "off_policy_tis_cap", "staleness", "staleness_stats"]


class StalenessGate:
    """``await gate.wait_for(k)`` returns once ``k - trained <= S``; ``gate.advance(n)`` records trained steps."""

    def __init__(self, max_staleness: int, trained: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        self.max_staleness = int(max_staleness)
        self._trained = int(trained)
        self._changed = asyncio.Condition()
        self._closed = False

    @property
    def trained(self) -> int:
        return self._trained

    def may_start(self, step: int) -> bool:
        return step - self._trained <= self.max_staleness

    async def wait_for(self, step: int) -> None:
        """Block until the rollout for ``step`` may start. Raises ``RuntimeError`` if the gate is closed first."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._closed or self.may_start(step))
            if not self.may_start(step):
                raise RuntimeError(f"the staleness gate closed while step {step} waited for training to catch up")

    async def advance(self, trained: int) -> None:
        """Record that ``trained`` steps are done (never goes backwards) and wake the waiters."""
        async with self._changed:
            if trained < self._trained:
                raise ValueError(f"trained steps cannot go back from {self._trained} to {trained}")
            self._trained = int(trained)
            self._changed.notify_all()

    async def close(self) -> None:
        """Wake every waiter with an error: no more steps will be trained (budget reached, failure)."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()


def staleness(trained_version: int, sample_versions: Iterable[int]) -> int:
    """How many policy versions older than ``trained_version`` the oldest turn of a sample is (0 = on-policy).
    A sample with no generated turn (it failed before the engine answered) counts as 0."""
    versions = list(sample_versions)
    return max(0, trained_version - min(versions)) if versions else 0


def staleness_stats(values: Iterable[int]) -> dict[str, float]:
    vals = list(values)
    if not vals:
        return {"staleness_avg": 0.0, "staleness_max": 0}
    return {"staleness_avg": sum(vals) / len(vals), "staleness_max": max(vals)}


def off_policy_tis_cap(algorithm: Any, trainer: Any, max_staleness: int) -> float | None:
    """The truncated-IS cap a step trains with: ``algorithm.tis_cap`` or, when that is unset and S >= 1,
    ``trainer.off_policy_tis_cap`` (None: no correction). The actor role's rule, which the planner's actor follows."""
    if algorithm.tis_cap is not None:
        return algorithm.tis_cap
    return trainer.off_policy_tis_cap if max_staleness >= 1 else None
