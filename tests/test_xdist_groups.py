"""`make test`'s two workers keep each group of tests on one worker (tests/xdist_groups.py), for real: a small
project using our scheduler runs under pytest-xdist and each test records the worker it ran on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.xdist_groups import GroupOf

REPO = Path(__file__).resolve().parents[1]
N = 12  # tests per file: plain load scheduling would split each file over both workers


def test_a_file_maps_to_its_group_and_a_free_test_to_itself():
    group_of = GroupOf(REPO)
    assert group_of("tests/sandbox/test_pool.py::test_x[docker]") == "group:sandbox"
    assert group_of("tests/integration/test_recovery.py::test_y") == "group:ray"
    assert group_of("tests/integration/test_real_width_training.py::test_z") == "group:real-width"
    assert group_of("tests/test_docs.py::test_w") == "tests/test_docs.py::test_w"


def _project(root: Path) -> None:
    (root / "conftest.py").write_text(textwrap.dedent("""
        from tests.xdist_groups import make_scheduler

        def pytest_xdist_make_scheduler(config, log):
            return make_scheduler(config, log)
    """))
    record = textwrap.dedent("""
        import json, os, pathlib
        import pytest

        @pytest.mark.parametrize("i", range({n}))
        def test_record(i, request):
            out = pathlib.Path(os.environ["GROUPS_OUT"]) / f"{{request.node.path.stem}}-{{i}}.json"
            out.write_text(json.dumps(os.environ["PYTEST_XDIST_WORKER"]))
    """)
    (root / "sandbox").mkdir()
    (root / "sandbox" / "test_pool_like.py").write_text(record.format(n=N))
    (root / "test_ray_like.py").write_text("# uses ray_session\n" + record.format(n=N))
    (root / "test_free.py").write_text(record.format(n=N))


def test_each_group_runs_on_one_worker_and_free_tests_on_both(tmp_path):
    project, out = tmp_path / "project", tmp_path / "out"
    project.mkdir()
    out.mkdir()
    _project(project)
    env = {**os.environ, "PYTHONPATH": str(REPO), "GROUPS_OUT": str(out)}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider",
                           "-p", "no:randomly"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    workers: dict[str, set[str]] = {}
    for path in out.glob("*.json"):
        workers.setdefault(path.stem.rsplit("-", 1)[0], set()).add(json.loads(path.read_text()))
    assert len(list(out.glob("*.json"))) == 3 * N
    assert len(workers["test_pool_like"]) == 1 and len(workers["test_ray_like"]) == 1
    assert workers["test_pool_like"] != workers["test_ray_like"]  # the two largest units go first, one to each
