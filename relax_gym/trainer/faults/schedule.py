"""Fault injection: what to break and when (the ``faults:`` config section), and the schedule that decides it.

    faults:
      seed: 0
      inject:
        - {kind: kill, role: inference, at_step: 2}          # kill one inference replica when step 2 starts
        - {kind: kill, role: env_worker, probability: 0.1}   # at each step, with probability 0.1
        - {kind: engine_error, at_step: 3, count: 2}         # the engine raises on its next 2 generate calls
        - {kind: sandbox_hang, at_step: 2, count: 1}         # the next sandbox command hangs until its timeout

Steps are numbered like metrics rows (1 = the first RL step); a fault "at step k" fires when step k's rollout
starts (a kill may wait ``delay_s`` more, to land in the middle of the step). In async mode a kill ends one
replica of the role with ``ray.kill`` (Serve starts a new one; the controller recovers: see
:mod:`~relax_gym.trainer.async_engine.recovery`); in colocate mode every role lives in the one trainer process, so a kill of
any role stops the run with :class:`InjectedCrash` (resume it with ``relax-gym train --resume RUN_DIR``).
``engine_error`` arms the inference engine to raise on its next ``count`` generate calls; ``sandbox_hang`` makes
the next ``count`` sandbox commands run ``sleep`` instead, so their own timeout has to end them (both in
:mod:`~relax_gym.trainer.faults.hooks`).

Each fault fires at most once per step and is appended to ``RUN_DIR/faults.jsonl`` when it fires. A fault already
in that log for a step is not fired again when the step is replayed (after a global restart or ``--resume`` rolls
back to a checkpoint), so "kill the actor at step 3" cannot loop. Probabilistic faults draw from a generator
seeded by ``(seed, fault, step)``: the same config breaks the same steps in every run.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["FAULT_LOG", "ROLES", "FaultSchedule", "FaultsSection", "InjectedCrash", "InjectedFault", "ScheduledFault"]

FAULT_LOG = "faults.jsonl"
ROLES = ("env_worker", "inference", "reference", "advantages", "actor")


class InjectedFault(RuntimeError):
    """Raised by an armed fault hook (the engine's generate)."""


class InjectedCrash(RuntimeError):
    """A kill fault in colocate mode: the trainer process stops as if it had died (resume with --resume)."""


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at_step: int | None = Field(default=None, ge=1)  # fire when this step starts (metrics numbering: 1 = first)
    probability: float | None = Field(default=None, gt=0, le=1)  # or: at every step with this probability

    @model_validator(mode="after")
    def _one_trigger(self) -> _Fault:
        if (self.at_step is None) == (self.probability is None):
            raise ValueError(f"a {self.kind} fault needs exactly one of at_step or probability")  # type: ignore[attr-defined]
        return self


class KillFault(_Fault):
    kind: Literal["kill"]
    role: Literal["env_worker", "inference", "reference", "advantages", "actor", "genrm", "critic"]
    delay_s: float = Field(default=0.0, ge=0)  # after the step's rollout starts
    rank: int | None = Field(default=None, ge=0)  # role actor with a megatron rank group: kill this rank only

    @model_validator(mode="after")
    def _rank_of_the_actor(self) -> KillFault:
        if self.rank is not None and self.role != "actor":
            raise ValueError(f"a kill fault's rank names a rank of the actor's group, not of role {self.role!r}")
        return self


class EngineErrorFault(_Fault):
    kind: Literal["engine_error"]
    count: int = Field(default=1, ge=1)  # generate calls that raise once armed


class SandboxHangFault(_Fault):
    kind: Literal["sandbox_hang"]
    count: int = Field(default=1, ge=1)  # sandbox commands that hang once armed


FaultSpec = Annotated[KillFault | EngineErrorFault | SandboxHangFault, Field(discriminator="kind")]


class FaultsSection(BaseModel):
    """The ``faults:`` config section (empty by default: nothing is injected)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    inject: list[FaultSpec] = Field(default_factory=list)


@dataclass(frozen=True)
class ScheduledFault:
    """One fault firing at one step: what :meth:`FaultSchedule.due` hands to the trainer."""

    step: int
    spec: KillFault | EngineErrorFault | SandboxHangFault

    @property
    def key(self) -> str:
        return _key(self.step, self.spec.model_dump(mode="json"))


def _key(step: int, spec: dict[str, Any]) -> str:
    return json.dumps([step, spec], sort_keys=True)


class FaultSchedule:
    """Decides which faults fire at a step and keeps the log of those that did (``run_dir/faults.jsonl``;
    ``run_dir`` None: in memory only)."""

    def __init__(self, section: FaultsSection, run_dir: Path | None = None) -> None:
        self.section = section
        self.path = Path(run_dir) / FAULT_LOG if run_dir is not None else None
        self.fired: list[dict[str, Any]] = []
        if self.path is not None and self.path.is_file():
            for line_no, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
                if line.strip():
                    try:
                        self.fired.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{self.path} line {line_no}: invalid JSON ({exc.msg})") from None
        self._done = {_key(e["step"], e["spec"]) for e in self.fired}

    def due(self, step: int) -> list[ScheduledFault]:
        """The faults that fire when ``step`` starts and have not fired at that step before."""
        out = []
        for index, spec in enumerate(self.section.inject):
            if spec.at_step is not None:
                hit = spec.at_step == step
            else:
                hit = random.Random(f"{self.section.seed}:{index}:{step}").random() < (spec.probability or 0.0)
            fault = ScheduledFault(step, spec)
            if hit and fault.key not in self._done:
                out.append(fault)
        return out

    def record(self, fault: ScheduledFault, **details: Any) -> dict[str, Any]:
        """Log that ``fault`` fired (``details``: what it hit, e.g. the replica)."""
        entry = {"step": fault.step, "kind": fault.spec.kind, "spec": fault.spec.model_dump(mode="json"),
                 "time": time.time(), **details}
        self._done.add(fault.key)
        self.fired.append(entry)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
        return entry

    def counts(self) -> dict[str, int]:
        """Faults fired so far in this run directory, by kind (kills also by role: ``kill:inference``)."""
        out: dict[str, int] = {}
        for e in self.fired:
            for name in [e["kind"]] + ([f"kill:{e['spec']['role']}"] if e["kind"] == "kill" else []):
                out[name] = out.get(name, 0) + 1
        return out
