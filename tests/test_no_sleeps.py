"""Tests order events with events, conditions or the virtual clock, and assert no wall-clock bound.

On a busy machine a sleep of any length can end before the thing it waits for, and any elapsed-time bound can be
exceeded; a test that bets on either fails for reasons that are not bugs. Two scans of every test module:

- a call ``time.sleep(x)`` / ``asyncio.sleep(x)`` with a literal ``x`` >= 0.05 s outside a loop. A sleep inside a
  loop is a poll interval (the loop re-checks its condition) or pacing; sleeps inside a test that runs its
  coroutine on the virtual clock (it calls ``run_on_virtual_clock`` or ``run_virtual``) are simulated time.
- an elapsed time (a difference of ``time.monotonic()``, ``time.time()`` or ``time.perf_counter()`` readings, a
  name bound to one, or an attribute that holds one: ``.duration``, ``.elapsed``, ``.elapsed_s``) held under a
  bound: ``elapsed < x``, ``x > elapsed``. A lower bound (``elapsed >= x``) is fine: slowness cannot break it.

What remains is listed below with its reason, per (module, top-level function or class).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SLEEP_LIMIT_S = 0.05
CLOCKS = {"monotonic", "time", "perf_counter"}
VIRTUAL_RUNNERS = {"run_on_virtual_clock", "run_virtual"}
# attributes that hold a measured wall time (a sandbox command's ExecResult.duration, a report's elapsed_s)
ELAPSED_ATTRIBUTES = {"duration", "elapsed", "elapsed_s"}

# (module, top-level name) -> why its sleep is not an ordering bet
ALLOWED_SLEEPS: dict[tuple[str, str], str] = {
    ("trainer/databus/test_databus.py", "test_seal_releases_a_waiting_fetch_with_a_tail"):
        "lets the fetch start waiting before the rows come; it passes in either order (virtual time on the twin)",
    ("trainer/databus/test_databus.py", "test_unacked_lease_runs_out"):
        "sleeps past a 0.4 s lease: load only lengthens it, so the lease has lapsed either way (virtual on the twin)",
    ("omni/test_decode_pool.py", "test_a_decode_under_way_is_shared_not_repeated"):
        "gives the reset thread time to reach the in-flight wait; in either order one decode serves both",
    ("sandbox/test_bwrap.py", "test_cgroup_limits_are_set_and_commands_run_inside_as_the_uid"):
        "lets the command's own process join the cgroup; the uids checked hold in either order",
    ("sandbox/test_bwrap.py", "_sleep_a_while"):
        "the body of a forked child that must outlive the command; nothing waits for its length",
    ("sandbox/test_docker_channel.py", "test_channel_exec_is_quick_and_cancellation_kills_the_command"):
        "lets the command start before the cancel; no sleep is left running in either order",
    ("test_bench_learning.py", "test_load_keeps_busy_processes_until_terminated"):
        "a negative check (the busy loops do not end by themselves): load only lengthens the window",
    ("test_watchdog.py", "test_a_child_guarded_from_an_ended_thread_lives_while_its_parent_lives"):
        "a negative check past two watchdog polls (nothing is killed): load only lengthens the window",
    ("trainer/engines/test_engine_http.py", "test_pause_and_continue"):
        "a negative check (a paused engine does not answer): load only lengthens the window",
    ("trainer/rewards/test_judge.py", "ScriptedEngine"):
        "a fake judge that hangs for an hour on purpose; the test cancels it, nothing waits for its length",
}

# (module, top-level name) -> why its elapsed-time upper bound is not a bet on the machine's speed
ALLOWED_BOUNDS: dict[tuple[str, str], str] = {
    ("envs/test_synth.py", "test_avqa_media_format"):
        "info.duration is the length of a generated WAV file (soundfile's info), not a wall time",
    ("sandbox/test_docker_channel.py", "test_channel_exec_is_quick_and_cancellation_kills_the_command"):
        "the channel's claim is speed: 0.5 s per exec where the channel takes a few ms (a docker exec ~70 ms)",
    ("trainer/dcs/test_dcs_wire.py", "test_an_engine_dying_mid_push_is_named_and_the_survivor_untouched"):
        "tells a dead socket found at once from the 20 s wire timeout: 15 s of margin for one failing push",
    ("trainer/plan/test_clock.py", "test_sleep_jumps_the_clock_without_waiting"):
        "an hour of virtual time in under 1 s of wall time: the virtual clock's whole point, 3600x margin",
}


def _is_clock_call(node: ast.AST) -> bool:
    """``time.monotonic()``, ``time.time()``, ``time.perf_counter()`` (or the bare names)."""
    if not isinstance(node, ast.Call) or node.args:
        return False
    f = node.func
    if isinstance(f, ast.Attribute):
        return f.attr in CLOCKS and isinstance(f.value, ast.Name) and f.value.id == "time"
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def _is_difference(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and (_is_clock_call(node.left) or _is_clock_call(node.right)))


def _sleep_seconds(node: ast.AST) -> float | None:
    """The literal length of a ``time.sleep`` / ``asyncio.sleep`` call, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    named = (isinstance(f, ast.Attribute) and f.attr == "sleep" and isinstance(f.value, ast.Name)
             and f.value.id in {"time", "asyncio"}) or (isinstance(f, ast.Name) and f.id == "sleep")
    arg = node.args[0]
    if named and isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float)):
        return float(arg.value)
    return None


def _calls(tree: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) in names or getattr(n.func, "attr", None)
                                            in names) for n in ast.walk(tree))


@cache
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def _top_level(source: str) -> Iterator[tuple[str, ast.AST]]:
    for node in _parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node


def _outside_loops(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under ``node`` that is not inside a ``for`` or ``while`` loop."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, (ast.For, ast.AsyncFor, ast.While)):
            yield from _outside_loops(child)


def sleeps(source: str) -> list[tuple[str, int]]:
    """(top-level name, line) of each literal sleep >= SLEEP_LIMIT_S outside loops and virtual-clock tests."""
    out = []
    for name, node in _top_level(source):
        if _calls(node, VIRTUAL_RUNNERS):
            continue
        for call in _outside_loops(node):
            seconds = _sleep_seconds(call)
            if seconds is not None and seconds >= SLEEP_LIMIT_S:
                out.append((name, call.lineno))
    return out


def elapsed_bounds(source: str) -> list[tuple[str, int]]:
    """(top-level name, line) of each comparison that holds an elapsed wall-clock time under a bound."""
    out = []
    for name, node in _top_level(source):
        elapsed_names = {t.id for a in ast.walk(node) if isinstance(a, ast.Assign) and _is_difference(a.value)
                         for t in a.targets if isinstance(t, ast.Name)}

        def elapsed(expr: ast.AST) -> bool:
            return any(_is_difference(n) or (isinstance(n, ast.Name) and n.id in elapsed_names)
                       or (isinstance(n, ast.Attribute) and n.attr in ELAPSED_ATTRIBUTES) for n in ast.walk(expr))

        for cmp in ast.walk(node):
            if not isinstance(cmp, ast.Compare):
                continue
            sides = [cmp.left, *cmp.comparators]
            for left, op, right in zip(sides, cmp.ops, sides[1:]):
                upper = ((isinstance(op, (ast.Lt, ast.LtE)) and elapsed(left))
                         or (isinstance(op, (ast.Gt, ast.GtE)) and elapsed(right)))
                if upper:
                    out.append((name, cmp.lineno))
                    break
    return out


@cache
def _sources() -> dict[str, str]:
    return {p.relative_to(TESTS).as_posix(): p.read_text() for p in sorted(TESTS.rglob("*.py"))
            if "__pycache__" not in p.parts}


@pytest.mark.parametrize("finder, allowed, fix", [
    (sleeps, ALLOWED_SLEEPS, "order by an event, a condition or the virtual clock instead, or add it to "
                             "ALLOWED_SLEEPS with the reason its length orders nothing"),
    (elapsed_bounds, ALLOWED_BOUNDS, "use the virtual clock, or an event under a generous outer limit, or add it "
                                     "to ALLOWED_BOUNDS with its reason"),
], ids=["no fixed sleeps", "no wall-clock bounds"])
def test_tests_bet_nothing_on_the_machines_speed(finder: Callable, allowed: dict, fix: str):
    found: dict[tuple[str, str], list[str]] = {}
    for module, source in _sources().items():
        for name, line in finder(source):
            found.setdefault((module, name), []).append(f"tests/{module}:{line} ({name})")
    bad = [where for key, wheres in found.items() if key not in allowed for where in wheres]
    assert not bad, f"{finder.__name__}: {fix}:\n" + "\n".join(bad)
    stale = sorted(set(allowed) - set(found))
    assert not stale, f"{finder.__name__}: allowed entries that no longer match anything (remove them): {stale}"


@pytest.mark.parametrize("source, expected", [
    ("import time\ndef test_a():\n    time.sleep(0.3)\n", [("test_a", 3)]),
    ("import asyncio\nasync def helper():\n    await asyncio.sleep(1)\n", [("helper", 3)]),
    ("import time\ndef test_a():\n    time.sleep(0.01)\n", []),  # shorter than the limit
    ("import time\ndef test_a():\n    while not ready():\n        time.sleep(0.1)\n", []),  # a poll
    ("import time\ndef test_a(s):\n    time.sleep(s)\n", []),  # a fake's simulated work, its length a parameter
    ("import asyncio\ndef test_a():\n    async def body():\n        await asyncio.sleep(5)\n"
     "    run_on_virtual_clock(body())\n", []),  # simulated time
])
def test_the_sleep_scan_sees_fixed_sleeps(source, expected):
    assert sleeps(source) == expected


@pytest.mark.parametrize("source, expected", [
    ("import time\ndef test_a():\n    t0 = time.monotonic()\n    f()\n    assert time.monotonic() - t0 < 5\n",
     [("test_a", 5)]),
    ("import time\ndef test_a():\n    t0 = time.perf_counter()\n    took = time.perf_counter() - t0\n"
     "    assert 1.4 < took <= 10\n", [("test_a", 5)]),
    ("import time\ndef test_a():\n    t0 = time.time()\n    assert 0.5 > (time.time() - t0) / 10\n", [("test_a", 4)]),
    ("import time\ndef test_a():\n    t0 = time.monotonic()\n    assert time.monotonic() - t0 >= 0.2\n", []),
    ("import time\ndef test_a(deadline):\n    while time.monotonic() < deadline:\n        pass\n", []),
])
def test_the_bound_scan_sees_elapsed_time_upper_bounds(source, expected):
    assert elapsed_bounds(source) == expected


@pytest.mark.timeout(40)
def test_a_timeout_marker_is_a_stretched_hang_guard(request):
    from tests.conftest import TIMEOUT_STRETCH

    assert TIMEOUT_STRETCH >= 3  # two busy loops on a 2-core machine slow a test about threefold
    assert request.node.get_closest_marker("timeout").args == (40 * TIMEOUT_STRETCH,)
    assert request.config.getini("timeout") == "900"  # the default for tests without a marker, stretched alike
