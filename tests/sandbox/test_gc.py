"""`relax-gym sandbox gc`: what a process killed outright (SIGKILL: no close, no atexit) left behind is removed;
the sandboxes of live processes stay unless --all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from relax_gym.cli import app

pytestmark = pytest.mark.timeout(240)

# A child that starts one sandbox, says its id, and is SIGKILLed by itself before it can close anything.
ORPHAN = textwrap.dedent("""
    import asyncio, os, signal, sys
    from relax_gym.sandbox.backends import get_backend
    from relax_gym.sandbox.spec import SandboxSpec

    box = asyncio.run(get_backend(sys.argv[1]).create(SandboxSpec(memory_mb=128, pids=32)))
    print(box.id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def orphan(backend) -> str:
    child = subprocess.run([sys.executable, "-c", ORPHAN, backend.name], capture_output=True, text=True, timeout=120, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    return child.stdout.strip()


def gc(*args: str) -> str:
    result = CliRunner().invoke(app, ["sandbox", "gc", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def test_gc_removes_what_a_killed_process_left_and_keeps_live_owners(backend, spec):
    left = orphan(backend)
    assert left in backend.every(), "the killed child's sandbox should still be there before gc"
    mine = asyncio.run(backend.create(spec))
    try:
        out = gc()
        assert f"{backend.name}: removed " in out
        assert left not in backend.every()
        assert mine.id in backend.every() and backend.live() == [mine.id], "a live owner's sandbox was removed"
        assert int(out.split(f"{backend.name}: removed ")[1].split(",")[0]) >= 1
    finally:
        asyncio.run(mine.close())
    assert mine.id not in backend.every()


def test_gc_all_removes_live_owners_too(backend, spec):
    mine = asyncio.run(backend.create(spec))
    try:
        out = gc("--all")
        assert mine.id not in backend.every() and f"{backend.name}: removed " in out
    finally:
        asyncio.run(mine.close())  # closing what gc already removed is not an error
    assert backend.live() == [] and os.getpid() > 0
