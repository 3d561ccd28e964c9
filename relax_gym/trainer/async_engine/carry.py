"""Straggler carry (``trainer.stragglers: carry``, async mode): a step trains on the first groups that finish.

With ``stragglers: wait`` (the default) the rollout of step k is a fixed set of prompt groups, and step k cannot
train before the slowest of them ends: on a long-tail agentic workload one slow tool call holds the whole step.
With ``carry`` the controller keeps a pool of groups running (one step's worth, launched in the colocate trainer's
prompt order, refilled as groups end) and a group joins a step's partition when it *finishes*: the lowest partition
that still has a free slot. A group still running when that step is full simply lands in a later step; so the
actor never waits for a straggler, only for the next groups to finish.

The staleness bound still holds per sample: a group records ``born``, the number of steps trained when it was
launched (its policy version is at least that), and it may join partition j only while ``j - born <= S``. A group
that finishes later than that is *discarded*: it never reaches the bus, it is counted
(``samples_discarded_stale``), and its prompt is not trained. Training then sees the fast groups of each launch
first: with a tool latency that does not depend on the policy this changes the order of the prompts, not the
answers; a policy whose own behaviour makes episodes long (more tool calls) has its slowest groups trained one or
two steps later, or, past S, not at all — the price of never waiting (docs/architecture.md, "Straggler carry").

:class:`CarrySlots` is the bookkeeping, one per run, hosted in a small Ray actor that the env workers ask once per
finished group (``claim``) before they put its rows. Claims are idempotent per group: a group re-sent after its
env worker died gets the partition its first attempt was given.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CarryFeeder", "CarrySlots", "claim_slot"]


class CarrySlots:
    """``groups_per_step`` groups fill a partition; partitions fill in order from ``first``; ``end``: the first
    partition the run will not train (claims that would go there are refused)."""

    def __init__(self, groups_per_step: int, max_staleness: int, *, first: int = 0, end: int | None = None) -> None:
        if groups_per_step < 1 or max_staleness < 0:
            raise ValueError(f"CarrySlots needs groups_per_step >= 1 and max_staleness >= 0, got {groups_per_step}, "
                             f"{max_staleness}")
        self.groups_per_step = int(groups_per_step)
        self.max_staleness = int(max_staleness)
        self.end = end
        self._next = int(first)  # the partition being filled
        self._taken = 0  # its slots already claimed
        self._claims: dict[str, int | None] = {}

    def claim(self, key: str, born: int) -> int | None:
        """The partition the finished group ``key`` (launched when ``born`` steps were trained) joins, or None when
        it is too stale for every partition that still has room (or the run needs no more groups)."""
        if key in self._claims:
            return self._claims[key]
        j = self._next
        if j - int(born) > self.max_staleness or (self.end is not None and j >= self.end):
            self._claims[key] = None
            return None
        self._claims[key] = j
        self._taken += 1
        if self._taken == self.groups_per_step:
            self._next, self._taken = j + 1, 0
        return j

    def filling(self) -> int:
        """The partition the next claim would join (if fresh enough)."""
        return self._next


async def claim_slot(slots: Any, key: str, born: int) -> int | None:
    """Ask the run's carry slots (a Ray actor handle or the object itself) where a finished group goes."""
    if hasattr(slots, "claim") and hasattr(slots.claim, "remote"):
        return await slots.claim.remote(key, born)
    return slots.claim(key, born)


class CarryFeeder:
    """The controller's side of straggler carry: keeps up to ``max_in_flight`` groups running and gathers each
    partition's groups as their env workers answer.

    ``run_group(i, born)`` plays launch number ``i`` (the controller maps it to the colocate trainer's prompt
    order) and answers its episodes' summaries, each with the ``partition`` it joined (None: discarded as too
    stale); ``seal(j)`` is awaited once partition j has all its groups. ``placed`` (sample id -> partition) and
    ``discarded`` (sample ids) are the run's ledger, shared with the controller; ``spawn`` makes the group tasks
    (the controller's, so that a group that fails for good stops the run); ``clock``: the controller's (a
    partition's rollout time). Nothing polls: the loop sleeps on an event set when a group ends and when the gate
    advances (:meth:`poke`)."""

    def __init__(self, gate: Any, *, groups_per_step: int, max_in_flight: int, first: int, end: int, cursor: int,
                 run_group: Any, seal: Any, placed: dict[str, int], discarded: list[str], spawn: Any = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.gate, self.clock = gate, clock
        self.groups_per_step, self.max_in_flight = groups_per_step, max_in_flight
        self.first, self.end, self.cursor = first, end, cursor
        self._run_group, self._seal = run_group, seal
        self._spawn = spawn or asyncio.ensure_future  # the controller's: a failed group stops the run
        self.placed, self.discarded = placed, discarded
        self._episodes: dict[int, list[dict[str, Any]]] = {}
        self._groups: dict[int, int] = {}
        self._full: dict[int, asyncio.Future] = {}
        self._started: dict[int, float] = {}
        self._landed = 0  # groups placed in partitions >= first
        self._changed = asyncio.Event()
        self.running: set[asyncio.Task] = set()

    def filling(self) -> int:
        """The partition being filled, as far as the answers so far tell."""
        return self.first + self._landed // self.groups_per_step

    def poke(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Launch groups while there is room and the gate allows the partition being filled; returns once every
        partition of the run has its groups."""
        while self.filling() < self.end:
            while (len(self.running) < self.max_in_flight and self.gate.may_start(self.filling())
                   and self.filling() < self.end):
                born, i = self.gate.trained, self.cursor
                self.cursor += 1
                task = self._spawn(self._one(i, born))
                self.running.add(task)
                task.add_done_callback(self.running.discard)
            self._changed.clear()
            await self._changed.wait()

    async def _one(self, i: int, born: int) -> None:
        start = self.clock()
        try:
            answers = await self._run_group(i, born)
            j = answers[0]["partition"] if answers else None
            sids = [a["sample_id"] for a in answers]
            if j is None:
                self.discarded.extend(sids)
                return
            self._started[j] = min(self._started.get(j, start), start)
            self.placed.update((sid, j) for sid in sids)
            self._episodes.setdefault(j, []).extend(answers)
            self._groups[j] = self._groups.get(j, 0) + 1
            self._landed += 1
            if self._groups[j] == self.groups_per_step:
                await self._seal(j)
                episodes = self._episodes.pop(j)
                self._future(j).set_result({"episodes": episodes, "time_rollout_s": self.clock() - self._started.pop(j)})
        finally:  # out of the running set before the loop wakes: it launches in this group's place at once
            self.running.discard(asyncio.current_task())
            self._changed.set()

    def _future(self, j: int) -> asyncio.Future:
        if j not in self._full:
            self._full[j] = asyncio.get_running_loop().create_future()
        return self._full[j]

    async def rollout(self, j: int) -> dict[str, Any]:
        """Partition j's episodes once all its groups have landed (and how long since its first group started)."""
        return await self._future(j)

    async def stop(self) -> None:
        for task in list(self.running):
            task.cancel()
        await asyncio.gather(*self.running, return_exceptions=True)
