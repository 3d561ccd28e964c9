"""What tests/conftest.py sets in the environment of the suite's processes (the xdist workers, and every process they
start: engines, CLI runs, Ray's raylet and its workers)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_suite_lets_idle_openmp_threads_sleep_and_says_so_before_torch_loads():
    """OpenMP reads ``OMP_WAIT_POLICY`` when torch's thread pool starts, so the conftest must set it before anything
    of it imports torch; a policy the caller chose is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    code = "import os, sys; import tests.conftest; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    run = lambda env: subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,  # noqa: E731
                                     text=True, timeout=120, check=True).stdout.split()
    assert run(env) == ["PASSIVE", "False"]
    assert run({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == ["ACTIVE", "False"]
