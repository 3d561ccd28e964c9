"""The bubblewrap backend: each ``exec`` is one ``bwrap`` process in fresh namespaces, inside a per-sandbox cgroup.

Layout of one sandbox on the host (``<root>`` is ``/tmp/relax-gym-bwrap``)::

    <root>/<id>/            root-owned, 0711
        owner.json          who created it ({"owner": "<host>:<pid>", "pid", "start"}), for reap()
        etc/                the sandbox's read-only /etc: generated passwd/group/hosts + a few host files
        work/               bind-mounted at spec.workdir, owned by spec.uid:gid, 0700
        tmp/                a tmpfs of spec.tmpfs_mb (falls back to a plain directory) bind-mounted at /tmp

plus the cgroup ``relax-gym/<id>`` (memory + swap, pids, cpu). The host's /usr (and the /bin, /lib... symlinks or
directories) is shown read-only; the root itself is remounted read-only, so only workdir and /tmp are writable.

bwrap run by root with ``--uid`` maps the sandbox user to host root, so the process that becomes bwrap first joins
the cgroup (as root) and then drops to spec.uid:gid with no supplementary groups (``setpriv``, or a preexec_fn when
util-linux is missing) before exec'ing bwrap unprivileged; bwrap then builds a user namespace in which spec.uid is
itself. No user code runs before the cgroup is joined. The environment is cleared and set by bwrap (--clearenv,
--setenv), so spec.env never reaches a process that runs as root. Needs root (to drop to the uid, write cgroups and
mount the /tmp tmpfs).
"""

from __future__ import annotations

import asyncio
import atexit
import ctypes
import errno
import json
import logging
import os
import posixpath
import secrets
import shlex
import shutil
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
    owner_tag,
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


def _proc_start_time(pid: int) -> int | None:
    """Kernel start time of ``pid`` (clock ticks since boot), to tell a live owner from a reused pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
            _destroy_resources(box._root, box.id)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


atexit.register(_close_all_at_exit)


def _drop_privileges(procs_files: list[str], uid: int, gid: int):
    """preexec_fn for the bwrap child: join the cgroup (needs root), then become uid:gid for good."""

    def preexec() -> None:
        pid = str(os.getpid()).encode()
        for path in procs_files:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return preexec


def _launcher(setpriv: str | None, procs_files: list[str], uid: int, gid: int) -> tuple[list[str], object]:
    """How to start bwrap: (argv prefix, preexec_fn).

    With util-linux ``setpriv`` a two-line root shell joins the cgroup and execs ``setpriv`` (drop to uid:gid, no
    supplementary groups) which execs bwrap; Python can then spawn with vfork. A ``preexec_fn`` forces a real
    fork(), whose cost grows with the parent's memory (measured here: 59 ms from a 1 GiB process vs 4 ms), and
    RL trainers are big processes. Without setpriv we fall back to the preexec_fn."""
    if setpriv is None:
        return [], _drop_privileges(procs_files, uid, gid)
    joins = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in procs_files)
    script = (
        f"{{ {joins}; }} 2>/dev/null || {{ echo '{JOIN_FAILED}' >&2; exit 125; }}\n"
        f"exec {shlex.quote(setpriv)} --reuid={uid} --regid={gid} --clear-groups -- \"$@\""
    )
    return ["/bin/sh", "-c", script, "sh"], None


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _SYSTEM_DIRS:
        host = f"/{name}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    return args


def _namespace_args(network: bool) -> list[str]:
    args = ["--unshare-all", "--unshare-user"]
    if network:
        args.append("--share-net")
    return args + ["--disable-userns", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


# ---------------------------------------------------------------------------------------------- the sandbox


class _ExecProtocol(asyncio.SubprocessProtocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self.caps = {1: OutputCap(limit), 2: OutputCap(limit)}
        self.exited = loop.create_future()
        self.drained = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self.caps[fd].feed(data)  # beyond the cap only counted: huge outputs are drained, not stored

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.drained.done():
            self.drained.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class BwrapSandbox(Sandbox):
    backend = "bwrap"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, root: str, cgroup: SandboxCgroup, argv: list[str],
                 setpriv: str | None = None) -> None:
        super().__init__(spec, sandbox_id)
        self._root = root
        self._base = os.path.join(root, sandbox_id)
        self._work = os.path.join(self._base, "work")
        self._tmp = os.path.join(self._base, "tmp")
        self._cg = cgroup
        self._creator_pid = os.getpid()
        launcher, self._preexec = _launcher(setpriv, cgroup.procs_files, spec.uid, spec.gid)
        self._argv = launcher + argv
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
        async with self._exec_lock():
            if self._closed:
                raise SandboxError(f"sandbox {self.id} is closed")
            self._check_alive()
            return await self._run(argv, timeout, stdin)

    async def _run(self, argv: list[str], timeout: float, stdin: bytes | None) -> ExecResult:
        loop = asyncio.get_running_loop()
        proto = _ExecProtocol(loop, self.spec.max_output_bytes)
        oom_before = self._cg.oom_kills()
        t0 = time.monotonic()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: proto, *self._argv, *argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, cwd="/", start_new_session=True, umask=0o022, preexec_fn=self._preexec,
            )
        except (OSError, subprocess.SubprocessError) as e:
            self._check_alive()
            raise SandboxError(f"sandbox {self.id}: cannot start bwrap: {e}") from e
        timed_out = False
        try:
            if stdin is not None:
                pipe = transport.get_pipe_transport(0)
                if stdin:
                    pipe.write(stdin)
                pipe.close()  # flushes what is buffered, then closes: the command sees EOF
            try:
                await asyncio.wait_for(asyncio.shield(proto.exited), timeout)
            except asyncio.TimeoutError:
                timed_out = True
                await self._kill_all()  # bwrap itself is in the cgroup too
                try:
                    await asyncio.wait_for(asyncio.shield(proto.exited), 10)
                except asyncio.TimeoutError:
                    log.warning("bwrap sandbox %s: command still not reaped 10 s after SIGKILL", self.id)
            # nothing may outlive the command (background jobs); then let the readers drain what is buffered
            await self._kill_all()
            try:
                await asyncio.wait_for(asyncio.shield(proto.drained), DRAIN_GRACE_S)
            except asyncio.TimeoutError:
                await self._kill_all()
        except BaseException:
            self._cg.kill_all()
            raise
        finally:
            transport.close()
        rc = transport.get_returncode()
        rc = -1 if rc is None else (128 - rc if rc < 0 else rc)
        if rc == 125 and proto.caps[2].kept.startswith(JOIN_FAILED.encode()):
            self._check_alive()  # the launcher could not join the cgroup: only when it is gone (else the command's)
        oom_after = self._cg.oom_kills()
        oom_killed = oom_after > oom_before and (self._cg.has_oom_kill_counter() or rc == 128 + 9)
        out, err = proto.caps[1], proto.caps[2]
        return ExecResult(
            rc=rc, stdout=out.text(), stderr=err.text(), timed_out=timed_out, oom_killed=oom_killed,
            duration=time.monotonic() - t0, truncated=bool(out.dropped or err.dropped),
        )

    async def _kill_all(self) -> None:
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
        self._cg.kill_all()
        for d in (self._work, self._tmp):
            _empty_dir(d, self.spec.uid, self.spec.gid)

    async def _reset(self) -> None:
        self._check_alive()
        await asyncio.to_thread(self._cg.kill_all)  # ends a running command so the lock frees up
        async with self._exec_lock():
            await asyncio.to_thread(self._reset_sync)

    async def _close(self) -> None:
        with _OPEN_LOCK:
            _OPEN.pop(self.id, None)
        await asyncio.to_thread(_destroy_resources, self._root, self.id)


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
                    return None
            except (OSError, subprocess.SubprocessError):
                pass
        self._setpriv = None
        launcher, preexec = _launcher(None, [], uid, uid)
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
        return await asyncio.to_thread(self._create_sync, spec)

    def _create_sync(self, spec: SandboxSpec) -> BwrapSandbox:
        workdir = posixpath.normpath(spec.workdir)
        if not workdir.startswith("/") or workdir.startswith("//"):
            raise SandboxError(f"workdir {spec.workdir!r} must be an absolute path")
        if any(workdir == f or (f != "/" and workdir.startswith(f + "/")) for f in _FORBIDDEN_WORKDIRS):
            raise SandboxError(f"workdir {spec.workdir!r} would shadow a system directory; use e.g. /workspace")
        _ensure_root(self.root)
        sid = new_sandbox_id(self.name)
        base = os.path.join(self.root, sid)
        try:
            os.mkdir(base, 0o711)
            with open(os.path.join(base, "owner.json"), "w") as f:
                json.dump({"label": LABEL, OWNER_LABEL: owner_tag(), "pid": os.getpid(),
                           "start": _proc_start_time(os.getpid())}, f)
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
            "--bind", os.path.join(base, "work"), workdir,
            "--chdir", workdir, "--remount-ro", "/", "--clearenv",
        ]
        env = {"PATH": SANDBOX_PATH, "HOME": workdir, "LANG": "C.UTF-8", "USER": SANDBOX_USER,
               "LOGNAME": SANDBOX_USER, "TMPDIR": "/tmp", **spec.env}
        for key, value in env.items():  # set by bwrap inside: nothing of spec.env reaches a process run as root
            argv += ["--setenv", key, value]
        argv.append("--")
        box = BwrapSandbox(spec, sid, self.root, cg, argv, self._setpriv)
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
        return start is None or start == _proc_start_time(pid)

    def _owner_alive(self, sid: str) -> bool | None:
        """True/False, or None when it cannot be told (another host's owner tag)."""
        host, pid, start = self._owner(sid)
        if host is not None and host != os.uname().nodename:
            return None
        if pid is None:
            return None
        if not _pid_alive(pid):
            return False
        return start is None or _proc_start_time(pid) == start

    def live(self) -> list[str]:
        return sorted(sid for sid in self._names() if self._owned_by_me(sid))

    def reap(self, *, all_owners: bool = False) -> int:
        count = 0
        for sid in sorted(self._names()):
            if not all_owners and self._owner_alive(sid) is not False:
                continue
            with _OPEN_LOCK:
                box = _OPEN.pop(sid, None)
            if box is not None:
                box._closed = True
            _destroy_resources(self.root, sid)
            count += 1
        return count
