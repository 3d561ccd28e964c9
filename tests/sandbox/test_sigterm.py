"""A `relax-gym` command stopped with SIGTERM unwinds: the sandboxes of its envs are gone when it has exited.

`relax-gym envs play tool-use --policy stdin` gets the gold tool call on stdin (the call runs in a sandbox), then
waits for the next answer; it is sent SIGTERM there. Python's default would end it without running `finally` or
atexit; relax-gym's handler (relax_gym/terminate.py) makes it exit 143 after closing the env."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import relax_gym

pytestmark = pytest.mark.timeout(240)


def test_sigterm_while_playing_leaves_no_sandbox(backend):
    env = relax_gym.make("tool-use", backend=backend.name)
    try:
        _, info = env.reset(seed=0)
        gold = info["gold"]
    finally:
        env.close()
    before = set(backend.every())
    child = subprocess.Popen([sys.executable, "-m", "relax_gym.cli", "envs", "play", "tool-use", "--policy", "stdin"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "RELAX_GYM_SANDBOX": backend.name})
    try:
        child.stdin.write(gold + "\n")
        child.stdin.flush()
        seen, deadline = "", time.monotonic() + 120
        while "\nreward " not in seen and time.monotonic() < deadline:  # the step (its call ran in a sandbox) printed
            line = child.stdout.readline()
            if not line:
                break
            seen += line
        assert "\nreward " in seen and "tool calls" in seen, seen
        assert set(backend.every()) - before, "the played episode should hold a sandbox now"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not set(backend.every()) - before, "a sandbox of the SIGTERMed command is left"


def test_the_handler_defers_to_a_handler_already_chosen():
    code = ("import signal\nfrom relax_gym.terminate import exit_on_sigterm\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint(exit_on_sigterm(), signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["False", "True"]
