"""The async controller's sample ledger: which sample ids were produced (answered by env workers), consumed (named
by the actor), placed in a partition (carried stragglers), discarded as too stale, or given up (their env worker
never answered); what a checkpoint keeps of it, its restore on resume, and the figures the summary reports.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from relax_gym.trainer.async_engine.recovery import sample_step
from relax_gym.trainer.rollout.samples import sample_id

__all__ = ["SampleLedger"]


class SampleLedger:
    """``trainer``: the config's trainer section."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.produced: list[str] = []
        self.consumed: list[str] = []
        self.given_up: list[str] = []  # samples masked because their env worker never answered
        self.placed: dict[str, int] = {}  # stragglers: carry — the partition each produced sample joined
        self.discarded: list[str] = []  # stragglers: carry — samples too stale for any partition (never put)
        self.carry_cursor = 0  # stragglers: carry — groups launched so far (the next launch number)
        self.regenerated = 0  # samples produced after a checkpoint and discarded by a global restart
        # the first step whose samples this ledger accounts for: after a checkpoint without a ledger (a colocate
        # run's, resumed in async mode) the steps before it were trained where no ledger counted them
        self.first_step = 1

    def trained_at(self, sid: str) -> int:
        """The step (from 1) that trains sample ``sid``: its launch step, or with carried stragglers the partition
        it joined."""
        j = self.placed.get(sid)
        return j + 1 if j is not None else sample_step(sid)

    def restore(self, state: Any) -> None:
        """The ledger as the checkpoint being resumed saved it (``state``: its TrainerState; None: start over).
        Samples produced after that checkpoint count as regenerated (a resumed run makes them again)."""
        extra = state.extra if state is not None else {}
        self.first_step = state.step + 1 if state is not None and "consumed" not in extra else 1
        dropped = [s for s in self.produced if state is None or self.trained_at(s) > state.step]
        self.regenerated += len(dropped)
        self.produced = list(extra.get("produced", []))
        self.consumed = list(extra.get("consumed", []))
        self.given_up = list(extra.get("given_up", []))
        carry = extra.get("carry", {})
        self.placed = {sid: int(j) for sid, j in carry.get("placed", {}).items()}
        self.discarded = list(carry.get("discarded", []))
        self.carry_cursor = int(carry.get("cursor", 0))

    def checkpoint_extra(self, step: int, carry_cursor: int | None) -> dict[str, Any]:
        """What a checkpoint after ``step`` keeps: the samples of steps up to ``step`` (later partitions are made
        again from their seeds, under the same ids) and the bus cursor; ``carry_cursor``: the carry feeder's launch
        cursor (None without carry)."""
        keep = lambda ids: [s for s in ids if self.trained_at(s) <= step]  # noqa: E731
        extra: dict[str, Any] = {"produced": keep(self.produced), "consumed": keep(self.consumed),
                                 "given_up": keep(self.given_up), "bus": {"next_partition": step, "partitions_done": step}}
        if carry_cursor is not None:  # carry: where each kept sample went, and the launch cursor (groups still
            # running or placed after this step are not resumed: a resumed run launches from the cursor on)
            extra["carry"] = {"cursor": carry_cursor, "discarded": list(self.discarded),
                              "placed": {sid: j for sid, j in self.placed.items() if j < step}}
        return extra

    def lost(self, steps_done: int) -> int:
        """Samples the run should have trained (every step done since :attr:`first_step`) that the actor never
        consumed, or that were masked because their env worker never answered."""
        t = self.trainer
        if t.stragglers == "carry":  # the samples placed in the steps done
            expected = {sid for sid, j in self.placed.items() if self.first_step - 1 <= j < steps_done}
        else:
            expected = {sample_id(s, g, m) for s in range(self.first_step, steps_done + 1)
                        for g in range(t.prompts_per_step) for m in range(t.group_size)}
        return len(expected - set(self.consumed) | (set(self.given_up) & expected))

    def figures(self) -> dict[str, int]:
        """The summary's sample counts."""
        dup = sum(n - 1 for n in Counter(self.consumed).values() if n > 1)
        return {"samples_produced": len(self.produced), "samples_consumed": len(self.consumed), "samples_duplicated": dup,
                "samples_unconsumed": len(set(self.produced) - set(self.consumed))}
