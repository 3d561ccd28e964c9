"""Backend selection through RELAX_GYM_SANDBOX: explicit, auto, and one clear error when nothing works."""

from __future__ import annotations

import pytest

from relax_gym.sandbox import backends
from relax_gym.sandbox.base import SandboxUnavailable


class Fake:
    def __init__(self, name, problem):
        self.name, self.problem = name, problem

    def check(self):
        return self.problem


@pytest.fixture
def fakes(monkeypatch):
    table = {}
    monkeypatch.setattr(backends, "get_backend", lambda name: table[name] if name in table else (_ for _ in ()).throw(ValueError(f"unknown sandbox backend {name!r}")))
    return table


def test_auto_prefers_docker_then_bwrap(fakes, monkeypatch):
    monkeypatch.delenv("RELAX_GYM_SANDBOX", raising=False)
    fakes.update(docker=Fake("docker", None), bwrap=Fake("bwrap", None))
    assert backends.select_backend().name == "docker"
    fakes["docker"].problem = "no Docker engine answers"
    assert backends.select_backend().name == "bwrap"


def test_nothing_works_says_what_to_install(fakes, monkeypatch):
    monkeypatch.setenv("RELAX_GYM_SANDBOX", "auto")
    fakes.update(docker=Fake("docker", "no engine"), bwrap=Fake("bwrap", "bwrap not found"))
    with pytest.raises(SandboxUnavailable, match=r"docker: no engine; bwrap: bwrap not found.*apt-get install docker.io.*apt-get install bubblewrap"):
        backends.select_backend()


def test_explicit_choice_is_honoured_or_explained(fakes, monkeypatch):
    fakes.update(docker=Fake("docker", "no engine"), bwrap=Fake("bwrap", None))
    monkeypatch.setenv("RELAX_GYM_SANDBOX", "docker")
    with pytest.raises(SandboxUnavailable, match=r"sandbox backend 'docker' \(RELAX_GYM_SANDBOX\) cannot run here: no engine"):
        backends.select_backend()
    assert backends.select_backend("bwrap").name == "bwrap"
    monkeypatch.setenv("RELAX_GYM_SANDBOX", "podman")
    with pytest.raises(ValueError, match="unknown sandbox backend 'podman'"):
        backends.select_backend()


def test_real_lookup_rejects_unknown_names():
    with pytest.raises(ValueError, match="choose one of docker, bwrap or auto"):
        backends.get_backend("firecracker")
    assert backends.get_backend("bwrap") is backends.get_backend("bwrap")
