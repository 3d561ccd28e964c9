"""benchmarks/learning.py's helpers: the busy-loop load, run directories per recipe and load, the 10-minute eval."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def learning():
    return load_benchmark("learning")


def test_load_keeps_busy_processes_until_terminated(learning):
    procs = learning.start_load(2)
    try:
        time.sleep(0.5)
        assert len(procs) == 2 and all(p.poll() is None for p in procs), "a busy loop never ends on its own"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    assert all(p.poll() is not None for p in procs)
    assert learning.start_load(0) == []


def test_run_dirs_keep_recipes_and_loads_apart(learning):
    assert learning.run_dir_of("recipes/cpu-nextqa.yaml", 0) == Path("runs/bench-learning-seed0")
    assert learning.run_dir_of("recipes/cpu-echo-ink.yaml", 1) == Path("runs/bench-learning-cpu-echo-ink-seed1")
    assert learning.run_dir_of("recipes/cpu-nextqa.yaml", 1, load=1) == Path("runs/bench-learning-seed1-load1")
    assert learning.run_dir_of("recipes/cpu-nextqa.yaml", 0, quick=True) == Path("runs/bench-learning-quick-seed0")


def test_eval_within_takes_the_last_eval_inside_the_window(learning, tmp_path):
    rows = [{"step": 0, "elapsed_s": 10.0, "eval_reward": 0.3}, {"step": 5, "elapsed_s": 300.0},
            {"step": 50, "elapsed_s": 590.0, "eval_reward": 0.7}, {"step": 60, "elapsed_s": 640.0, "eval_reward": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert learning._eval_within(tmp_path, 600.0) == 0.7
    assert learning._eval_within(tmp_path, 100.0) == 0.3
