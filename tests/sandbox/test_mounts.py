"""SandboxSpec.mounts: validation (errors name the field), and on every backend a read-only mount that the sandbox
user can read but not write, a read-write one it can write, and sources that are missing or out of its reach."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from pydantic import ValidationError

from relax_gym.sandbox.base import SandboxError
from relax_gym.sandbox.spec import Mount, SandboxSpec

from .conftest import run

pytestmark = pytest.mark.timeout(120)


def with_mounts(spec: SandboxSpec, *mounts: Mount, **env: str) -> SandboxSpec:
    """``spec`` plus ``mounts`` (and environment variables), validated like any spec."""
    return SandboxSpec(**{**spec.model_dump(), "mounts": mounts, "env": {**spec.env, **env}})


@pytest.fixture
def host_dir():
    """A fresh directory under the system temp dir, reachable by the sandbox uid (pytest's tmp_path is 0700)."""
    made = []

    def make(mode: int = 0o755) -> str:
        path = tempfile.mkdtemp(prefix="relax-gym-test-mount-")
        os.chmod(path, mode)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(("field", "value", "why"), [
    ("source", "relative/dir", "absolute"),
    ("source", "/a/../etc", r"'\.\.'"),
    ("target", "opt/x", "absolute"),
    ("target", "/opt/../x", r"'\.\.'"),
    ("target", "/", "whole filesystem"),
    ("target", "/usr/local/x", "system directory /usr"),
    ("target", "/proc", "system directory /proc"),
    ("target", "/dev/shm", "system directory /dev"),
    ("target", "/etc", "system directory /etc"),
    ("target", "/bin", "system directory /bin"),
    ("target", "/lib64/x", "system directory /lib64"),
    ("target", "/sys/fs", "system directory /sys"),
    ("target", "/tmp", "system directory /tmp"),
    ("target", "/tmp/sub", "system directory /tmp"),
])
def test_bad_mount_paths_are_refused_naming_the_field(field, value, why):
    paths = {"source": "/srv/data", "target": "/opt/data", field: value}
    with pytest.raises(ValidationError, match=rf"mounts\.0\.{field}(.|\n)*{why}"):
        SandboxSpec(mounts=[paths])


@pytest.mark.parametrize("target", ["/workspace", "/workspace/sub", "/workspace/"])
def test_mounts_on_or_in_the_workdir_are_refused(target):
    with pytest.raises(ValidationError, match=r"mounts\[1\]\.target '/workspace[/a-z]*' would shadow or sit in"):
        SandboxSpec(mounts=[Mount(source="/srv", target="/opt/x"), {"source": "/srv", "target": target}])


def test_a_mount_above_the_workdir_or_a_duplicate_target_is_refused():
    with pytest.raises(ValidationError, match=r"mounts\[0\]\.target '/home' would shadow"):
        SandboxSpec(workdir="/home/agent", mounts=[Mount(source="/srv", target="/home")])
    with pytest.raises(ValidationError, match=r"mounts\[1\]\.target '/opt/x' is also mounts\[0\]"):
        SandboxSpec(mounts=[Mount(source="/a", target="/opt/x"), Mount(source="/b", target="/opt/x/")])
    with pytest.raises(ValidationError, match="extra"):
        Mount(source="/a", target="/opt/x", mode="rw")


def test_mounts_are_normalised_frozen_and_part_of_the_pool_key():
    m = Mount(source="/srv//data/", target="/opt/data/")
    assert (m.source, m.target, m.read_only) == ("/srv/data", "/opt/data", True)
    with pytest.raises(ValidationError):
        m.read_only = False
    plain, mounted = SandboxSpec(), SandboxSpec(mounts=[m])
    rw = SandboxSpec(mounts=[Mount(source="/srv/data", target="/opt/data", read_only=False)])
    assert len({plain.key(), mounted.key(), rw.key()}) == 3
    assert SandboxSpec.model_validate_json(mounted.key()) == mounted
    nested = SandboxSpec(mounts=[Mount(source="/a", target="/opt/x/y"), Mount(source="/b", target="/opt/x")])
    assert [m.target for m in nested.mounts_in_order()] == ["/opt/x", "/opt/x/y"]


# ---------------------------------------------------------------------------------------------- in a sandbox


def test_read_only_and_read_write_mounts(backend, spec, host_dir):
    ro = host_dir(0o777)  # the directory's mode would let anyone write: the mount alone must stop it
    with open(os.path.join(ro, "data.txt"), "w") as f:
        f.write("from the host\n")
    os.chmod(os.path.join(ro, "data.txt"), 0o666)
    rw = host_dir(0o777)  # writable by the sandbox uid without chown (the docker backend may run unprivileged)
    single = host_dir()
    with open(os.path.join(single, "one.txt"), "w") as f:
        f.write("one file\n")
    mounts = [
        Mount(source=ro, target="/opt/ro"),
        Mount(source=rw, target="/srv/rw", read_only=False),
        Mount(source=os.path.join(single, "one.txt"), target="/opt/one.txt"),
    ]

    async def body():
        box = await backend.create(with_mounts(spec, *mounts))
        try:
            r = await box.exec("id -u; cat /opt/ro/data.txt /opt/one.txt")
            assert r.ok and r.stdout.split("\n")[:3] == [str(spec.uid), "from the host", "one file"], r
            for cmd in ("echo changed > /opt/ro/data.txt", "echo new > /opt/ro/new.txt", "rm /opt/ro/data.txt",
                        "mkdir /opt/ro/d", "echo x > /opt/one.txt"):
                r = await box.exec(cmd)
                assert r.rc != 0 and "Read-only file system" in r.stderr, (cmd, r)
            r = await box.exec("echo written > /srv/rw/out.txt && mkdir /srv/rw/d && cat /srv/rw/out.txt")
            assert r.ok and r.stdout == "written\n", r
        finally:
            await box.close()

    run(body())
    with open(os.path.join(ro, "data.txt")) as f:
        assert f.read() == "from the host\n"
    assert sorted(os.listdir(ro)) == ["data.txt"]
    assert sorted(os.listdir(rw)) == ["d", "out.txt"]
    st = os.stat(os.path.join(rw, "out.txt"))
    assert (st.st_uid, st.st_gid) == (spec.uid, spec.gid)


def test_a_missing_mount_source_is_refused_at_create_naming_it(backend, spec, host_dir):
    missing = os.path.join(host_dir(), "not-there")
    bad = with_mounts(spec, Mount(source=missing, target="/opt/x"))
    before = set(backend.live())
    with pytest.raises(SandboxError, match=rf"mounts\[0\]\.source '{missing}' does not exist"):
        run(backend.create(bad))
    assert set(backend.live()) == before


def test_bwrap_refuses_a_source_the_sandbox_uid_cannot_reach(spec, host_dir):
    from relax_gym.sandbox.backends import get_backend

    bwrap = get_backend("bwrap")
    problem = bwrap.check()
    if problem:
        pytest.skip(f"bwrap sandbox backend unavailable: {problem}")
    private = host_dir(0o700)
    inner = os.path.join(private, "site")
    os.mkdir(inner, 0o755)
    bad = with_mounts(spec, Mount(source=inner, target="/opt/site"))
    with pytest.raises(SandboxError, match=rf"mounts\[0\]\.source '{inner}' is not reachable .* {private} is not"):
        run(bwrap.create(bad))
