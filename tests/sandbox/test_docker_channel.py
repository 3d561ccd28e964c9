"""The docker backend's command channel to PID 1 (docker_init / docker_channel) against the ``docker exec`` path:
same results for the same commands, files and resets; reuse leaves nothing behind; a lost channel falls back.

They run against the real engine; without one they skip with the reason (a failure under RELAX_GYM_CI=1).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import pytest

from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.base import SandboxError
from relax_gym.sandbox.docker import EXEC_MODE_VAR
from relax_gym.sandbox.docker_channel import Channel, ChannelClosed
from relax_gym.sandbox.spec import SandboxSpec

from .conftest import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# (command, stdin, timeout): each runs in both sandboxes; everything but the duration must agree
COMMANDS = [
    ("id -u; id -g; pwd; echo err >&2; exit 3", None, 10),
    (["cat"], "hello\n", 10),
    ("wc -c", "x" * 300_000, 10),
    ("cat /dev/stdin; echo rc=$?", None, 10),  # no stdin: /dev/null
    ("env | grep -v -e '^HOSTNAME=' -e '^SHLVL=' | sort", None, 10),  # HOSTNAME is per container
    ("umask; ulimit -n; echo $HOME", None, 10),
    ("kill -9 $$", None, 10),
    ("kill -PIPE $$", None, 10),  # default signal dispositions: SIGPIPE is not ignored
    ("exit 255", None, 10),
    ("sleep 5", None, 1),
    ("python3 -c \"import sys; sys.stdout.write('a' * 100000); sys.stderr.write('b' * 50000)\"", None, 10),
    ("sleep 300 & echo started", None, 10),
    ("exec >&- 2>&-; sleep 0.3; touch after-close", None, 10),  # closed stdout: still waited for
    ("ls after-close && ps -o comm | grep -c sleep", None, 10),
    ("printf 'no newline'", None, 10),
]


@pytest.fixture(scope="module")
def docker_backend():
    backend = get_backend("docker")
    problem = backend.check()
    if problem:
        pytest.skip(f"docker sandbox backend unavailable: {problem}")
    return backend


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(memory_mb=128, pids=48, exec_timeout_s=20, max_output_bytes=16 * 1024, env={"FOO": "bar"})


async def _create(backend, spec, mode: str):
    import os

    before = os.environ.get(EXEC_MODE_VAR)
    os.environ[EXEC_MODE_VAR] = mode
    try:
        box = await backend.create(spec)
    finally:
        if before is None:
            os.environ.pop(EXEC_MODE_VAR, None)
        else:
            os.environ[EXEC_MODE_VAR] = before
    assert (box._channel is not None) == (mode == "channel")
    return box


def _shape(r):
    return r.rc, r.stdout, r.stderr, r.timed_out, r.oom_killed, r.truncated


def test_channel_and_docker_exec_give_the_same_results(docker_backend, spec):
    async def body():
        fast, slow = await _create(docker_backend, spec, "channel"), await _create(docker_backend, spec, "api")
        try:
            for cmd, stdin, timeout in COMMANDS:
                a, b = await fast.exec(cmd, timeout, stdin), await slow.exec(cmd, timeout, stdin)
                assert _shape(a) == _shape(b), (cmd, a, b)
                if timeout < 5:  # `sleep 5` under a 1 s deadline (b's outcome is a's: same shape): stopped at the
                    # deadline, not before it (an upper bound on the duration would bet on the machine's load)
                    assert a.timed_out and a.duration >= 0.9 * timeout, a
            a, b = await fast.exec(["no-such-command"]), await slow.exec(["no-such-command"])
            assert a.rc == b.rc == 127 and "no-such-command" in a.stderr and "no-such-command" in b.stderr
            for box in (fast, slow):
                await box.write_file("d/e/f.bin", bytes(range(256)) * 10, mode=0o600)
                assert await box.read_file("d/e/f.bin") == bytes(range(256)) * 10
                assert await box.read_file("d/e/f.bin", max_bytes=5) == bytes(range(5))
                assert (await box.exec("stat -c '%a %u' d/e/f.bin d")).stdout == f"600 {spec.uid}\n755 {spec.uid}\n"
                with pytest.raises(SandboxError, match="no such file: /workspace/missing"):
                    await box.read_file("missing")
                with pytest.raises(SandboxError, match="is a directory: /workspace/d"):
                    await box.read_file("d")
                with pytest.raises(SandboxError, match="/usr/owned"):
                    await box.write_file("/usr/owned", "x")
        finally:
            await asyncio.gather(fast.close(), slow.close())

    run(body())


@pytest.mark.parametrize("mode", ["channel", "api"])
def test_reuse_after_reset_leaves_no_files_or_processes(docker_backend, spec, mode):
    async def body():
        box = await _create(docker_backend, spec, mode)
        try:
            mess = ("mkdir -p a/b locked && echo s > a/b/secret && echo s > .hidden && echo s > ..odd && "
                    "echo s > locked/in && chmod 000 locked && chmod 444 .hidden && echo s > /tmp/t && "
                    "mkdir /tmp/sub && echo s > /dev/shm/shm && (setsid sleep 300 &) && echo done")
            assert (await box.exec(mess)).stdout == "done\n"
            await box.reset()
            r = await box.exec("ls -A . /tmp /dev/shm")
            assert r.ok and r.stdout.split() == [".:", "/dev/shm:", "/tmp:"], r.stdout
            r = await box.exec("ps -o comm")
            # left: PID 1, ps, and with docker exec the wrapper's sh and timeout
            assert set(r.stdout.split()[1:]) <= {"python3", "ps", "sh", "timeout"}, r.stdout
            assert (await box.exec("echo fresh > a; cat a")).stdout == "fresh\n"
        finally:
            await box.close()

    run(body())


def test_pid1_holds_the_channel_out_of_the_commands_reach(docker_backend, spec):
    async def body():
        box = await _create(docker_backend, spec, "channel")
        try:
            r = await box.exec("ls /proc/1/fd; cat /proc/1/environ; kill -9 1; kill -9 -1; echo still")
            assert r.stdout.strip().endswith("still") and "Permission denied" in r.stderr, r
            assert "FOO" not in r.stdout  # PID 1 is not dumpable: its environ and descriptors are closed to us
            assert (await box.exec("echo alive")).stdout == "alive\n"
        finally:
            await box.close()

    run(body())


def test_lost_channel_falls_back_to_docker_exec(docker_backend, spec):
    async def body():
        box = await _create(docker_backend, spec, "channel")
        try:
            await box.write_file("kept.txt", "x")
            box._channel.close()  # e.g. the engine dropped the attach stream
            r = await box.exec("cat kept.txt; echo err >&2; exit 4")
            assert (r.rc, r.stdout, r.stderr) == (4, "x", "err\n") and box._channel is None
            await box.reset()
            assert (await box.exec("ls -A")).stdout == ""
        finally:
            await box.close()
        assert box.id not in docker_backend.live()

    run(body())


def test_closing_a_channel_wakes_the_call_waiting_on_it():
    """close() from another thread while a call waits for its answer (a sandbox removed at exit while its command
    runs): the call raises ChannelClosed at once, not at its reply deadline an hour away, and the socket is closed."""
    host, box_end = socket.socketpair()
    channel = Channel(host, "pair")
    raised: list[BaseException] = []

    def caller() -> None:
        try:
            channel.call({"op": "exec", "argv": ["sleep", "600"]}, reply_by=time.monotonic() + 3600)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            raised.append(e)

    thread = threading.Thread(target=caller)
    thread.start()
    try:
        assert box_end.recv(4096)  # the request went out: the call now waits for its answer
        channel.close()
        thread.join(120)  # a guard against a hang only; the call wakes at once
        assert not thread.is_alive(), "the call still waits on the closed channel"
        assert len(raised) == 1 and isinstance(raised[0], ChannelClosed), raised
        assert host.fileno() == -1 and channel.broken
        with pytest.raises(ChannelClosed, match="pair is closed"):
            channel.call({"op": "exec", "argv": ["true"]}, reply_by=time.monotonic() + 3600)
    finally:
        box_end.close()
        channel.close()


def test_closing_a_sandbox_during_a_command_ends_the_command_without_a_fallback(docker_backend, spec, caplog):
    """A sandbox closed while its command runs over the channel (what the exit hook does with sandboxes in use):
    the command fails with "closed during the call", and nothing warns of a lost channel or falls back."""
    caplog.set_level(logging.WARNING, logger="relax_gym.sandbox")

    async def body():
        box = await _create(docker_backend, spec, "channel")
        task = asyncio.ensure_future(box.exec("sleep 600"))
        api = docker_backend._api()
        while not any("sleep 600" in " ".join(p) for p in api.top(box.container_id)["Processes"]):
            assert not task.done(), task
            await asyncio.sleep(0.05)  # polls for the command's start; orders nothing by time
        await box.close()
        with pytest.raises(SandboxError, match="closed during the call"):
            await task
        assert box.id not in docker_backend.live()

    run(body())
    assert not [r for r in caplog.records if "channel" in r.getMessage()], caplog.text


def test_channel_exec_is_quick_and_cancellation_kills_the_command(docker_backend, spec):
    async def body():
        box = await _create(docker_backend, spec, "channel")
        try:
            await box.exec("true")
            t0 = time.monotonic()
            for _ in range(10):
                assert (await box.exec("true")).ok
            assert (time.monotonic() - t0) / 10 < 0.5  # a docker exec costs ~60-80 ms; the channel a few ms
            task = asyncio.ensure_future(box.exec("sleep 60; echo never"))
            await asyncio.sleep(0.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            r = await box.exec("ps -o comm")
            assert r.ok and "sleep" not in r.stdout, r
        finally:
            await box.close()

    run(body())


def test_sandbox_bench_summary_shows_both_docker_paths():
    from relax_gym.bench.summaries import summarise

    figures = {
        "repeats": 10, "episodes": 8, "backends": {
            "docker": {"problem": None, "acquire_p50_ms": 0.05, "acquire_p99_ms": 0.1, "episode_ms": 35.0,
                       "episode_phases_ms": {"acquire": 0.1, "write": 1.0, "exec": 33.0, "release": 0.9},
                       "episodes_per_s": 3.0, "warm_episodes_per_s": 6.0},
            "docker-api": {"problem": None, "acquire_p50_ms": 0.05, "acquire_p99_ms": 0.1, "episode_ms": 250.0,
                           "episode_phases_ms": {"acquire": 0.1, "write": 80.0, "exec": 90.0, "release": 80.0},
                           "episodes_per_s": 2.0, "warm_episodes_per_s": 2.5}},
        "docker_exec": {"ours_ms": 30.0, "api_ms": 90.0, "raw_ms": 80.0, "ratio": 0.375, "api_ratio": 1.125},
        "docker_lifecycle": {"create_ms": 300.0, "close_ms": 90.0},
    }
    s = summarise("sandbox", figures)
    rows = {r.figure: r for r in s.rows}
    assert rows["python3 -c pass: docker exec / raw SDK exec_run"].ratio == "0.38x"
    assert rows["python3 -c pass: docker exec path / raw SDK exec_run"].ratio == "1.12x"
    assert rows["sandbox work per tool-use episode, p50 (docker-api)"].value == "250.0 ms"
    assert "6.00 episodes/s warm" in rows["8 concurrent tool-use episodes (docker)"].note
    assert rows["create / close one docker sandbox, p50"].value == "300 / 90 ms"
    assert [b.title for b in s.bars] == ["python3 -c pass: one exec", "sandbox work per tool-use episode"]
