"""The bubblewrap backend: each ``exec`` is one ``bwrap`` process in fresh namespaces, inside a per-sandbox cgroup.

Layout of one sandbox on the host (``<root>`` is ``/tmp/relax-gym-bwrap``)::

    <root>/<id>/            root-owned, 0711
        owner.json          who created it ({"owner": "<host>:<pid>", "pid", "start"}), for reap()
        etc/                the sandbox's read-only /etc: generated passwd/group/hosts + a few host files
        work/               bind-mounted at spec.workdir, owned by spec.uid:gid, 0700
        tmp/                a tmpfs of spec.tmpfs_mb (falls back to a plain directory) bind-mounted at /tmp

plus the cgroup ``relax-gym/<id>`` (memory + swap, pids, cpu). The host's /usr (and the /bin, /lib... symlinks or
directories) is shown read-only; the root itself is remounted read-only, so only workdir, /tmp and the read-write
``spec.mounts`` are writable (``--ro-bind`` / ``--bind``; their sources must be reachable by the sandbox uid).

bwrap run by root with ``--uid`` maps the sandbox user to host root, so the process that becomes bwrap first joins
the cgroup (as root) and then drops to spec.uid:gid with no supplementary groups (``setpriv``, or a preexec_fn when
util-linux or bash is missing) before exec'ing bwrap unprivileged; bwrap then builds a user namespace in which
spec.uid is itself. No user code runs before the cgroup is joined. The environment is cleared and set by bwrap
(--clearenv, --setenv), so spec.env never reaches a process that runs as root. Needs root (to drop to the uid, write
cgroups and mount the /tmp tmpfs).

Latency: moving a process into a cgroup v1 group waits for an RCU grace period (~12 ms on a small VM, more than a
whole ``python3 -c pass``), and bwrap's namespace + mount setup costs a few ms more. Neither depends on the command,
so each sandbox keeps one *standby* launched ahead of time (at create, after every command and after reset): the
launcher has joined the cgroup, bwrap has built the namespaces and mounts, and its pid 2 is ``/bin/sh -s`` (uid
spec.uid, no capabilities) blocked reading one ``exec`` line from a pipe. ``exec`` writes that line (the argv, quoted
with shlex; ``0</dev/null`` or the stdin pipe on fd 3) and the helper execs the command in place, so a command
costs about what the bare process costs. A standby is used for one command only (fresh namespaces each time); if
its parent dies the pipe hits EOF and the helper exits without running anything. It is launched only once the
previous command's processes are gone, so while a command runs the cgroup holds that command's sandbox alone (the
limits are all the command's); between commands it holds the idle standby (3 processes, ~1 MB). A program that
cannot be executed is reported the shell's way (rc 127 not found, 126 not executable, message on stderr).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import errno
import fcntl
import json
import logging
import os
import posixpath
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import threading
import time

from relax_gym.sandbox import cgroups
from relax_gym.sandbox.base import (
    LABEL,
    OWNER_LABEL,
    Backend,
    ExecResult,
    OutputCap,
    Sandbox,
    SandboxError,
    SandboxUnavailable,
    new_sandbox_id,
    owner_alive,
    owner_tag,
    process_start_time,
)
from relax_gym.sandbox.cgroups import SandboxCgroup
from relax_gym.sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)

DEFAULT_ROOT = "/tmp/relax-gym-bwrap"
ID_PREFIX = "rg-bwrap-"
INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap) or use the docker backend"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SANDBOX_USER = "sandbox"
DRAIN_GRACE_S = 2.0  # after the command exits and the cgroup is killed, how long the pipe readers may still take
MAX_SYMLINK_HOPS = 40
JOIN_FAILED = "relax-gym: cannot join the sandbox cgroup"
# the standby's pid 2 until a command is given: it reads one "exec ..." line from fd 0 (a pipe) and execs it
HELPER = ("/bin/sh", "-s")
HELPER_STDIN_FD = 3  # where the helper finds the command's stdin pipe
_HIGH_FD = 10  # the stdin pipe is moved to >= 10 before the launcher puts it on fd 3
READ_CHUNK = 256 * 1024

# host top-level entries shown read-only (as the same symlink when the host has a symlink, e.g. merged /usr)
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# host /etc entries the sandbox gets: files are copied, symlinks recreated, directories bind-mounted read-only
_ETC_ENTRIES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone", "os-release",
    "debian_version", "lsb-release", "protocols", "services", "rpc", "mime.types", "magic", "magic.mime",
    "bash.bashrc", "profile", "inputrc", "locale.alias", "locale.conf", "gai.conf", "host.conf", "python3",
    "python3.9", "python3.10", "python3.11", "python3.12", "python3.13", "fonts", "matplotlibrc", "ssl/openssl.cnf",
    "ssl/certs", "ca-certificates.conf", "terminfo", "papersize", "ImageMagick-6", "java-17-openjdk",
)
_NETWORK_ETC = ("resolv.conf",)
# workdirs that would hide or expose system directories
_FORBIDDEN_WORKDIRS = ("/", "/usr", "/etc", "/proc", "/dev", "/tmp", "/sys", "/run") + tuple(f"/{d}" for d in _SYSTEM_DIRS)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8

# sandboxes of this process that are not closed yet: the atexit backstop destroys them
_OPEN: dict[str, BwrapSandbox] = {}
_OPEN_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------- host helpers


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: str, size_mb: int, uid: int, gid: int) -> None:
    opts = f"size={int(size_mb)}m,mode=0700,uid={uid},gid={gid}".encode()
    if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def _umount(path: str) -> None:
    """Detach a mount at ``path`` if there is one (never follows a symlink)."""
    if _libc().umount2(path.encode(), _MNT_DETACH | _UMOUNT_NOFOLLOW) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):
            raise OSError(err, os.strerror(err), path)


def _owner_pid_from_id(sid: str) -> int | None:
    if not sid.startswith(ID_PREFIX):
        return None
    head = sid[len(ID_PREFIX) :].split("-", 1)[0]
    return int(head) if head.isdigit() else None


def _ensure_root(root: str) -> None:
    """Create the shared root (0711, ours); refuse one planted by somebody else (it is in world-writable /tmp)."""
    try:
        os.makedirs(root, 0o711, exist_ok=True)
        st = os.lstat(root)
    except OSError as e:
        raise SandboxUnavailable(f"cannot create the bwrap sandbox directory {root}: {e}") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise SandboxUnavailable(f"{root} exists but is not a directory owned by uid {os.geteuid()}; remove it")
    if stat.S_IMODE(st.st_mode) != 0o711:
        os.chmod(root, 0o711)


def _empty_dir(path: str, uid: int, gid: int) -> None:
    """Delete everything inside ``path`` (hidden files too) without following any symlink; reset its owner/mode."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for name, is_dir in entries:
            try:
                if is_dir:
                    shutil.rmtree(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _destroy_resources(root: str, sid: str) -> None:
    """Kill the sandbox's processes, unmount its /tmp, remove its directory and cgroup. Idempotent."""
    cg = SandboxCgroup(sid)
    errors = []
    try:
        cg.kill_all()
    except OSError as e:
        errors.append(e)
    base = os.path.join(root, sid)
    try:
        _umount(os.path.join(base, "tmp"))
    except OSError as e:
        errors.append(e)
    try:
        shutil.rmtree(base)
    except FileNotFoundError:
        pass
    except OSError as e:
        errors.append(e)
    try:
        cg.destroy()
    except (OSError, SandboxError) as e:
        errors.append(e)
    if errors:
        log.warning("bwrap sandbox %s: cleanup was incomplete: %s", sid, "; ".join(map(str, errors)))


def _close_all_at_exit() -> None:
    with _OPEN_LOCK:
        boxes = [b for b in _OPEN.values() if b._creator_pid == os.getpid()]
        _OPEN.clear()
    for box in boxes:
        box._closed = True
        try:
            box._discard_standby()
            _destroy_resources(box._root, box.id)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_close_all_at_exit)


def _forget_standbys_in_child() -> None:
    """After a bare os.fork() (multiprocessing's default on Linux, DataLoader workers): the child must not keep
    copies of our ends of the standbys' pipes, or a command's stdin would never see EOF while the child lives. The
    launchers stay the parent's (the child cannot wait for them; its copy of each Popen is marked finished)."""
    for box in list(_OPEN.values()):
        box._standby_lock = threading.Lock()  # another thread of the parent may have held it at the fork
        sb, box._standby = box._standby, None
        if sb is not None:
            sb.close()
            sb.proc.returncode = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_standbys_in_child)


def _drop_privileges(procs_files: list[str], uid: int, gid: int, stdin_fd: int | None = None):
    """preexec_fn for the launcher child: join the cgroup (needs root), put the helper's stdin pipe on fd 3, then
    become uid:gid for good."""

    def preexec() -> None:
        pid = str(os.getpid()).encode()
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if stdin_fd is not None:
            os.dup2(stdin_fd, HELPER_STDIN_FD)  # inheritable; kept through close_fds by pass_fds
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return preexec


def _launch_script(setpriv: str, procs_files: list[str], uid: int, gid: int, stdin_fd: int) -> str:
    """The root bash that joins the cgroup, moves the stdin pipe to fd 3 (dash cannot name fds above 9) and execs
    ``setpriv`` (drop to uid:gid, no supplementary groups), which execs bwrap. Python can then spawn with vfork: a
    ``preexec_fn`` forces a real fork(), whose cost grows with the parent's memory (measured here: 59 ms from a
    1 GiB process vs 4 ms), and RL trainers are big processes."""
    joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in procs_files)
    return (
        f"{{ {joins}; }} 2>/dev/null || {{ echo '{JOIN_FAILED}' >&2; exit 125; }}\n"
        f"exec {HELPER_STDIN_FD}<&{int(stdin_fd)} {int(stdin_fd)}<&- || exit 125\n"
        f"exec {shlex.quote(setpriv)} --reuid={uid} --regid={gid} --clear-groups -- \"$@\""
    )


def _command_line(argv: list[str], with_stdin: bool) -> bytes:
    """The line the standby's helper runs: ``exec`` of the argv (each word single-quoted, so nothing in it is shell
    syntax), stdin from the pipe on fd 3 or from /dev/null, fd 3 closed."""
    words = []
    for arg in argv:
        if "\0" in arg:
            raise ValueError("embedded null byte")
        words.append(shlex.quote(arg))
    redirect = f"0<&{HELPER_STDIN_FD}" if with_stdin else "0</dev/null"
    return os.fsencode(f"exec {' '.join(words)} {redirect} {HELPER_STDIN_FD}<&-\n")


def _close_fds(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


def _mount_args(spec: SandboxSpec) -> list[str]:
    args: list[str] = []
    for m in spec.mounts_in_order():
        args += ["--ro-bind" if m.read_only else "--bind", m.source, m.target]
    return args


def _searchable_by(st: os.stat_result, uid: int, gid: int) -> bool:
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _check_mount_sources(spec: SandboxSpec) -> None:
    """Every mount source exists and the sandbox uid can reach it: bwrap mounts it after dropping to that uid, so
    a source under e.g. root's 0700 home would only fail later, at the first command, with bwrap's own message."""
    problem = spec.mount_source_problem()
    if problem:
        raise SandboxError(f"cannot create a bwrap sandbox: {problem}")
    for i, m in enumerate(spec.mounts):
        real = os.path.realpath(m.source)
        parent = os.path.dirname(real)
        while True:
            try:
                ok = _searchable_by(os.stat(parent), spec.uid, spec.gid)
            except OSError:
                ok = False
            if not ok:
                raise SandboxError(
                    f"cannot create a bwrap sandbox: mounts[{i}].source {m.source!r} is not reachable by the sandbox "
                    f"uid {spec.uid}: {parent} is not searchable by it (chmod o+x, or put the source elsewhere)"
                )
            if parent == "/":
                break
            parent = os.path.dirname(parent)


def _namespace_args(network: bool) -> list[str]:
    args = ["--unshare-all", "--unshare-user"]
    if network:
        args.append("--share-net")
    return args + ["--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


# ---------------------------------------------------------------------------------------------- the sandbox


class _Standby:
    """One launched sandbox waiting for its command (see the module docstring). Owns the launcher process and our
    ends of its pipes: ``ctl`` (the helper's fd 0), ``stdin`` (the helper's fd 3), ``out`` and ``err``."""

    def __init__(self, proc: subprocess.Popen, ctl: int, stdin: int, out: int, err: int) -> None:
        self.proc = proc
        # bwrap --die-with-parent: the kernel kills it when the *thread* that spawned it exits
        self.thread = threading.current_thread()
        self.fds: dict[str, int] = {"ctl": ctl, "stdin": stdin, "out": out, "err": err}
        try:
            self.pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # Python < 3.9 or kernel < 5.3: a thread waits instead
            self.pidfd = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def usable(self) -> bool:
        """Alive, and spawned by this thread (one spawned by another thread dies whenever that thread ends)."""
        return self.thread is threading.current_thread() and self.alive()

    def take(self, name: str) -> int | None:
        """Hand one of our pipe ends over to the caller (who closes it)."""
        return self.fds.pop(name, None)

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()  # only we reap this pid, so it cannot have been reused
            except OSError:
                pass

    def close(self) -> None:
        _close_fds(*self.fds.values(), self.pidfd)
        self.fds.clear()
        self.pidfd = None

    def discard(self) -> None:
        """Kill it, reap it, close everything (blocks at most a few seconds; the process is SIGKILLed)."""
        self.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("bwrap launcher %d not reaped 5 s after SIGKILL", self.proc.pid)
        self.close()


class _Exec:
    """The event-loop side of one command run in a standby: output readers, stdin / command-line writers, exit."""

    def __init__(self, loop: asyncio.AbstractEventLoop, standby: _Standby, limit: int) -> None:
        self.loop = loop
        self.sb = standby
        self.caps = {"out": OutputCap(limit), "err": OutputCap(limit)}
        self.exited = loop.create_future()
        self.drained = loop.create_future()
        self._readers: dict[int, OutputCap] = {}
        self._writers: dict[int, memoryview] = {}
        self._waiting = False

    def start(self) -> None:
        for name, cap in self.caps.items():
            fd = self.sb.take(name)
            self._readers[fd] = cap
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._on_readable, fd)
        if self.sb.pidfd is not None:
            self.loop.add_reader(self.sb.pidfd, self._on_exit)
            self._waiting = True
        else:
            waiter = self.loop.run_in_executor(None, self.sb.proc.wait)
            waiter.add_done_callback(lambda _f: self._set(self.exited))

    @staticmethod
    def _set(fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(None)

    def _on_exit(self) -> None:
        if self.sb.proc.poll() is not None:  # reaps it: pidfd is readable once the process has exited
            self.loop.remove_reader(self.sb.pidfd)
            self._waiting = False
            self._set(self.exited)

    def _on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self._readers[fd].feed(data)  # beyond the cap only counted: huge outputs are drained, not stored
            return
        self.loop.remove_reader(fd)
        os.close(fd)
        del self._readers[fd]
        if not self._readers:
            self._set(self.drained)

    def send(self, fd: int, data: bytes) -> None:
        """Write ``data`` to ``fd`` (ours now) without blocking the loop, then close it; a reader that is gone
        (the command exited without reading) just ends the write."""
        os.set_blocking(fd, False)
        self._writers[fd] = memoryview(data)
        self._on_writable(fd)
        if fd in self._writers:
            self.loop.add_writer(fd, self._on_writable, fd)

    def _on_writable(self, fd: int) -> None:
        view = self._writers[fd]
        try:
            while view:
                view = view[os.write(fd, view):]
        except (BlockingIOError, InterruptedError):
            self._writers[fd] = view
            return
        except OSError:  # EPIPE: nobody reads any more
            pass
        self.loop.remove_writer(fd)
        os.close(fd)
        del self._writers[fd]

    def close(self) -> None:
        """Stop watching; close whatever is still open (idempotent)."""
        for fd in list(self._readers):
            self.loop.remove_reader(fd)
            os.close(fd)
        self._readers.clear()
        for fd in list(self._writers):
            self.loop.remove_writer(fd)
            os.close(fd)
        self._writers.clear()
        if self._waiting:
            self.loop.remove_reader(self.sb.pidfd)
            self._waiting = False


class BwrapSandbox(Sandbox):
    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, root: str, cgroup: SandboxCgroup, argv: list[str],
                 setpriv: str | None = None, bash: str | None = None) -> None:
        super().__init__(spec, sandbox_id)
        self._root = root
        self._base = os.path.join(root, sandbox_id)
        self._work = os.path.join(self._base, "work")
        self._tmp = os.path.join(self._base, "tmp")
        self._cg = cgroup
        self._creator_pid = os.getpid()
        self._bwrap_argv = [*argv, *HELPER]
        # setpriv + bash: spawn with vfork; else a preexec_fn joins, moves the stdin pipe and drops privileges
        self._launcher = (setpriv, bash) if setpriv and bash else None
        self._standby: _Standby | None = None
        self._standby_lock = threading.Lock()  # exec, reset and close may run on different threads / loops
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        workdir = posixpath.normpath(spec.workdir)
        self._mounts = sorted([(workdir, self._work), ("/tmp", self._tmp)], key=lambda m: -len(m[0]))

    @property
    def host_workdir(self) -> str:
        return self._work

    @property
    def host_tmpdir(self) -> str:
        return self._tmp

    @property
    def cgroup(self) -> SandboxCgroup:
        return self._cg

    def _exec_lock(self) -> asyncio.Lock:
        """One command at a time per sandbox (leftovers of one command are killed when it ends)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _check_alive(self) -> None:
        if not os.path.isdir(self._work) or not self._cg.exists():
            raise SandboxError(f"sandbox {self.id} is gone (its directory or cgroup was removed)")

    # -- exec ---------------------------------------------------------------------------------------------------

    async def _exec(self, cmd: str | list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ValueError("empty command")
        line = _command_line(argv, stdin is not None)
        async with self._exec_lock():
            if self._closed:
                raise SandboxError(f"sandbox {self.id} is closed")
            self._check_alive()
            result = await self._run(line, timeout, stdin)
            self._prepare()  # the next command's sandbox, built while the caller looks at this result
            return result

    # -- standby ------------------------------------------------------------------------------------------------

    def _launch(self) -> _Standby:
        """Start a launcher: join the cgroup, drop to the uid, bwrap, helper waiting for its command line."""
        spec, procs = self.spec, self._cg.procs_files
        opened: list[int] = []
        try:
            ctl_r, ctl_w = os.pipe()
            opened += [ctl_r, ctl_w]
            in_low, in_w = os.pipe()
            opened += [in_low, in_w]
            in_r = fcntl.fcntl(in_low, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD)
            opened.append(in_r)
            out_r, out_w = os.pipe()
            opened += [out_r, out_w]
            err_r, err_w = os.pipe()
            opened += [err_r, err_w]
            if self._launcher is not None:
                setpriv, bash = self._launcher
                script = _launch_script(setpriv, procs, spec.uid, spec.gid, in_r)
                argv, preexec, keep = [bash, "-c", script, "relax-gym-launcher", *self._bwrap_argv], None, (in_r,)
            else:
                argv = self._bwrap_argv
                preexec, keep = _drop_privileges(procs, spec.uid, spec.gid, in_r), (in_r, HELPER_STDIN_FD)
            proc = subprocess.Popen(
                argv, stdin=ctl_r, stdout=out_w, stderr=err_w, pass_fds=keep, env={}, cwd="/",
                start_new_session=True, umask=0o022, preexec_fn=preexec,
            )
        except BaseException:
            _close_fds(*opened)
            raise
        _close_fds(ctl_r, in_low, in_r, out_w, err_w)
        return _Standby(proc, ctl_w, in_w, out_r, err_r)

    def _prepare(self) -> None:
        """Launch the standby for the next command unless there is one or the sandbox is closing. Best effort: a
        launch that fails here is retried (and reported) by the next exec. Called on the event loop's thread,
        which lives as long as the loop (a worker thread's exit would kill the standby: --die-with-parent)."""
        with self._standby_lock:
            if self._closed or self._standby is not None or os.getpid() != self._creator_pid:
                return
            try:
                self._standby = self._launch()
            except (OSError, subprocess.SubprocessError) as e:
                log.debug("bwrap sandbox %s: cannot launch a standby: %s", self.id, e)

    def _take_standby(self) -> _Standby | None:
        """The prepared standby if it is still waiting (one that died, e.g. killed by reset, or that another
        thread spawned is discarded)."""
        if os.getpid() != self._creator_pid:  # a forked child: the launcher is its parent's
            return None
        with self._standby_lock:
            sb, self._standby = self._standby, None
        if sb is not None and not sb.usable():
            sb.discard()
            sb = None
        return sb

    def _discard_standby(self) -> None:
        with self._standby_lock:
            sb, self._standby = self._standby, None
        if sb is not None:
            sb.discard()

    # -- running one command ----------------------------------------------------------------------------------

    async def _run(self, line: bytes, timeout: float, stdin: bytes | None) -> ExecResult:
        loop = asyncio.get_running_loop()
        oom_before = self._cg.oom_kills()
        t0 = time.monotonic()
        sb = self._take_standby()
        if sb is None:  # first command after a failure, or back to back: launch one now
            try:
                sb = self._launch()
            except (OSError, subprocess.SubprocessError) as e:
                self._check_alive()
                raise SandboxError(f"sandbox {self.id}: cannot start bwrap: {e}") from e
        run = _Exec(loop, sb, self.spec.max_output_bytes)
        timed_out = False
        try:
            run.start()
            run.send(sb.take("ctl"), line)
            stdin_fd = sb.take("stdin")
            if stdin:
                run.send(stdin_fd, stdin)
            else:
                os.close(stdin_fd)  # b"" (EOF at once) or None (the command gets /dev/null)
            try:
                await asyncio.wait_for(asyncio.shield(run.exited), timeout)
            except asyncio.TimeoutError:
                timed_out = True
                await self._kill_all(sb)  # bwrap itself is in the cgroup too
                try:
                    await asyncio.wait_for(asyncio.shield(run.exited), 10)
                except asyncio.TimeoutError:
                    log.warning("bwrap sandbox %s: command still not reaped 10 s after SIGKILL", self.id)
            # nothing may outlive the command (background jobs): kill what is left in the cgroup (usually just
            # bwrap's pid 1 on its way out) without waiting, let the readers drain, then make sure it is empty
            self._signal_all()
            try:
                await asyncio.wait_for(asyncio.shield(run.drained), DRAIN_GRACE_S)
            except asyncio.TimeoutError:
                pass
            await self._kill_all()
        except BaseException:
            sb.kill()
            self._cg.kill_all()
            try:
                sb.proc.wait(1)  # SIGKILLed and its cgroup emptied: reaped at once
            except subprocess.TimeoutExpired:
                pass
            raise
        finally:
            run.close()
            sb.close()
        rc = sb.proc.returncode
        rc = -1 if rc is None else (128 - rc if rc < 0 else rc)
        out, err = run.caps["out"], run.caps["err"]
        if rc == 125 and err.kept.startswith(JOIN_FAILED.encode()):
            self._check_alive()  # the launcher could not join the cgroup: only when it is gone (else the command's)
        oom_after = self._cg.oom_kills()
        oom_killed = oom_after > oom_before and (self._cg.has_oom_kill_counter() or rc == 128 + 9)
        return ExecResult(
            rc=rc, stdout=out.text(), stderr=err.text(), timed_out=timed_out, oom_killed=oom_killed,
            duration=time.monotonic() - t0, truncated=bool(out.dropped or err.dropped),
        )

    def _signal_all(self) -> None:
        """SIGKILL whatever is in the cgroup right now, without waiting (the loop thread may call it)."""
        for pid in self._cg.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def _kill_all(self, sb: _Standby | None = None) -> None:
        if sb is not None:
            sb.kill()  # the launcher, should it not have joined the cgroup yet
        if self._cg.pids():  # usually empty: the pid namespace dies with the command
            await asyncio.to_thread(self._cg.kill_all)

    # -- files ----------------------------------------------------------------------------------------------------

    def _mount_for(self, path: str, shown: str) -> tuple[str, str, list[str]]:
        for inside, host in self._mounts:
            if path == inside or path.startswith(inside.rstrip("/") + "/"):
                return inside, host, [p for p in path[len(inside):].split("/") if p]
        raise SandboxError(
            f"{shown}: only paths under {self.spec.workdir} or /tmp can be read or written in a bwrap sandbox"
        )

    def _resolve(self, path: str, *, create_dirs: bool) -> tuple[int, str]:
        """Open the directory holding ``path`` and return (dir fd, final name).

        Every component is opened with O_NOFOLLOW; a symlink (planted by the sandbox) is resolved the way the
        sandbox would see it, but only to somewhere under workdir or /tmp, so nothing on the host outside the
        sandbox's own directories is ever touched."""
        shown = path
        for _ in range(MAX_SYMLINK_HOPS):
            norm = posixpath.normpath(path)
            if norm.startswith("//"):
                norm = "/" + norm.lstrip("/")
            inside, host, parts = self._mount_for(norm, shown)
            if not parts:
                raise SandboxError(f"{shown}: is a directory")
            fd = os.open(host, _DIR_FLAGS)
            try:
                redirect = None
                for i, part in enumerate(parts):
                    last = i == len(parts) - 1
                    try:
                        st = os.lstat(part, dir_fd=fd)
                    except FileNotFoundError:
                        if last:
                            break
                        if not create_dirs:
                            raise SandboxError(f"{shown}: no such file or directory") from None
                        try:
                            os.mkdir(part, 0o755, dir_fd=fd)
                        except FileExistsError:
                            pass
                        st = None
                    except NotADirectoryError:
                        raise SandboxError(f"{shown}: not a directory") from None
                    if st is not None and stat.S_ISLNK(st.st_mode):
                        target = os.readlink(part, dir_fd=fd)
                        here = posixpath.join(inside, *parts[:i])
                        redirect = posixpath.join(here, target, *parts[i + 1 :])
                        break
                    if last:
                        break
                    try:
                        nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                    except OSError as e:
                        if e.errno in (errno.ELOOP, errno.ENOTDIR):
                            raise SandboxError(f"{shown}: not a directory (or changed while resolving)") from None
                        raise
                    if st is None:
                        os.fchown(nfd, self.spec.uid, self.spec.gid)
                    os.close(fd)
                    fd = nfd
                if redirect is None:
                    return fd, parts[-1]
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            path = redirect
        raise SandboxError(f"{shown}: too many levels of symbolic links")

    def _write_sync(self, path: str, data: bytes, mode: int) -> None:
        dfd, name = self._resolve(path, create_dirs=True)
        try:
            tmp_name = f".rg-write-{secrets.token_hex(8)}"
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fchown(fd, self.spec.uid, self.spec.gid)
                os.fchmod(fd, mode & 0o777)
            except BaseException:
                os.close(fd)
                os.unlink(tmp_name, dir_fd=dfd)
                raise
            os.close(fd)
            try:
                # rename, never open-and-truncate: a hard link or symlink at the name is replaced, not written through
                os.rename(tmp_name, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except OSError as e:
                os.unlink(tmp_name, dir_fd=dfd)
                raise SandboxError(f"{path}: cannot write ({e.strerror})") from None
        except OSError as e:
            raise SandboxError(f"{path}: cannot write ({e.strerror or e})") from None
        finally:
            os.close(dfd)

    def _read_sync(self, path: str, max_bytes: int) -> bytes:
        dfd, name = self._resolve(path, create_dirs=False)
        try:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
            except FileNotFoundError:
                raise SandboxError(f"{path}: no such file in sandbox {self.id}") from None
            except OSError as e:
                raise SandboxError(f"{path}: cannot read ({e.strerror})") from None
        finally:
            os.close(dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise SandboxError(f"{path}: not a regular file")
            chunks, left = [], max_bytes
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    async def _write_file(self, path: str, data: bytes, mode: int) -> None:
        self._check_alive()
        await asyncio.to_thread(self._write_sync, path, data, mode)

    async def _read_file(self, path: str, max_bytes: int) -> bytes:
        self._check_alive()
        return await asyncio.to_thread(self._read_sync, path, max_bytes)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def _reset_sync(self) -> None:
        self._discard_standby()
        self._cg.kill_all()
        for d in (self._work, self._tmp):
            _empty_dir(d, self.spec.uid, self.spec.gid)

    async def _reset(self) -> None:
        self._check_alive()
        await asyncio.to_thread(self._cg.kill_all)  # ends a running command so the lock frees up
        async with self._exec_lock():
            await asyncio.to_thread(self._reset_sync)
            self._prepare()

    async def _close(self) -> None:
        with _OPEN_LOCK:
            _OPEN.pop(self.id, None)
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        self._discard_standby()  # _closed is set: no new one is launched after this
        _destroy_resources(self._root, self.id)


# ---------------------------------------------------------------------------------------------- the backend


class BwrapBackend(Backend):
    name = "bwrap"

    def __init__(self, root: str = DEFAULT_ROOT, bwrap: str | None = None) -> None:
        self.root = root
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self._problem: str | None = None
        self._checked = False
        self._tmpfs_warned = False
        self._setpriv: str | None = None  # found by check(): spawn bwrap through setpriv (vfork) when it works
        self._bash: str | None = None  # the launcher shell with setpriv (moves the stdin pipe to fd 3)

    # -- check ------------------------------------------------------------------------------------------------------

    def check(self) -> str | None:
        if not self._checked:
            self._problem = self._probe()
            self._checked = True
        return self._problem

    def _probe(self) -> str | None:
        if not (os.path.isfile(self.bwrap) and os.access(self.bwrap, os.X_OK)):
            return f"bubblewrap is not installed (no bwrap binary); {INSTALL_HINT}"
        if os.geteuid() != 0:
            return (
                "the bwrap backend must run as root: it drops to the sandbox uid itself and creates cgroups "
                f"(running as uid {os.geteuid()}); run as root or use the docker backend"
            )
        problem = cgroups.check()
        if problem:
            return problem
        try:
            _ensure_root(self.root)
        except SandboxUnavailable as e:
            return str(e)
        uid = SandboxSpec().uid
        argv = [self.bwrap, *_namespace_args(False), *_system_args(), "--proc", "/proc", "--dev", "/dev",
                "--remount-ro", "/", "--", "/usr/bin/true"]
        setpriv = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
        if setpriv:
            try:
                r = subprocess.run([setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv],
                                   capture_output=True, timeout=20, cwd="/", env={})
                if r.returncode == 0:
                    self._setpriv = setpriv
                    self._bash = shutil.which("bash", path="/usr/bin:/bin")
                    return None
            except (OSError, subprocess.SubprocessError):
                pass
        self._setpriv = None
        preexec = _drop_privileges([], uid, uid)
        try:
            r = subprocess.run(argv, capture_output=True, timeout=20, cwd="/", env={}, preexec_fn=preexec)
        except (OSError, subprocess.SubprocessError) as e:
            return f"cannot run bwrap ({e}); {INSTALL_HINT}"
        if r.returncode != 0:
            msg = r.stderr.decode(errors="replace").strip() or f"exit status {r.returncode}"
            return (
                f"bwrap cannot create a sandbox as uid {uid}: {msg}. Unprivileged user namespaces must be allowed "
                "(sysctl user.max_user_namespaces > 0; kernel.unprivileged_userns_clone=1 on Debian; "
                "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04)"
            )
        return None

    # -- create -----------------------------------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Sandbox:
        problem = self.check()
        if problem:
            raise SandboxUnavailable(f"bwrap sandbox backend unavailable: {problem}")
        box = await asyncio.to_thread(self._create_sync, spec)
        box._prepare()  # here, on the loop's thread: the first command finds its sandbox built
        return box

    def _create_sync(self, spec: SandboxSpec) -> BwrapSandbox:
        workdir = posixpath.normpath(spec.workdir)
        if not workdir.startswith("/") or workdir.startswith("//"):
            raise SandboxError(f"workdir {spec.workdir!r} must be an absolute path")
        if any(workdir == f or (f != "/" and workdir.startswith(f + "/")) for f in _FORBIDDEN_WORKDIRS):
            raise SandboxError(f"workdir {spec.workdir!r} would shadow a system directory; use e.g. /workspace")
        _check_mount_sources(spec)
        _ensure_root(self.root)
        sid = new_sandbox_id(self.name)
        base = os.path.join(self.root, sid)
        try:
            os.mkdir(base, 0o711)
            with open(os.path.join(base, "owner.json"), "w") as f:
                json.dump({"label": LABEL, OWNER_LABEL: owner_tag(), "pid": os.getpid(),
                           "start": process_start_time(os.getpid())}, f)
            etc = self._make_etc(base, spec)
            for name in ("work", "tmp"):
                d = os.path.join(base, name)
                os.mkdir(d, 0o700)
                os.chown(d, spec.uid, spec.gid)
            try:
                _mount_tmpfs(os.path.join(base, "tmp"), spec.tmpfs_mb, spec.uid, spec.gid)
            except OSError as e:
                if not self._tmpfs_warned:
                    log.warning("bwrap: cannot mount a tmpfs for /tmp (%s); /tmp is a plain directory, "
                                "so tmpfs_mb is not enforced", e)
                    self._tmpfs_warned = True
            cg = SandboxCgroup.create(sid, spec.memory_mb * 1024 * 1024, spec.pids, spec.cpus)
        except BaseException as e:
            _destroy_resources(self.root, sid)
            if isinstance(e, SandboxError):
                raise
            if isinstance(e, OSError):
                raise SandboxError(f"cannot create bwrap sandbox {sid}: {e}") from e
            raise
        argv = [
            self.bwrap, *_namespace_args(spec.network), "--hostname", "sandbox",
            "--uid", str(spec.uid), "--gid", str(spec.gid),
            *_system_args(), "--ro-bind", etc, "/etc", *self._etc_binds(),
            "--proc", "/proc", "--dev", "/dev",
            "--bind", os.path.join(base, "tmp"), "/tmp",
            "--bind", os.path.join(base, "work"), workdir, *_mount_args(spec),
            "--chdir", workdir, "--remount-ro", "/", "--clearenv",
        ]
        env = {"PATH": SANDBOX_PATH, "HOME": workdir, "LANG": "C.UTF-8", "USER": SANDBOX_USER,
               "LOGNAME": SANDBOX_USER, "TMPDIR": "/tmp", **spec.env}
        for key, value in env.items():  # set by bwrap inside: nothing of spec.env reaches a process run as root
            argv += ["--setenv", key, value]
        argv.append("--")
        box = BwrapSandbox(spec, sid, self.root, cg, argv, self._setpriv, self._bash)
        with _OPEN_LOCK:
            _OPEN[sid] = box
        return box

    def _make_etc(self, base: str, spec: SandboxSpec) -> str:
        """The sandbox's /etc: its own passwd/group/hosts, copies of a few host files, never /etc/shadow."""
        etc = os.path.join(base, "etc")
        os.mkdir(etc, 0o755)
        home = posixpath.normpath(spec.workdir)
        users = [("root", 0, 0, "/root", "/usr/sbin/nologin"), (SANDBOX_USER, spec.uid, spec.gid, home, "/bin/sh")]
        groups = [("root", 0), (SANDBOX_USER, spec.gid)]
        if 65534 not in (spec.uid, spec.gid):
            users.append(("nobody", 65534, 65534, "/nonexistent", "/usr/sbin/nologin"))
            groups.append(("nogroup", 65534))
        files = {
            "passwd": "".join(f"{n}:x:{u}:{g}:{n}:{h}:{s}\n" for n, u, g, h, s in users),
            "group": "".join(f"{n}:x:{g}:\n" for n, g in groups),
            "hostname": "sandbox\n",
            "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
            "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
                             "protocols: files\nservices: files\nethers: files\nrpc: files\n",
        }
        for name, text in files.items():
            with open(os.path.join(etc, name), "w") as f:
                f.write(text)
        for rel in _ETC_ENTRIES + (_NETWORK_ETC if spec.network else ()):
            src, dst = f"/etc/{rel}", os.path.join(etc, rel)
            try:
                if "/" in rel:
                    os.makedirs(os.path.dirname(dst), 0o755, exist_ok=True)
                if os.path.islink(src) and not rel.startswith("resolv"):
                    os.symlink(os.readlink(src), dst)
                elif os.path.isdir(src):
                    os.mkdir(dst, 0o755)  # mount point; the host dir is bind-mounted read-only on it
                elif os.path.isfile(src):
                    shutil.copyfile(src, dst)
                    os.chmod(dst, 0o644)
            except OSError:
                pass
        return etc

    @staticmethod
    def _etc_binds() -> list[str]:
        args = []
        for rel in _ETC_ENTRIES:
            src = f"/etc/{rel}"
            if os.path.isdir(src) and not os.path.islink(src):
                args += ["--ro-bind", src, src]
        return args

    # -- bookkeeping ----------------------------------------------------------------------------------------------

    def _names(self) -> set[str]:
        names = {n for n in cgroups.list_groups() if n.startswith(ID_PREFIX)}
        try:
            names.update(n for n in os.listdir(self.root) if n.startswith(ID_PREFIX))
        except (FileNotFoundError, NotADirectoryError):
            pass
        return names

    def _owner(self, sid: str) -> tuple[str | None, int | None, int | None]:
        """(hostname, pid, start time) of the process that created ``sid``, as far as is known."""
        try:
            with open(os.path.join(self.root, sid, "owner.json")) as f:
                info = json.load(f)
            host, _, pid = str(info[OWNER_LABEL]).rpartition(":")
            return host, int(pid), info.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            return None, _owner_pid_from_id(sid), None

    def _owned_by_me(self, sid: str) -> bool:
        host, pid, start = self._owner(sid)
        if pid != os.getpid() or (host is not None and host != os.uname().nodename):
            return False
        return start is None or start == process_start_time(pid)

    def _owner_alive(self, sid: str) -> bool | None:
        """True/False, or None when it cannot be told (another host's owner tag)."""
        return owner_alive(*self._owner(sid))

    def live(self) -> list[str]:
        return sorted(sid for sid in self._names() if self._owned_by_me(sid))

    def every(self) -> list[str]:
        return sorted(self._names())

    def reap(self, *, all_owners: bool = False) -> int:
        count = 0
        for sid in sorted(self._names()):
            if not all_owners and self._owner_alive(sid) is not False:
                continue
            with _OPEN_LOCK:
                box = _OPEN.pop(sid, None)
            if box is not None:
                box._closed = True
                box._discard_standby()
            _destroy_resources(self.root, sid)
            count += 1
        return count
