"""Docker-specific checks: the image, the container's limits, reaping, concurrency, and failure messages.

They run against the real engine; without one they skip with the reason (a failure under RELAX_GYM_CI=1).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time

import pytest

from relax_gym.sandbox.backends import get_backend
from relax_gym.sandbox.base import LABEL, OWNER_LABEL, SandboxError, SandboxUnavailable, owner_tag
from relax_gym.sandbox.spec import DEFAULT_IMAGE, SandboxSpec
from .conftest import run

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def docker_backend():
    backend = get_backend("docker")
    problem = backend.check()
    if problem:
        pytest.skip(f"docker sandbox backend unavailable: {problem}")
    return backend


@pytest.fixture(scope="module")
def client(docker_backend):
    return docker_backend._connect()


@pytest.fixture
def spec() -> SandboxSpec:
    return SandboxSpec(memory_mb=128, pids=48, cpus=0.5, tmpfs_mb=16, exec_timeout_s=20, max_output_bytes=16 * 1024)


def _ours(client) -> list[str]:
    return [c.name for c in client.containers.list(all=True, filters={"label": f"{OWNER_LABEL}={owner_tag()}"})]


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _park(client, labels: dict[str, str], name: str):
    """A container of the base image carrying ``labels``, made by hand (as a crashed owner would have left it)."""
    return client.containers.run(DEFAULT_IMAGE, ["sleep", "600"], labels=labels, name=name, detach=True,
                                 network_mode="none", user="1000:1000")


# ---------------------------------------------------------------------------------------------- image


def test_base_image_builds_and_is_small(client):
    from relax_gym.sandbox import image as images

    image_id = images.build_base_image(client=client)  # the default tag: built once, then kept
    assert images.image_exists(DEFAULT_IMAGE, client) and image_id == client.images.get(DEFAULT_IMAGE).id
    assert not images.image_exists("relax-gym/no-such-image:0", client)
    assert images.build_base_image(client=client) == image_id  # idempotent

    tag = f"relax-gym/sandbox-test:{os.getpid()}"  # a fresh build, without touching the default image
    try:
        built = images.build_base_image(tag, client=client, force=True)
        img = client.images.get(tag)
        assert img.id == built
        assert img.attrs["Size"] < 150e6, img.attrs["Size"]
        assert img.labels.get(images.IMAGE_LABEL) == "sandbox-base"
        assert "PATH=/usr/local/bin:/usr/bin:/bin" in img.attrs["Config"]["Env"]
        assert img.attrs["Config"]["WorkingDir"] == "/workspace"
        probe = (  # the stdlib imports from the bytecode the image holds (the sandbox user cannot write it there)
            "import json, sqlite3, ssl, ctypes, zlib, bz2, lzma, hashlib, decimal, sys, os, asyncio; "
            "assert all(os.path.isfile(m.__cached__) for m in (json, ssl, decimal, asyncio)); "
            "print(json.dumps(sys.version_info[:2]))"
        )
        out = client.containers.run(
            tag, ["sh", "-c", f"python3 -c '{probe}' && bash -c 'echo bash' && id -un && ls /etc/shadow || true"],
            remove=True, network_mode="none", user="1000:1000",
        ).decode()
        assert out.split() == ["[3,", "11]", "bash", "sandbox"], out
    finally:
        try:
            client.images.remove(tag, force=True)
        except Exception:
            pass


def test_missing_host_tools_are_named(monkeypatch, client):
    from relax_gym.sandbox import image as images

    monkeypatch.setattr(images, "PYTHON", "/nonexistent/python3.11")
    with pytest.raises(SandboxError, match=r"/nonexistent/python3\.11.*apt-get install python3\.11 busybox-static"):
        images.build_base_image("relax-gym/never-built:0", client=client)


# ---------------------------------------------------------------------------------------------- container


def test_container_carries_every_limit(docker_backend, client, spec):
    async def body():
        box = await docker_backend.create(spec)
        try:
            attrs = client.api.inspect_container(box.container_id)
            hc, cfg = attrs["HostConfig"], attrs["Config"]
            assert hc["NetworkMode"] == "none"
            assert hc["ReadonlyRootfs"] is True
            assert hc["PidsLimit"] == spec.pids
            assert hc["Memory"] == hc["MemorySwap"] == spec.memory_mb * 1024 * 1024
            assert hc["NanoCpus"] == int(spec.cpus * 1e9)
            assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
            assert hc["SecurityOpt"] == ["no-new-privileges"]
            assert not hc.get("Privileged")
            assert set(hc["Tmpfs"]) == {"/tmp", spec.workdir}
            assert f"uid={spec.uid}" in hc["Tmpfs"][spec.workdir]
            assert cfg["User"] == f"{spec.uid}:{spec.gid}"
            assert cfg["Labels"][LABEL] == box.id and cfg["Labels"][OWNER_LABEL] == owner_tag()
            assert attrs["Name"] == f"/{box.id}"
            # PID 1 is the reaper (not docker's init, which would leave our keep-alive killable from inside).
            assert not hc.get("Init")
            r = await box.exec("cat /proc/1/cmdline | tr '\\0' ' '; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
            assert "python3" in r.stdout and "CapEff:\t0000000000000000" in r.stdout and "NoNewPrivs:\t1" in r.stdout
            # the memory cgroup counter is readable here, so OOM kills are measured, not guessed
            assert box._oom_file is not None
            r = await box.exec("kill -9 $$")
            assert r.rc == 137 and not r.oom_killed and not r.timed_out, r
        finally:
            await box.close()
        assert box.id not in docker_backend.live()

    run(body())


def test_pid1_survives_kill_all_and_nothing_outlives_a_command(docker_backend, spec):
    async def body():
        box = await docker_backend.create(spec)
        try:
            await box.exec("kill -9 1; kill -9 -1; python3 -c 'import os, signal; os.kill(1, signal.SIGKILL)'")
            r = await box.exec("echo alive; cat /proc/1/comm")
            assert r.stdout == "alive\npython3\n", r
            # the command kills its wrapper shell while a background child keeps the output pipe open
            r = await box.exec("setsid sleep 300 & sleep 300 & kill -9 $PPID; echo after", timeout=15)
            assert not r.timed_out and "after" in r.stdout, r  # answered without waiting out the held pipe
            r = await box.exec("ps -o user,comm")
            # left: python3 (pid 1), and this command's wrapper sh, timeout watcher and ps
            assert "sleep" not in r.stdout and r.stdout.count("sandbox") <= 4, r.stdout
        finally:
            await box.close()

    run(body())


def test_stdin_files_ownership_and_cancellation(docker_backend, spec):
    async def body():
        box = await docker_backend.create(spec)
        try:
            r = await box.exec("wc -c", stdin=b"x" * 5_000_000)  # far more than one pipe / socket buffer
            assert r.ok and r.stdout.strip() == "5000000"
            r = await box.exec(["cat"], stdin=b"y" * 1_000_000)  # echoed back while being written
            assert r.ok and r.truncated and r.stdout.startswith("y" * 1000)
            await box.write_file("bin/run.sh", "#!/bin/sh\necho ran $(id -u)\n", mode=0o755)
            r = await box.exec("./bin/run.sh; stat -c '%u %a' bin/run.sh bin")
            assert r.stdout.split("\n")[:3] == [f"ran {spec.uid}", f"{spec.uid} 755", f"{spec.uid} 755"], r
            with pytest.raises(SandboxError, match="/usr/owned"):
                await box.write_file("/usr/owned", "x")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(box.exec("sleep 60"), 1)
            r = await box.exec("ps -o comm")
            assert r.ok and "sleep" not in r.stdout, r
        finally:
            await box.close()

    run(body())


def test_missing_image_is_named(docker_backend, client, spec):
    before = set(_ours(client))
    with pytest.raises(SandboxError, match="relax-gym/no-such-image:0"):
        run(docker_backend.create(spec.model_copy(update={"image": "relax-gym/no-such-image:0"})))
    assert set(_ours(client)) == before


def test_unknown_runtime_is_named(docker_backend, client, spec):
    before = set(_ours(client))
    with pytest.raises(SandboxError, match="no-such-runtime"):
        run(docker_backend.create(spec.model_copy(update={"runtime": "no-such-runtime"})))
    assert set(_ours(client)) == before


def test_unreachable_engine_is_reported(monkeypatch):
    from relax_gym.sandbox.docker import DockerBackend

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    backend = DockerBackend()
    problem = backend.check()
    assert problem and "dockerd" in problem and "/nonexistent/docker.sock" in problem
    with pytest.raises(SandboxUnavailable):
        run(backend.create(SandboxSpec()))


def test_exec_after_external_removal_raises(docker_backend, client, spec):
    async def body():
        box = await docker_backend.create(spec)
        client.api.remove_container(box.container_id, force=True)
        with pytest.raises(SandboxError, match="gone"):
            await box.exec("echo hi")
        await box.close()  # tolerates the missing container
        assert box.id not in docker_backend.live()

    run(body())


def test_eight_concurrent_sandboxes(docker_backend, client, spec):
    async def body():
        boxes = await asyncio.gather(*(docker_backend.create(spec) for _ in range(8)))
        try:
            assert len({b.id for b in boxes}) == 8 and {b.id for b in boxes} <= set(docker_backend.live())
            results = await asyncio.gather(*(b.exec(f"echo {i} > f; sleep 0.5; cat f") for i, b in enumerate(boxes)))
            assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
        finally:
            await asyncio.gather(*(b.close() for b in boxes))
        assert not {b.id for b in boxes} & set(docker_backend.live())

    run(body())


# ---------------------------------------------------------------------------------------------- reaping


def test_reap_removes_dead_owners_containers_only(docker_backend, client):
    host = os.uname().nodename
    tag = f"{os.getpid()}-{int(time.time() * 1000) % 100000}"
    sleeper = subprocess.Popen(["sleep", "60"])
    parked = {}

    def park(kind: str, owner: str, **extra: str) -> None:
        name = f"rg-test-{kind}-{tag}"
        parked[kind] = _park(client, {LABEL: name, OWNER_LABEL: owner, **extra}, name)

    try:
        park("dead", f"{host}:{_dead_pid()}")
        # the owner pid is alive but belongs to a newer process than the one that made the container
        park("reused", f"{host}:{sleeper.pid}", **{f"{LABEL}.owner-start": "1"})
        park("alive", f"{host}:{sleeper.pid}")
        park("elsewhere", "some-other-host:1")
        assert docker_backend.reap() >= 2
        names = {c.name for c in client.containers.list(all=True, filters={"label": LABEL})}
        assert parked["dead"].name not in names and parked["reused"].name not in names
        assert parked["alive"].name in names and parked["elsewhere"].name in names
    finally:
        sleeper.kill()
        sleeper.wait()
        for c in parked.values():
            try:
                c.remove(force=True)
            except Exception:
                pass


def test_no_container_of_ours_is_left(docker_backend, client):
    assert _ours(client) == []
    assert docker_backend.live() == []
