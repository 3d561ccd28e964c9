"""Per-sandbox cgroups (v1 split hierarchies or the v2 unified one), used by the bwrap backend.

Every group lives under a parent named :data:`PARENT` in each controller:

- v1: ``/sys/fs/cgroup/{memory,pids,cpu}/relax-gym/<name>`` (memory + memsw limit, pids.max, CFS quota);
- v2: ``/sys/fs/cgroup/relax-gym/<name>`` (memory.max, memory.swap.max=0, pids.max, cpu.max).

Creating groups needs write access to the cgroup filesystem (root, or a delegated subtree); otherwise
:class:`~relax_gym.sandbox.base.SandboxUnavailable` says what is missing.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from relax_gym.sandbox.base import SandboxError, SandboxUnavailable

CGROUP_ROOT = "/sys/fs/cgroup"
PARENT = "relax-gym"
V1_CONTROLLERS = ("memory", "pids", "cpu")
V2_CONTROLLERS = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000


def detect_version(root: str = CGROUP_ROOT) -> int:
    """2 when ``root`` is a pure unified (v2) hierarchy, else 1 (v1 or hybrid: the v1 controllers are used)."""
    return 2 if os.path.exists(os.path.join(root, "cgroup.controllers")) else 1


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str | int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _hint() -> str:
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()} (not root)"
    return (
        f"running as {who}; the bwrap backend needs a writable cgroup filesystem: run as root with "
        f"{CGROUP_ROOT} mounted read-write, or delegate a cgroup subtree to this user"
    )


class SandboxCgroup:
    """One sandbox's cgroup (a directory per v1 controller, or one v2 directory)."""

    def __init__(self, name: str, root: str = CGROUP_ROOT, version: int | None = None) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup name {name!r}")
        self.name = name
        self.root = root
        self.version = version or detect_version(root)
        if self.version == 2:
            self.dirs = {"unified": os.path.join(root, PARENT, name)}
        else:
            self.dirs = {c: os.path.join(root, c, PARENT, name) for c in V1_CONTROLLERS}

    def __repr__(self) -> str:
        return f"SandboxCgroup({self.name!r}, v{self.version})"

    # -- setup ------------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int, cpus: float, *, root: str = CGROUP_ROOT) -> SandboxCgroup:
        """Make the group and set its limits; raises SandboxUnavailable when cgroups are not writable here."""
        version = ensure_parent(root)
        cg = cls(name, root, version)
        try:
            for path in cg.dirs.values():
                os.mkdir(path, 0o755)
            cg._set_limits(int(memory_bytes), int(pids), float(cpus))
        except FileExistsError as e:
            raise SandboxError(f"cgroup {e.filename} already exists") from e
        except OSError as e:
            cg.destroy()
            raise SandboxError(f"cannot set up cgroup {name}: {e}") from e
        return cg

    def _set_limits(self, memory_bytes: int, pids: int, cpus: float) -> None:
        quota = max(1000, int(cpus * CFS_PERIOD_US))
        if self.version == 2:
            d = self.dirs["unified"]
            _write(f"{d}/memory.max", memory_bytes)
            if os.path.exists(f"{d}/memory.swap.max"):
                _write(f"{d}/memory.swap.max", 0)
            _write(f"{d}/pids.max", pids)
            _write(f"{d}/cpu.max", f"{quota} {CFS_PERIOD_US}")
            return
        mem = self.dirs["memory"]
        _write(f"{mem}/memory.limit_in_bytes", memory_bytes)
        if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):  # absent without swap accounting
            _write(f"{mem}/memory.memsw.limit_in_bytes", memory_bytes)
        _write(f"{self.dirs['pids']}/pids.max", pids)
        _write(f"{self.dirs['cpu']}/cpu.cfs_period_us", CFS_PERIOD_US)
        _write(f"{self.dirs['cpu']}/cpu.cfs_quota_us", quota)

    # -- membership ---------------------------------------------------------------------------------------------

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files to write a pid into (one per v1 controller)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def add_pid(self, pid: int) -> None:
        for path in self.procs_files:
            _write(path, pid)

    def join(self) -> None:
        """Move the calling process into the group (e.g. from a child between fork and exec)."""
        self.add_pid(os.getpid())

    def exists(self) -> bool:
        return any(os.path.isdir(d) for d in self.dirs.values())

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.procs_files:
            try:
                found.update(int(line) for line in _read(path).split())
            except (FileNotFoundError, ProcessLookupError):
                pass
        return sorted(found)

    # -- accounting -------------------------------------------------------------------------------------------

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this group (v1 without an ``oom_kill`` line: failcnt)."""
        try:
            if self.version == 2:
                text = _read(os.path.join(self.dirs["unified"], "memory.events"))
            else:
                text = _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
        except FileNotFoundError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        if self.version == 1:
            return self.failcnt()
        return 0

    def has_oom_kill_counter(self) -> bool:
        """False on old v1 kernels without an ``oom_kill`` line, where :meth:`oom_kills` falls back to failcnt."""
        if self.version == 2:
            return True
        try:
            return "\noom_kill " in "\n" + _read(os.path.join(self.dirs["memory"], "memory.oom_control"))
        except FileNotFoundError:
            return False

    def failcnt(self) -> int:
        if self.version == 2:
            return 0
        try:
            return int(_read(os.path.join(self.dirs["memory"], "memory.failcnt")))
        except (FileNotFoundError, ValueError):
            return 0

    def limits(self) -> dict[str, str]:
        """The limit files as the kernel reports them (for tests and diagnostics)."""
        if self.version == 2:
            names = ("memory.max", "memory.swap.max", "pids.max", "cpu.max")
            paths = {n: os.path.join(self.dirs["unified"], n) for n in names}
        else:
            paths = {
                "memory.limit_in_bytes": os.path.join(self.dirs["memory"], "memory.limit_in_bytes"),
                "memory.memsw.limit_in_bytes": os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes"),
                "pids.max": os.path.join(self.dirs["pids"], "pids.max"),
                "cpu.cfs_quota_us": os.path.join(self.dirs["cpu"], "cpu.cfs_quota_us"),
                "cpu.cfs_period_us": os.path.join(self.dirs["cpu"], "cpu.cfs_period_us"),
            }
        out = {}
        for name, path in paths.items():
            try:
                out[name] = _read(path).strip()
            except FileNotFoundError:
                pass
        return out

    # -- teardown ---------------------------------------------------------------------------------------------

    def kill_all(self, timeout: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; True when it emptied within ``timeout``."""
        if self.version == 2:
            kill_file = os.path.join(self.dirs["unified"], "cgroup.kill")
            if os.path.exists(kill_file):
                try:
                    _write(kill_file, 1)
                except FileNotFoundError:
                    return True
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def destroy(self, timeout: float = 5.0) -> None:
        """Kill everything in the group and remove its directories; idempotent."""
        if not self.exists():
            return
        self.kill_all(timeout)
        deadline = time.monotonic() + timeout
        for path in self.dirs.values():
            delay = 0.001
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    # EBUSY: killed processes not reaped yet (zombies still charge the group)
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise SandboxError(f"cannot remove cgroup {path}: {e}") from e
                    self.kill_all(0.5)
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)


def _parent_dirs(root: str, version: int) -> list[str]:
    if version == 2:
        return [os.path.join(root, PARENT)]
    return [os.path.join(root, c, PARENT) for c in V1_CONTROLLERS]


def ensure_parent(root: str = CGROUP_ROOT) -> int:
    """Create the ``relax-gym`` parent group(s) (enabling v2 controllers); returns the cgroup version.

    Raises SandboxUnavailable naming what is missing."""
    version = detect_version(root)
    if version == 2:
        available = set(_read(os.path.join(root, "cgroup.controllers")).split())
        missing = [c for c in V2_CONTROLLERS if c not in available]
        if missing:
            raise SandboxUnavailable(f"cgroup v2 at {root} lacks the controller(s) {', '.join(missing)}")
        parent = os.path.join(root, PARENT)
        try:
            _enable_v2(root)
            os.makedirs(parent, 0o755, exist_ok=True)
            _enable_v2(parent)
        except OSError as e:
            raise SandboxUnavailable(f"cannot create the cgroup {parent} or enable its controllers ({e}); {_hint()}") from e
        return 2
    for c in V1_CONTROLLERS:
        ctrl = os.path.join(root, c)
        if not os.path.exists(os.path.join(ctrl, "cgroup.procs")):
            raise SandboxUnavailable(
                f"the cgroup v1 '{c}' controller is not mounted at {ctrl} (and {root} is not a cgroup v2 hierarchy)"
            )
        parent = os.path.join(ctrl, PARENT)
        try:
            os.makedirs(parent, 0o755, exist_ok=True)
        except OSError as e:
            raise SandboxUnavailable(f"cannot create the cgroup {parent} ({e.strerror}); {_hint()}") from e
        if not os.access(os.path.join(parent, "cgroup.procs"), os.W_OK):
            raise SandboxUnavailable(f"{parent}/cgroup.procs is not writable; {_hint()}")
    return 1


def _enable_v2(group: str) -> None:
    control = os.path.join(group, "cgroup.subtree_control")
    enabled = set(_read(control).split())
    wanted = [c for c in V2_CONTROLLERS if c not in enabled]
    if wanted:
        _write(control, " ".join(f"+{c}" for c in wanted))


def check(root: str = CGROUP_ROOT) -> str | None:
    """None when sandbox cgroups can be created here, else why not."""
    try:
        ensure_parent(root)
    except SandboxUnavailable as e:
        return str(e)
    except OSError as e:
        return f"cgroups unusable at {root}: {e}"
    return None


def list_groups(root: str = CGROUP_ROOT) -> list[str]:
    """Names of the groups under the ``relax-gym`` parent (in any controller)."""
    names: set[str] = set()
    for parent in _parent_dirs(root, detect_version(root)):
        try:
            with os.scandir(parent) as it:
                names.update(e.name for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            pass
    return sorted(names)
