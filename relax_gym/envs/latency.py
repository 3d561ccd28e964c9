"""Simulated tool latency: a seeded, heavy-tailed wait added to each tool call, for long-tail agentic workloads.

Real agent tools (web calls, builds, test suites) take from milliseconds to minutes, and the slow tail decides how
long a synchronous RL step waits for its last episode. ``ToolLatency`` describes that wait as a distribution::

    env = relax_gym.make("tool-use", tool_latency={"dist": "lognormal", "median_s": 0.5, "sigma": 1.2, "max_s": 20})

- ``lognormal``: ``median_s * exp(sigma * N(0, 1))``;
- ``pareto``: a Pareto wait of minimum ``scale_s`` and tail index ``alpha`` (``scale_s * (1 + Lomax(alpha))``;
  a smaller ``alpha`` is a heavier tail, and the mean is infinite for ``alpha <= 1``);
- ``fixed``: always ``median_s``.

Every draw is capped at ``max_s``. Draws come from an RNG seeded by ``seed`` and the episode's own seed, so the
same episode waits the same amounts whatever else runs. The wait is a sleep of the thread that steps the env
(episode runners step envs in worker threads), so it costs no CPU and never blocks an event loop.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ToolLatency"]


class ToolLatency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dist: Literal["lognormal", "pareto", "fixed"] = "lognormal"
    median_s: float = Field(default=0.5, ge=0)  # lognormal median / fixed value
    sigma: float = Field(default=1.0, ge=0)  # lognormal spread of log-latency
    scale_s: float = Field(default=0.5, ge=0)  # pareto scale
    alpha: float = Field(default=1.5, gt=0)  # pareto tail index
    max_s: float = Field(default=30.0, gt=0)  # every draw is capped here
    seed: int = 0

    def rng(self, episode_seed: int) -> np.random.Generator:
        """The latency RNG of one episode."""
        return np.random.default_rng([int(self.seed) & 0xFFFFFFFF, int(episode_seed) & 0xFFFFFFFFFFFFFFFF])

    def draw(self, rng: np.random.Generator) -> float:
        if self.dist == "fixed":
            value = self.median_s
        elif self.dist == "lognormal":
            value = self.median_s * float(np.exp(self.sigma * rng.standard_normal()))
        else:
            value = self.scale_s * (1.0 + float(rng.pareto(self.alpha)))
        return float(min(max(value, 0.0), self.max_s))

    @staticmethod
    def wait(seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
