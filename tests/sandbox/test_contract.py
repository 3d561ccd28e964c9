"""The Sandbox contract and hostile code, on every backend (docker and bwrap).

Each hostile program must be contained, reported in ExecResult, and leave nothing of ours behind.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from relax_gym.sandbox.base import SandboxError
from .conftest import run

pytestmark = pytest.mark.timeout(180)


async def _with_sandbox(backend, spec, body):
    box = await backend.create(spec)
    try:
        return await body(box)
    finally:
        await box.close()
        assert box.id not in backend.live(), f"{box.id} still holds resources after close()"


def in_box(backend, spec, body):
    return run(_with_sandbox(backend, spec, body))


# ---------------------------------------------------------------------------------------------- basics


def test_exec_basics_user_workdir_stdin(backend, spec):
    async def body(box):
        r = await box.exec("id -u; pwd; echo err >&2; exit 3")
        assert (r.rc, r.stdout.split(), r.stderr.strip(), r.timed_out) == (3, [str(spec.uid), spec.workdir], "err", False)
        r = await box.exec(["cat"], stdin="hello\n")
        assert r.ok and r.stdout == "hello\n"
        r = await box.exec("python3 -c 'import json, sys; print(json.dumps({\"v\": sys.version_info[0]}))'")
        assert r.ok and r.stdout.strip() == '{"v": 3}', r

    in_box(backend, spec, body)


def test_files_roundtrip_and_relative_paths(backend, spec):
    async def body(box):
        await box.write_file("sub/a.txt", "payload ü")
        assert await box.read_file(f"{spec.workdir}/sub/a.txt") == "payload ü".encode()
        r = await box.exec("cat sub/a.txt")
        assert r.stdout == "payload ü"
        await box.write_file("/tmp/b.bin", b"\x00\x01")
        assert await box.read_file("/tmp/b.bin") == b"\x00\x01"
        with pytest.raises(SandboxError, match="missing.txt"):
            await box.read_file("missing.txt")

    in_box(backend, spec, body)


def test_close_is_idempotent_and_exec_after_close_raises(backend, spec):
    async def body():
        box = await backend.create(spec)
        await box.close()
        await box.close()
        with pytest.raises(SandboxError, match="closed"):
            await box.exec("true")
        assert box.id not in backend.live()

    run(body())


def test_close_survives_cancellation(backend, spec):
    async def body():
        box = await backend.create(spec)
        task = asyncio.ensure_future(box.close())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await box.close()  # the shielded close finished (or finishes now)
        assert box.id not in backend.live()

    run(body())


# ---------------------------------------------------------------------------------------------- hostile code


def test_sleep_past_timeout(backend, spec):
    async def body(box):
        # the outer limit is well below the command's 100 s: only the 1.5 s timeout can end it within the limit
        r = await asyncio.wait_for(box.exec("sleep 100", timeout=1.5), 60)
        assert r.timed_out and not r.ok
        assert (await box.exec("echo alive")).stdout == "alive\n"

    in_box(backend, spec, body)


def test_infinite_loop(backend, spec):
    async def body(box):
        r = await box.exec("python3 -c 'while True: pass'", timeout=2)
        assert r.timed_out and r.duration >= 1.8  # stopped at its 2 s deadline, not well before (no upper bound: load)

    in_box(backend, spec, body)


def test_background_process_does_not_outlive_its_command(backend, spec):
    async def body(box):
        r = await box.exec("sleep 300 & echo started", timeout=10)
        assert r.ok and r.stdout == "started\n"  # ok, not timed out: no wait for the orphan's pipe
        r = await box.exec("ps -eo comm 2>/dev/null || ls /proc | grep -E '^[0-9]+$' | xargs -I{} cat /proc/{}/comm 2>/dev/null")
        assert "sleep" not in r.stdout, r.stdout

    in_box(backend, spec, body)


def test_fork_bomb_is_contained(backend, spec):
    async def body(box):
        bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
        await box.write_file("bomb.py", bomb)
        r = await box.exec("python3 bomb.py", timeout=4)
        assert not r.ok
        r = await box.exec("echo still-usable", timeout=20)
        assert r.stdout == "still-usable\n", r

    in_box(backend, spec, body)


def test_memory_hog_is_killed(backend, spec):
    async def body(box):
        r = await box.exec("python3 -c 'x = bytearray(1024 * 1024 * 1024); print(len(x))'", timeout=30)
        assert not r.ok and r.oom_killed and "1073741824" not in r.stdout, r
        assert (await box.exec("echo ok")).ok

    in_box(backend, spec, body)


def test_no_network_only_lo_no_route_and_no_host_loopback(backend, spec):
    """Isolation shown from inside, never by trying an outside address: the sandbox's only interface is ``lo``, it
    has no route anywhere, and a listener this test opens on the host's 127.0.0.1 cannot be reached from it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:  # the server is closed when the test ends
            pass

    threading.Thread(target=accept, daemon=True).start()
    probe = (
        "import socket, sys\n"
        "print('IFACES', ','.join(sorted(name for _, name in socket.if_nameindex())))\n"
        "with open('/proc/net/route') as f:\n    print('ROUTES', len(f.read().splitlines()) - 1)\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n    s.connect(('127.0.0.1', int(sys.argv[1]))); print('CONNECTED')\n"
        "except OSError as e:\n    print('blocked', e.errno)\n"
    )

    async def body(box):
        await box.write_file("probe.py", probe)
        r = await box.exec(f"python3 probe.py {port}", timeout=20)
        lines = r.stdout.splitlines()
        assert lines[0] == "IFACES lo" and lines[1] == "ROUTES 0", r  # nothing but loopback, no way out
        assert lines[2].startswith("blocked") and "CONNECTED" not in r.stdout, r  # its lo is not the host's

    try:
        in_box(backend, spec, body)
        assert not accepted
    finally:
        server.close()


def test_writes_outside_workdir_fail_and_shadow_is_unreadable(backend, spec):
    async def body(box):
        for target in ("/etc/owned", "/usr/owned", "/owned"):
            r = await box.exec(f"echo x > {target}")
            assert r.rc != 0, f"could write {target}"
        assert (await box.exec("cat /etc/shadow")).rc != 0
        assert (await box.exec("echo x > inside && echo y > /tmp/t && cat inside /tmp/t")).stdout == "x\ny\n"

    in_box(backend, spec, body)


def test_huge_stdout_is_truncated_with_a_marker(backend, spec):
    async def body(box):
        r = await box.exec("python3 -c \"import sys\nfor _ in range(100): sys.stdout.write('a' * 1000000)\"", timeout=60)
        assert r.truncated and r.rc == 0 and not r.timed_out  # finished within its 60 s timeout
        assert r.stdout.startswith("a" * 1000) and "output truncated" in r.stdout
        assert len(r.stdout) < spec.max_output_bytes + 200

    in_box(backend, spec, body)


def test_reset_leaves_nothing_for_the_next_episode(backend, spec):
    async def body(box):
        await box.exec("echo secret > /tmp/secret; echo secret > left.txt")
        await box.reset()
        r = await box.exec("ls -A /tmp; ls -A .")
        assert "secret" not in r.stdout and "left.txt" not in r.stdout, r.stdout

    in_box(backend, spec, body)


def test_reap_removes_leftovers_of_dead_owners_only(backend, spec):
    async def body():
        box = await backend.create(spec)
        try:
            assert box.id in backend.live()
            backend.reap()  # may remove leftovers of crashed runs; this process is alive, so not our sandbox
            assert box.id in backend.live()
            assert (await box.exec("echo alive")).stdout == "alive\n"
        finally:
            await box.close()

    run(body())

