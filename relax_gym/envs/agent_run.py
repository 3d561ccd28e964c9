"""What an agent program is given and what it leaves: the endpoint its model calls go to, and the record of its run.
Shared by :mod:`relax_gym.envs.agent_program` (which runs the program) and :mod:`relax_gym.envs.turn_proxy` (which
plays it turn by turn)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentEndpoint", "ProgramRun"]


@dataclass(frozen=True)
class AgentEndpoint:
    """Where the program's model lives, as the host sees it: ``base_url`` ends in ``/v1`` and must be loopback."""

    base_url: str
    api_key: str
    model: str = "policy"


@dataclass
class ProgramRun:
    """What the program did: exit code (None when it was killed), its output, its output files."""

    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    outputs: dict[str, str] = field(default_factory=dict)
    launch_error: str = ""
    interfaces: tuple[str, ...] | None = None  # the sandbox's network interfaces, as seen from inside (None: local)

    @property
    def summary(self) -> dict[str, Any]:
        """What an episode's info reports of the run (deterministic: no timings, no logs)."""
        out: dict[str, Any] = {"agent_rc": self.rc, "agent_timed_out": self.timed_out}
        if self.interfaces is not None:
            out["sandbox_interfaces"] = list(self.interfaces)
        return out
