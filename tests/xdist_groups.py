"""Which tests may run beside each other when `make test` runs the suite on two pytest-xdist workers.

Tests that share a machine-wide resource run one after another on one worker. Three groups, so that at most two
of them overlap:

- "sandbox": the sandbox engines (tests count this machine's containers and sandboxes, so two workers' sandboxes
  must not meet), the OpenAI-agent training included (its async run starts a Ray session of its own there);
- "real-width": real-width checkpoints (GBs each: two at once do not fit beside the rest);
- "ray": the shared Ray session, async (Ray Serve) training, multi-rank Megatron groups.

The groups are kept by a scheduler of our own (:func:`make_scheduler`, handed to xdist by tests/conftest.py) that
reads each test's file, not by ``xdist_group`` markers: xdist 3.8 files a marked test under its group by renaming
``item._nodeid``, which pytest 9 no longer reads (its node id lives in ``item._id``), so marked tests were scheduled
one by one and the groups ran on both workers at once.
"""

from __future__ import annotations

from pathlib import Path

SANDBOX_WORDS = ("docker", "bwrap", "agent_program", "tool-use", "openai-agent", "episode_sandbox")
REAL_WIDTH_WORDS = ("standin_3b", "real_width", "write_standin", "qwen2.5-omni-3b")
RAY_WORDS = ("ray_session", "trainer.mode=async", "trainer.mode={mode}", "megatron_check")


def serial_group(path: Path, source: str) -> str | None:
    """The group a test file must run in, or None when its tests may run beside anything."""
    if "sandbox" in path.parts or any(w in source for w in SANDBOX_WORDS):
        return "sandbox"
    if any(w in source for w in REAL_WIDTH_WORDS):
        return "real-width"
    if any(w in source for w in RAY_WORDS):
        return "ray"
    return None


class GroupOf:
    """``nodeid -> scheduling unit``: the group of the test's file, else the test itself (files read once)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, str | None] = {}

    def __call__(self, nodeid: str) -> str:
        name = nodeid.split("::", 1)[0]
        if name not in self._files:
            path = self.root / name
            source = path.read_text(encoding="utf-8") if path.is_file() else ""
            self._files[name] = serial_group(Path(name), source)
        group = self._files[name]
        return f"group:{group}" if group else nodeid


# the groups' order of start, longest first (quiet 2-core machine: the Ray Serve trainings and Megatron rank groups
# ~12 min, the sandbox tests ~8, the real-width checkpoints ~5), so that none starts late and ends the run alone
FIRST = ("group:ray", "group:sandbox", "group:real-width")


def make_scheduler(config, log):
    """xdist's load-by-scope scheduling with our groups as the scopes: a group goes to one worker as one unit
    (the groups first, in the order of FIRST), every other test is a unit of its own (largest first after them,
    xdist's default order), handed to whichever worker runs low."""
    from xdist.scheduler import LoadScopeScheduling

    group_of = GroupOf(Path(config.rootpath))

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            for scope in FIRST:
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
                    break
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
