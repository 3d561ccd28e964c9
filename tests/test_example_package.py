"""examples/relax-gym-example-env, installed as a third party would, is found through its entry point alone.

The package is installed with pip into a scratch folder (``--target``; offline: ``--no-index``, no dependencies,
the project's own setuptools as the build backend), then a fresh interpreter with only that folder added to its
path imports relax_gym, makes the env by id and runs check_env on it. The same probe without the folder must not
find the id: that is what shows the entry point, and nothing else, did the registering.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "relax-gym-example-env"
ENV_ID = "example-lamp-panel"

PROBE = f"""
import json
import relax_gym
from relax_gym.envs import check_env

spec = relax_gym.spec({ENV_ID!r})
env = relax_gym.make({ENV_ID!r})
report = check_env(env)
print(json.dumps({{"source": spec.source, "entry_point": spec.entry_point, "passed": report.passed,
                  "module": type(env.unwrapped).__module__}}))
"""


def _probe(extra_path: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RELAX_GYM_ENV_PATH")}
    if extra_path is not None:
        env["PYTHONPATH"] = str(extra_path)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("example-package")


@pytest.fixture(scope="module")
def site(work) -> Path:
    source = work / "source"  # a copy: an in-tree build writes build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"pip could not install the example package:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    return target


@pytest.mark.slow(reason="pip-installs the example package into a fresh site")
@pytest.mark.timeout(600)
def test_entry_point_is_declared_in_the_installed_metadata(site):
    (dist,) = site.glob("relax_gym_example_env-*.dist-info")
    entry_points = (dist / "entry_points.txt").read_text()
    assert "[relax_gym.envs]" in entry_points
    assert f"{ENV_ID} = relax_gym_example_env.lamp_panel:LampPanelEnv" in entry_points


@pytest.mark.slow(reason="pip-installs the example package into a fresh site")
@pytest.mark.timeout(600)
def test_installed_package_is_found_by_make_and_passes_check_env(site):
    proc = _probe(site)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["source"].startswith(f"entry point {ENV_ID} = relax_gym_example_env.lamp_panel:LampPanelEnv (package ")
    assert found["entry_point"] == "relax_gym_example_env.lamp_panel:LampPanelEnv"
    assert found["module"] == "relax_gym_example_env.lamp_panel"
    assert Path(site / "relax_gym_example_env" / "lamp_panel.py").is_file()
    assert "gold action => max reward" in found["passed"] and "garbage action => min reward, no exception" in found["passed"]


@pytest.mark.slow(reason="a fresh interpreter scans every entry point")
@pytest.mark.timeout(300)
def test_without_the_package_the_id_is_unknown():
    proc = _probe(None)
    assert proc.returncode != 0
    assert f"no environment {ENV_ID!r}" in proc.stderr


@pytest.mark.slow(reason="runs the installed package's own test suite in a child")
@pytest.mark.timeout(600)
def test_the_package_own_tests_pass_once_installed(site, work):
    """What a third party would run: the package's tests, against the installed package (not the repo's tests)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RELAX_GYM_ENV_PATH")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                          cwd=work / "source", env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "3 passed" in proc.stdout
