"""Simulated tool latency: seeded heavy-tailed draws, capped, applied per tool call, tasks unchanged."""

from __future__ import annotations

import time

import numpy as np
import pytest

import relax_gym
from relax_gym.envs.latency import ToolLatency


@pytest.mark.parametrize("spec", [
    {"dist": "lognormal", "median_s": 1.0, "sigma": 1.5, "max_s": 60.0},
    {"dist": "pareto", "scale_s": 1.0, "alpha": 1.2, "max_s": 60.0},
])
def test_draws_are_seeded_heavy_tailed_and_capped(spec):
    lat = ToolLatency.model_validate(spec)
    a = [lat.draw(lat.rng(7)) for _ in range(3)]
    assert a == [lat.draw(lat.rng(7)) for _ in range(3)]  # same episode seed, same waits
    rng = lat.rng(1)
    draws = np.array([lat.draw(rng) for _ in range(20_000)])
    assert draws.max() <= 60.0 and draws.min() >= 0.0
    assert np.percentile(draws, 99) > 5 * np.median(draws)  # a long tail
    assert ToolLatency(dist="fixed", median_s=0.2).draw(rng) == 0.2


def test_tool_env_waits_per_call_and_keeps_its_tasks(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(ToolLatency, "wait", staticmethod(waits.append))
    env = relax_gym.make("image-zoom", tool_latency={"dist": "lognormal", "median_s": 0.5, "sigma": 1.0})
    plain = relax_gym.make("image-zoom")
    obs, info = env.reset(seed=3)
    obs2, info2 = plain.reset(seed=3)
    assert info["gold"] == info2["gold"] and info["episode_id"] == info2["episode_id"]
    _, _, _, _, step_info = env.step(info["gold"])
    assert len(waits) == 1 and step_info["tool_latency_s"] == pytest.approx(waits[0])
    env.reset(seed=3)
    env.step(info["gold"])
    assert waits[1] == waits[0]  # the same episode waits the same


def test_the_wait_sleeps_without_burning_cpu():
    t0, c0 = time.perf_counter(), time.process_time()
    ToolLatency.wait(0.2)
    assert time.perf_counter() - t0 >= 0.2 and time.process_time() - c0 < 0.05
