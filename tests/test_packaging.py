"""The wheel carries the built-in manifests, so a non-editable install still finds nextqa-video and echo-ink."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_wheel_bundles_registry_and_entry_point(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("relax_gym-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"relax_gym/_envs_registry/nextqa-video/env.toml", "relax_gym/_envs_registry/echo-ink/env.toml"} <= names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "relax-gym = relax_gym.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

