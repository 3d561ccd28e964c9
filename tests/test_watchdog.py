"""The parent-death watchdog (relax_gym/watchdog.py) with stand-in children: a parent process starts ``sleep``
children, guards them, and is then SIGKILLed (or exits); every child, and the members of a guarded process group,
must then be gone (the watchdog polls every 0.25 s, so on a quiet machine within 2 s; the test waits for the state,
under a generous outer limit, and bets nothing on the machine's speed). A child guarded from a thread that has ended lives on while its parent lives (the
``PR_SET_PDEATHSIG`` pitfall the watchdog avoids)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from relax_gym import watchdog
from relax_gym.watchdog_child import Guarded

PARENT = textwrap.dedent("""
    import json, subprocess, sys, threading, time
    from relax_gym.watchdog import guard, watchdog_pid

    leader = subprocess.Popen(["sh", "-c", "sleep 1000 & sleep 1000"], start_new_session=True)
    plain = subprocess.Popen(["sleep", "1000"])
    guard(leader)
    guard(plain)
    box = {}
    def from_a_thread():
        box["p"] = subprocess.Popen(["sleep", "1000"])
        guard(box["p"])
    t = threading.Thread(target=from_a_thread)
    t.start(); t.join()
    time.sleep(0.3)  # the group's background sleep has started
    group = [int(p) for p in subprocess.run(["pgrep", "-g", str(leader.pid)], capture_output=True, text=True).stdout.split()]
    print(json.dumps({"children": [leader.pid, plain.pid, box["p"].pid], "group": group, "watchdog": watchdog_pid()}),
          flush=True)
    if sys.argv[1] == "exit":
        sys.exit(0)
    time.sleep(1000)
""")


OUTER_LIMIT_S = 60.0  # an outer limit for a state to be reached, not a speed claim


def _alive(pid: int) -> bool:
    """True for a running process; False when gone or a zombie (dead, waiting for whoever reaps orphans)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_parent(mode: str) -> tuple[subprocess.Popen, dict]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    assert line, f"the stand-in parent printed nothing (exit code {parent.poll()})"
    return parent, json.loads(line)


def _wait_gone(pids: list[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.mark.parametrize("mode", ["sigkill", "exit"])
def test_children_die_after_their_parent(mode):
    parent, info = _start_parent(mode)
    pids = info["children"] + info["group"]
    try:
        assert len(info["group"]) >= 2  # the leader's shell and its sleeps
        assert all(_alive(p) for p in pids)
        if mode == "sigkill":
            parent.kill()
        parent.wait(10)
        assert _wait_gone(pids, within_s=OUTER_LIMIT_S) == []
        assert _wait_gone([info["watchdog"]], within_s=OUTER_LIMIT_S) == []  # the watchdog leaves too
    finally:
        _kill_leftovers(pids)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_child_guarded_from_an_ended_thread_lives_while_its_parent_lives():
    parent, info = _start_parent("sigkill")
    pids = info["children"] + info["group"]
    try:
        time.sleep(0.6)  # past two polls of the watchdog
        assert all(_alive(p) for p in pids)
        assert _alive(info["watchdog"])
    finally:
        parent.kill()
        parent.wait()
        assert _wait_gone(pids, within_s=OUTER_LIMIT_S) == []
        _kill_leftovers(pids)


def test_the_watchdog_forgets_children_that_exited():
    """Held by pidfd: once a guarded child has exited (and been reaped, so its pid may be reused), it is neither alive
    to the watchdog nor signalled by it."""
    guarded = Guarded()
    gone, running = subprocess.Popen(["sleep", "1000"]), subprocess.Popen(["sleep", "1000"])
    try:
        guarded.add(gone.pid)
        guarded.add(running.pid)
        gone.kill()
        gone.wait()
        assert not guarded.alive(gone.pid, *guarded.children[gone.pid])
        guarded.prune()
        assert list(guarded.children) == [running.pid]
        guarded.kill_all()
        assert running.wait(5) == -signal.SIGKILL
    finally:
        for p in (gone, running):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_guard_refuses_a_process_that_has_not_started():
    class NotStarted:
        pid = None

    with pytest.raises(ValueError, match="has not started"):
        watchdog.guard(NotStarted())
