"""The framework venvs' rules that need no pip: a venv the user names must import the framework and the server's
needs (the error names what is missing and what to install), a made venv's folder is keyed by its pins, an
interrupted build is not taken for a finished one, and foreign ids are told from ours by their scheme."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app
from relax_gym.envs.interop import venvs
from relax_gym.envs.interop.frameworks import FRAMEWORKS, Framework, split_foreign_id
from relax_gym.envs.interop.venvs import FrameworkVenvError, framework_python, venv_key


def test_a_named_venv_without_the_framework_is_refused_naming_what_is_missing(tmp_path, monkeypatch):
    fw = FRAMEWORKS["gem"]
    with pytest.raises(FrameworkVenvError) as err:
        framework_python(fw, sys.executable)  # ours: it has the server's needs but never gem
    assert "cannot import gem:" in str(err.value) and "gem-llm==0.1.0" in str(err.value)
    monkeypatch.setenv("RELAX_GYM_VENV_GEM", str(tmp_path / "nowhere"))
    with pytest.raises(FrameworkVenvError, match="no Python interpreter at .*nowhere"):
        framework_python(fw)


def test_the_made_venv_is_keyed_by_its_pins():
    fw = FRAMEWORKS["gem"]
    other = Framework(**{**fw.__dict__, "requirements": ("gem-llm==0.0.4",)})
    assert venv_key(fw) != venv_key(other) and venv_key(fw) == venv_key(Framework(**fw.__dict__))


def test_an_interrupted_build_is_built_again(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAX_GYM_CACHE", str(tmp_path))
    fw = FRAMEWORKS["gem"]
    folder = tmp_path / "interop" / f"gem-{venv_key(fw)}"
    (folder / "bin").mkdir(parents=True)  # what a killed build leaves: a folder without its marker
    built: list[Path] = []
    monkeypatch.setattr(venvs, "_build", lambda f, *rest: (built.append(f), (f / venvs.MARKER).write_text("{}")))
    assert venvs.ensure_venv(fw) == folder / "bin" / "python" and built == [folder]
    assert venvs.ensure_venv(fw) == folder / "bin" / "python" and built == [folder]  # the marker: kept


def test_foreign_ids_are_told_from_ours_by_their_scheme():
    assert split_foreign_id("nextqa-video") is None and split_foreign_id("remote:http://127.0.0.1:1/x") is None
    fw, rest = split_foreign_id("gem:game:GuessTheNumber-v0-easy")
    assert fw.scheme == "gem" and rest == "game:GuessTheNumber-v0-easy"
    with pytest.raises(ValueError, match="needs a skyrl-gym env class"):
        split_foreign_id("skyrl-gym:")
    fw, rest = split_foreign_id("openenv:http://127.0.0.1:8000")
    assert fw.scheme == "openenv" and rest == "http://127.0.0.1:8000"  # the first ':' ends the scheme


def test_envs_prepare_refuses_an_unknown_framework():
    result = CliRunner().invoke(app, ["envs", "prepare", "verifierz"])
    assert result.exit_code == 2 and "no env framework 'verifierz'; known: gem, nemo-gym, openenv, skyrl-gym, verifiers" in result.output
