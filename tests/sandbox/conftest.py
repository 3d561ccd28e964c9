"""Sandbox fixtures: every contract test runs on each backend. A backend that cannot run here is skipped with
its reason, which under RELAX_GYM_CI=1 (CI) is a failure."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.spec import SandboxSpec

BACKENDS = ("docker", "bwrap")


@pytest.fixture(params=BACKENDS)
def backend(request):
    b = get_backend(request.param)
    problem = b.check()
    if problem:
        pytest.skip(f"{request.param} sandbox backend unavailable: {problem}")
    return b


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(memory_mb=256, pids=64, exec_timeout_s=20, max_output_bytes=64 * 1024)


def run(coro):
    return asyncio.run(coro)
