"""benchmarks/soak.py's helpers: the fault plan it loads, the resource slopes and the flatness verdict, and a
resource sample of this process."""

from __future__ import annotations

import pytest

from relax_gym.trainer.config import load_recipe
from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def soak():
    return load_benchmark("soak")


def test_the_fault_plan_loads_with_the_recipe(soak):
    cfg = load_recipe(soak.RECIPE, [*soak.workload(200, "docker"), soak.fault_plan(200, 0.05)])
    kinds = sorted((f.kind, getattr(f, "role", ""), f.probability, f.at_step) for f in cfg.faults.inject)
    assert kinds == [("engine_error", "", 0.05, None), ("kill", "actor", None, 101), ("kill", "advantages", 0.05, None),
                     ("kill", "env_worker", 0.05, None), ("kill", "inference", 0.05, None),
                     ("kill", "reference", 0.05, None), ("sandbox_hang", "", 0.05, None)]
    assert cfg.trainer.mode == "async" and cfg.trainer.checkpoint_every == 2  # the actor kill replays from step 100


def test_slope_over_the_second_half(soak):
    rising = [{"step": s, "rss_mib": 1000 + 2.0 * s} for s in range(10, 210, 10)]  # +2 MiB a step: a leak
    fit = soak.slope(rising, "rss_mib")
    assert fit["per_100_steps"] == pytest.approx(200.0) and fit["flat"] is False and fit["points"] == 20
    noisy = [{"step": s, "rss_mib": 1000 + (5 if s % 20 else -5)} for s in range(10, 210, 10)]
    assert soak.slope(noisy, "rss_mib")["flat"] is True
    one_more = [{"step": s, "containers": 4 + (s >= 200)} for s in range(10, 210, 10)]  # a count may wobble by one
    assert soak.slope(one_more, "containers")["flat"] is True
    piling = [{"step": s, "containers": s // 10} for s in range(10, 210, 10)]
    assert soak.slope(piling, "containers")["flat"] is False
    gaps = [{"step": 10, "ray_actors": None}, {"step": 20, "ray_actors": 9}]
    assert soak.slope(gaps, "ray_actors")["per_100_steps"] is None


def test_a_resource_sample_counts_this_process(soak):
    sample = soak.sample_resources()
    assert sample["rss_mib"] > 10 and sample["open_fds"] >= 3 and sample["threads"] >= 1
