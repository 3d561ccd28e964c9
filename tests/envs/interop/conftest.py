"""The foreign frameworks' venvs, made once per cache by the library's own rule (``relax_gym.envs.interop.venvs``):
pip installs each framework's pinned release from the package index the first time, later sessions reuse it."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote import launcher


@pytest.fixture(scope="session")
def gem_python() -> Path:
    return ensure_venv(FRAMEWORKS["gem"])


@pytest.fixture(scope="session")
def skyrl_python() -> Path:
    return ensure_venv(FRAMEWORKS["skyrl-gym"])


@pytest.fixture
def servers(tmp_path, monkeypatch):
    """This test's env servers, logging under tmp_path, all stopped at its end."""
    monkeypatch.setattr(launcher, "log_dir", lambda: tmp_path / "server-logs")
    yield
    launcher.stop_all()

