"""bwrap-specific checks that really run here (root, bubblewrap, writable cgroups); skipped only when the backend's
own check() says it cannot run (which CI turns into a failure)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from relax_gym.sandbox import cgroups
from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.base import SandboxError, SandboxUnavailable
from relax_gym.sandbox.bwrap import ID_PREFIX, BwrapSandbox, _destroy_resources
from relax_gym.sandbox.cgroups import SandboxCgroup
from relax_gym.sandbox.spec import SandboxSpec

from .conftest import run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def bwrap():
    b = get_backend("bwrap")
    problem = b.check()
    if problem:
        pytest.skip(f"bwrap sandbox backend unavailable: {problem}")
    yield b
    assert b.live() == [], f"sandboxes of this process still hold resources: {b.live()}"


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(memory_mb=200, pids=50, cpus=0.5, exec_timeout_s=20, max_output_bytes=64 * 1024)


async def _with_box(backend, spec, body):
    box = await backend.create(spec)
    try:
        return await body(box)
    finally:
        await box.close()


def in_box(backend, spec, body):
    return run(_with_box(backend, spec, body))


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _standby_pids(box: BwrapSandbox) -> set[int]:
    """The prepared launcher's processes: its bwrap and that bwrap's descendants (pid 1 + the waiting helper)."""
    sb = box._standby
    if sb is None or not sb.alive():
        return set()
    found, todo = set(), [sb.proc.pid]
    while todo:
        pid = todo.pop()
        found.add(pid)
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def _leftovers_of_commands(box: BwrapSandbox) -> list[int]:
    """Processes in the sandbox's cgroup that are not the standby prepared for the next command."""
    return sorted(set(box.cgroup.pids()) - _standby_pids(box))


async def _standby_ready(box: BwrapSandbox, timeout: float = 10.0) -> set[int]:
    """Wait until the prepared standby has joined the cgroup and its helper shell is waiting (3 processes, one of
    them already exec'd into ``/bin/sh -s``: until then bwrap's forked child still shows bwrap's command line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _standby_pids(box)
        shell_up = any(_cmdline(p)[:2] == ["/bin/sh", "-s"] for p in pids)
        if len(pids) >= 3 and pids <= set(box.cgroup.pids()) and shell_up:
            return pids
        await asyncio.sleep(0.01)
    raise AssertionError(f"no standby ready: {_standby_pids(box)} vs cgroup {box.cgroup.pids()}")


# ---------------------------------------------------------------------------------------------- limits and users


def test_cgroup_limits_are_set_and_commands_run_inside_as_the_uid(bwrap, spec):
    async def body(box: BwrapSandbox):
        limits = box.cgroup.limits()
        if box.cgroup.version == 1:
            assert limits["memory.limit_in_bytes"] == str(200 * 1024 * 1024)
            if "memory.memsw.limit_in_bytes" in limits:
                assert limits["memory.memsw.limit_in_bytes"] == str(200 * 1024 * 1024)
            assert limits["pids.max"] == "50"
            assert (limits["cpu.cfs_quota_us"], limits["cpu.cfs_period_us"]) == ("50000", "100000")
        else:
            assert limits["memory.max"] == str(200 * 1024 * 1024)
            assert limits["pids.max"] == "50"
            assert limits["cpu.max"] == "50000 100000"
        task = asyncio.ensure_future(box.exec("sleep 1.5; echo done"))
        seen: list[int] = []
        for _ in range(100):
            await asyncio.sleep(0.02)
            seen = box.cgroup.pids()
            if len(seen) >= 3:  # bwrap, its pid-1 reaper, the shell (the command itself runs inside the cgroup)
                break
        await asyncio.sleep(0.1)
        uids = {_uid_of(p) for p in box.cgroup.pids()} - {None}
        assert seen and uids == {spec.uid}, (seen, uids)  # nothing of the sandbox runs as host root
        r = await task
        assert r.ok and r.stdout == "done\n"
        assert _leftovers_of_commands(box) == []
        r = await box.exec("id -un; id -G; cat /proc/self/status | grep -E '^(CapEff|NoNewPrivs)'; hostname; echo $HOME $FOO")
        assert r.stdout.split() == ["sandbox", str(spec.gid), "CapEff:", "0000000000000000", "NoNewPrivs:", "1",
                                    "sandbox", spec.workdir, "bar"], r
        r = await box.exec("cat /etc/passwd")
        assert f"sandbox:x:{spec.uid}:{spec.gid}:" in r.stdout and "cloudsdk" not in r.stdout

    in_box(bwrap, spec.model_copy(update={"env": {"FOO": "bar"}}), body)


def test_files_written_by_the_sandbox_are_owned_by_its_uid_on_the_host(bwrap, spec):
    async def body(box: BwrapSandbox):
        r = await box.exec("echo x > made.txt && mkdir -p d/e && echo y > d/e/f && echo z > /tmp/t && umask")
        assert r.ok, r
        await box.write_file("w/nested/by_host.txt", "h", mode=0o4755)
        for rel in ("made.txt", "d", "d/e/f", "w", "w/nested", "w/nested/by_host.txt"):
            st = os.lstat(os.path.join(box.host_workdir, rel))
            assert (st.st_uid, st.st_gid) == (spec.uid, spec.gid), rel
        assert os.stat(os.path.join(box.host_workdir, "w/nested/by_host.txt")).st_mode & 0o7777 == 0o755  # no setuid
        st = os.lstat(os.path.join(box.host_tmpdir, "t"))
        assert (st.st_uid, st.st_gid) == (spec.uid, spec.gid)
        st = os.stat(box.host_workdir)
        assert (st.st_uid, st.st_mode & 0o777) == (spec.uid, 0o700)
        assert (await box.exec("cat w/nested/by_host.txt && test -w w/nested && echo writable")).stdout == "hwritable\n"

    in_box(bwrap, spec, body)


def test_tmp_is_a_sized_tmpfs_that_persists_across_execs_until_reset(bwrap, spec):
    async def body(box: BwrapSandbox):
        r = await box.exec("echo keep > /tmp/k; head -c 20000000 /dev/zero > /tmp/big || echo FULL")
        assert "FULL" in r.stdout  # tmpfs_mb=8
        assert (await box.exec("cat /tmp/k")).stdout == "keep\n"
        await box.reset()
        assert (await box.exec("ls -A /tmp")).stdout == ""

    in_box(bwrap, spec.model_copy(update={"tmpfs_mb": 8}), body)


# ---------------------------------------------------------------------------------------------- hostile symlinks


def test_planted_symlinks_cannot_make_host_side_file_ops_escape(bwrap, spec, tmp_path):
    # two host directories the sandbox must never reach: one under /var/tmp (outside every sandbox mount) and one
    # under the host's /tmp (the same path inside the sandbox is its own /tmp, so writes land there instead)
    far = tempfile.mkdtemp(dir="/var/tmp")
    near = str(tmp_path)
    for d in (far, near):
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("precious")
    passwd_before = open("/etc/passwd", "rb").read()

    async def body(box: BwrapSandbox):
        r = await box.exec(
            f"ln -s /etc evil && ln -s /etc/passwd pw && ln -s / rootlink && ln -s ../../../../../../etc up && "
            f"ln -s {far} far && ln -s {far}/keep.txt farfile && ln -s {near} near && ln -s {near}/keep.txt nearfile && "
            f"ln -s /tmp/loop loop && ln -s loop /tmp/loop && mkfifo fifo && echo inner > real.txt && "
            f"ln -s real.txt inner && ln -s {spec.workdir}/real.txt abs_inner && mkdir -p /tmp/x && "
            f"ln -s {spec.workdir} /tmp/x/ws"
        )
        assert r.ok, r
        for target in ("evil/owned", "pw", "rootlink/etc/owned", "up/owned", "far/owned", "farfile", "far/keep.txt",
                       "loop", "/etc/owned", "../etc/owned", "/tmp/../etc/owned", "/proc/x", "/owned", "fifo/x"):
            with pytest.raises(SandboxError):
                await box.write_file(target, "pwned")
        for target in ("evil/passwd", "pw", "rootlink/etc/shadow", "up/passwd", "farfile", "far/keep.txt", "nearfile",
                       "near/keep.txt", "loop", "fifo", "/etc/passwd", "/tmp/../etc/passwd", "."):
            with pytest.raises(SandboxError):
                await asyncio.wait_for(box.read_file(target), 5)
        # a link to the host's /tmp/... is the sandbox's own /tmp/...: written there, as the sandbox would
        await box.write_file("nearfile", "contained")
        assert (await box.exec(f"cat {near}/keep.txt")).stdout == "contained"
        # links that stay inside the sandbox behave as they do in it
        assert await box.read_file("inner") == b"inner\n"
        assert await box.read_file("abs_inner") == b"inner\n"
        assert await box.read_file("/tmp/x/ws/real.txt") == b"inner\n"
        await box.write_file("inner", "through the link")
        r = await box.exec("cat real.txt; test -L inner && echo still-a-link")
        assert r.stdout == "through the linkstill-a-link\n"
        await box.reset()
        assert (await box.exec("ls -A . /tmp")).stdout.split() == [".:", "/tmp:"]

    try:
        in_box(bwrap, spec, body)
        assert open("/etc/passwd", "rb").read() == passwd_before
        assert not os.path.exists("/etc/owned") and not os.path.exists("/owned")
        for d in (far, near):
            assert sorted(os.listdir(d)) == ["keep.txt"] and open(os.path.join(d, "keep.txt")).read() == "precious"
    finally:
        shutil.rmtree(far)


def test_reset_removes_hidden_files_and_restores_the_workdir(bwrap, spec):
    async def body(box: BwrapSandbox):
        await box.exec("mkdir -p .hidden/deep && touch .dot .hidden/deep/x && chmod 000 .hidden && chmod 777 .")
        await box.reset()
        assert os.listdir(box.host_workdir) == []
        assert os.stat(box.host_workdir).st_mode & 0o777 == 0o700
        assert (await box.exec("ls -A; touch ok && echo fine")).stdout == "fine\n"

    in_box(bwrap, spec, body)


# ---------------------------------------------------------------------------------------------- lifecycle


def test_reap_removes_leftovers_of_a_dead_owner(bwrap, spec):
    """A real orphan: another process creates a sandbox (and starts a command) and dies without closing it."""
    script = textwrap.dedent(
        """
        import asyncio, os, sys
        from relax_gym.sandbox.backends import get_backend
        from relax_gym.sandbox.spec import SandboxSpec
        async def main():
            box = await get_backend("bwrap").create(SandboxSpec(memory_mb=64))
            await box.exec("echo left > behind.txt")
            print(box.id, flush=True)
            os._exit(0)  # no close(), no atexit: leaves the cgroup, the directory and the tmpfs behind
        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    orphan = out.stdout.split()[-1]
    assert orphan.startswith(ID_PREFIX) and orphan in cgroups.list_groups()
    base = os.path.join(bwrap.root, orphan)
    assert os.path.isdir(base)
    assert orphan not in bwrap.live()  # not this process's

    async def body(box):
        # a fake leftover too: a dead pid recorded in the marker, a cgroup and no directory for another one
        dead = subprocess.Popen(["true"])
        dead.wait()
        fake = f"{ID_PREFIX}{dead.pid}-0-1"
        os.mkdir(os.path.join(bwrap.root, fake))
        with open(os.path.join(bwrap.root, fake, "owner.json"), "w") as f:
            json.dump({"relax-gym.owner": f"{os.uname().nodename}:{dead.pid}", "pid": dead.pid, "start": 1}, f)
        SandboxCgroup.create(f"{ID_PREFIX}{dead.pid}-1-1", 1 << 26, 16, 1.0)
        n = bwrap.reap()
        assert n >= 3
        names = set(cgroups.list_groups()) | set(os.listdir(bwrap.root))
        assert not names & {orphan, fake, f"{ID_PREFIX}{dead.pid}-1-1"}
        assert box.id in bwrap.live() and (await box.exec("echo alive")).stdout == "alive\n"  # ours: untouched

    in_box(bwrap, spec, body)
    assert not os.path.exists(base)
    with open("/proc/mounts") as f:
        assert orphan not in f.read()


def test_eight_concurrent_sandboxes_are_isolated(bwrap, spec):
    async def body():
        boxes = await asyncio.gather(*(bwrap.create(spec) for _ in range(8)))
        try:
            assert len({b.id for b in boxes}) == 8
            await asyncio.gather(*(b.write_file("me.txt", str(i)) for i, b in enumerate(boxes)))
            results = await asyncio.gather(*(b.exec("cat me.txt; ls /tmp; echo $$ > /tmp/pid; python3 -c 'print(6*7)'")
                                             for b in boxes))
            for i, r in enumerate(results):
                assert r.ok and r.stdout == f"{i}42\n", r
            assert set(bwrap.live()) >= {b.id for b in boxes}
        finally:
            await asyncio.gather(*(b.close() for b in boxes))
        assert not {b.id for b in boxes} & set(bwrap.live())

    run(body())


def test_exec_on_a_sandbox_whose_resources_were_removed_raises(bwrap, spec):
    async def body():
        box = await bwrap.create(spec)
        try:
            _destroy_resources(bwrap.root, box.id)
            with pytest.raises(SandboxError, match="gone"):
                await box.exec("true")
        finally:
            await box.close()

    run(body())


def test_close_while_a_command_runs_kills_it(bwrap, spec):
    async def body():
        box = await bwrap.create(spec)
        task = asyncio.ensure_future(box.exec("sleep 60", timeout=60))
        deadline = time.monotonic() + 30
        while not any(_cmdline(p)[:1] == ["sleep"] for p in box.cgroup.pids()):  # until the command is running
            assert not task.done() and time.monotonic() < deadline, (task, box.cgroup.pids())
            await asyncio.sleep(0.01)
        await box.close()
        r = await asyncio.wait_for(task, 30)  # well below the command's 60 s: only the kill can end it in time
        assert not r.ok

    run(body())


def test_network_flag_shares_the_host_network(bwrap, spec):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    threading.Thread(target=lambda: server.accept()[0].close(), daemon=True).start()

    async def body(box):
        r = await box.exec(f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 3); print(\"ok\")'")
        assert r.stdout == "ok\n", r

    try:
        in_box(bwrap, spec.model_copy(update={"network": True}), body)
    finally:
        server.close()


# ---------------------------------------------------------------------------------------------- the standby


def test_standby_is_prepared_unprivileged_and_used_once(bwrap, spec):
    async def body(box: BwrapSandbox):
        pids = await _standby_ready(box)  # launched by create()
        assert {_uid_of(p) for p in pids} == {spec.uid}  # joined, dropped, namespaces built: nothing runs as root
        helper = [p for p in pids if _cmdline(p)[:2] == ["/bin/sh", "-s"]]
        assert len(helper) == 1, [(p, _cmdline(p)) for p in pids]
        first = box._standby
        r = await box.exec("echo $$; cat /proc/1/cmdline | tr '\\0' ' '")
        assert r.ok and r.stdout.split()[0] == "2", r  # the command is the helper (pid 2), exec'd in place
        assert box._standby is not first and not first.alive()  # used once, a new one prepared
        await _standby_ready(box)
        assert _leftovers_of_commands(box) == []

    in_box(bwrap, spec, body)


def test_argv_stdin_and_errors_reach_the_command_unchanged(bwrap, spec):
    tricky = ["a b", "", "it's", "new\nline", "$HOME", "`id`", '"q"', "\\", "*", "; rm -rf /", "-n", "\t"]

    async def body(box: BwrapSandbox):
        r = await box.exec(["python3", "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *tricky])
        assert r.ok and json.loads(r.stdout) == tricky, r
        r = await box.exec(["sh", "-c", 'readlink /proc/self/fd/0; ls /proc/self/fd | wc -l; echo "${#1}"', "sh",
                            "x" * 100_000])
        assert r.stdout.split() == ["/dev/null", "4", "100000"], r  # no stdin: /dev/null; fds 0-2 (+ ls's own)
        r = await box.exec(["wc", "-c"], stdin=b"y" * 3_000_000)
        assert r.ok and r.stdout.strip() == "3000000", r
        r = await box.exec(["cat"], stdin=b"")
        assert r.ok and r.stdout == ""
        r = await box.exec(["true"], stdin=b"z" * 1_000_000)  # never read: the write just ends
        assert r.ok
        r = await box.exec(["no-such-program", "x"])
        assert r.rc == 127 and "no-such-program" in r.stderr, r
        r = await box.exec(["/etc/passwd"])
        assert r.rc == 126, r
        with pytest.raises(ValueError):
            await box.exec(["echo", "nul\0byte"])
        assert (await box.exec("env | sort")).stdout.split() == sorted(
            ["HOME=/workspace", "LANG=C.UTF-8", "LOGNAME=sandbox", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
             "/usr/bin:/sbin:/bin", "PWD=/workspace", "TMPDIR=/tmp", "USER=sandbox"])

    in_box(bwrap, spec, body)


def test_standby_without_a_command_runs_nothing_and_is_replaced(bwrap, spec):
    async def body(box: BwrapSandbox):
        await _standby_ready(box)
        sb = box._standby
        os.close(sb.take("ctl"))  # what its parent's death does: the helper reads EOF
        sb.proc.wait(10)
        assert sb.proc.returncode == 0
        assert not os.listdir(box.host_workdir)
        r = await box.exec("touch ran; echo ok")  # the dead standby is replaced on the spot
        assert r.stdout == "ok\n" and os.listdir(box.host_workdir) == ["ran"]
        box._discard_standby()  # back to back with nothing prepared: the cold path
        assert (await box.exec("echo cold")).stdout == "cold\n"
        await box.reset()  # kills the standby, prepares another
        assert box._standby is not None
        assert (await box.exec("ls -A")).stdout == ""

    in_box(bwrap, spec, body)


def test_sandbox_used_from_several_event_loops_and_closed_leaves_no_process(bwrap, spec):
    box = run(bwrap.create(spec))
    try:
        for i in range(3):  # asyncio.run per call: a new loop each time
            assert run(box.exec(f"echo {i}")).stdout == f"{i}\n"
        # a loop on a thread that then ends: the standby it prepared dies with that thread (--die-with-parent)
        out = []
        t = threading.Thread(target=lambda: out.append(run(box.exec("echo from-thread")).stdout))
        t.start()
        t.join()
        assert out == ["from-thread\n"]
        assert run(box.exec("echo back")).stdout == "back\n"  # so it is replaced, not used
        run(_standby_ready(box))
        launcher = box._standby.proc
    finally:
        run(box.close())
    assert launcher.returncode is not None and box._standby is None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        assert not any(box.id in a for a in _cmdline(int(pid))), (pid, _cmdline(int(pid)))


def _sleep_a_while() -> None:
    time.sleep(8)


def test_a_forked_child_does_not_keep_the_standby_pipes(bwrap, spec):
    """A bare fork (multiprocessing's default, DataLoader workers) copies every fd; without the at-fork hook the
    child's copy of the standby's stdin pipe would keep the command from ever seeing EOF."""
    import multiprocessing

    async def body(box: BwrapSandbox):
        await _standby_ready(box)
        child = multiprocessing.get_context("fork").Process(target=_sleep_a_while)
        child.start()
        try:
            r = await box.exec(["cat"], stdin="to EOF\n", timeout=5)
            assert r.ok and r.stdout == "to EOF\n" and not r.timed_out, r
        finally:
            child.kill()
            child.join()

    in_box(bwrap, spec, body)


def test_preexec_launcher_without_setpriv_or_bash(spec):
    from relax_gym.sandbox.bwrap import BwrapBackend

    backend = BwrapBackend()
    problem = backend.check()
    if problem:
        pytest.skip(f"bwrap sandbox backend unavailable: {problem}")
    backend._setpriv = backend._bash = None  # as on a host without util-linux setpriv / bash

    async def body(box: BwrapSandbox):
        assert box._launcher is None
        r = await box.exec(["cat"], stdin="via fd 3\n")
        assert r.stdout == "via fd 3\n" and (await box.exec("id -u")).stdout == f"{spec.uid}\n"
        pids = await _standby_ready(box)
        assert {_uid_of(p) for p in pids} == {spec.uid}

    in_box(backend, spec, body)
    assert backend.live() == []


def test_bad_workdir_is_refused(bwrap, spec):
    for workdir in ("/usr/x", "/etc", "/", "/proc/1"):
        with pytest.raises(SandboxError, match="workdir"):
            run(bwrap.create(spec.model_copy(update={"workdir": workdir})))


# ---------------------------------------------------------------------------------------------- cgroups.py


def test_cgroup_module_lifecycle(bwrap):
    name = f"{ID_PREFIX}{os.getpid()}-unit-{time.time_ns() % 10**6}"
    cg = SandboxCgroup.create(name, 64 << 20, 20, 0.25)
    try:
        assert name in cgroups.list_groups() and cg.exists()
        assert cg.oom_kills() == 0 and cg.pids() == []
        p = subprocess.Popen(["sleep", "30"])
        cg.add_pid(p.pid)
        assert cg.pids() == [p.pid]
        with pytest.raises(SandboxError, match="exists"):
            SandboxCgroup.create(name, 64 << 20, 20, 0.25)
        assert cg.kill_all() and cg.pids() == []
        assert p.wait(5) == -9
    finally:
        cg.destroy()
    cg.destroy()  # idempotent
    assert not cg.exists() and name not in cgroups.list_groups()


def test_cgroup_join_from_a_child_and_oom_counter(bwrap):
    name = f"{ID_PREFIX}{os.getpid()}-oom-{time.time_ns() % 10**6}"
    cg = SandboxCgroup.create(name, 32 << 20, 20, 1.0)
    try:
        r = subprocess.run([sys.executable, "-c", "bytearray(256 << 20)"], preexec_fn=cg.join, timeout=30)
        assert r.returncode == -9
        assert cg.oom_kills() >= 1 and cg.has_oom_kill_counter() in (True, False)
    finally:
        cg.destroy()


def test_cgroup_version_detection_and_missing_controllers(tmp_path):
    assert cgroups.detect_version(str(tmp_path)) == 1
    problem = cgroups.check(str(tmp_path))
    assert problem and "memory" in problem and "not mounted" in problem
    with pytest.raises(SandboxUnavailable, match="not mounted"):
        cgroups.ensure_parent(str(tmp_path))
    (tmp_path / "cgroup.controllers").write_text("cpu io\n")
    assert cgroups.detect_version(str(tmp_path)) == 2
    with pytest.raises(SandboxUnavailable, match="memory, pids"):
        cgroups.ensure_parent(str(tmp_path))
    assert cgroups.list_groups(str(tmp_path)) == []
    with pytest.raises(ValueError):
        SandboxCgroup("../escape", str(tmp_path))


def test_cgroup_v2_paths_and_limit_files(tmp_path):
    """v2 layout on a fake hierarchy (a real one is not mounted here): the files written and where."""
    root = tmp_path
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    os.mkdir(root / "relax-gym")
    (root / "relax-gym" / "cgroup.subtree_control").write_text("")
    assert cgroups.ensure_parent(str(root)) == 2
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    cg = SandboxCgroup("box", str(root))
    assert cg.procs_files == [str(root / "relax-gym" / "box" / "cgroup.procs")]
    d = root / "relax-gym" / "box"
    d.mkdir()
    for f in ("memory.max", "memory.swap.max", "pids.max", "cpu.max", "cgroup.procs"):
        (d / f).write_text("")
    (d / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")
    cg._set_limits(128 << 20, 32, 1.5)
    assert cg.limits() == {"memory.max": str(128 << 20), "memory.swap.max": "0", "pids.max": "32", "cpu.max": "150000 100000"}
    assert cg.oom_kills() == 2 and cg.pids() == [] and cgroups.list_groups(str(root)) == ["box"]
