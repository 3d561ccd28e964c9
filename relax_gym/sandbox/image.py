"""Build the docker backend's base image without a registry.

The image is a tarball of the host's own Debian ``python3.11`` (interpreter + standard library), ``bash``,
``busybox-static`` (``sh`` and the usual command-line tools as applet links) and every shared library ``ldd`` lists
for them, imported with ``docker import``. Nothing is downloaded, so it works on a machine that cannot reach a
registry; it needs the Debian packages ``python3.11`` and ``busybox-static`` on the host.

``build_base_image()`` is idempotent (a tag that exists is kept unless ``force``) and serialised across threads and
processes, so many sandboxes asking for a missing image at once build it once.
"""

from __future__ import annotations

import fcntl
import io
import os
import re
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from relax_gym.sandbox.base import SandboxError
from relax_gym.sandbox.spec import DEFAULT_IMAGE

PYTHON = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
BUSYBOX_CANDIDATES = ("/usr/bin/busybox", "/bin/busybox")
BASH = "/bin/bash"
SANDBOX_USER = ("sandbox", 1000, 1000)
IMAGE_LABEL = "relax-gym.image"  # on every image this module builds (not LABEL.*: containers inherit image labels)
INSTALL_HINT = "apt-get install python3.11 busybox-static"

# Parts of the standard library a sandbox never needs (tests, GUI, pip bootstrap; config-3.11-*, the build
# configuration for compiling extensions, is skipped too).
_SKIP_STDLIB = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
# The stdlib's bytecode (Debian compiles it on install) is kept, the -O / -OO variants are not: the sandbox user
# cannot write /usr/lib, so without it every sandboxed python compiles what it imports, each time (an agent
# program's `import openai, asyncio, json`: 0.72 s of CPU without, 0.40 s with; ~12 MB more image)
_SKIP_FILES = re.compile(r"\.opt-\d\.pyc$")
# Applets that make no sense without privileges; everything else busybox offers becomes a link in /usr/bin.
_SKIP_APPLETS = {
    "busybox", "init", "linuxrc", "su", "login", "sulogin", "passwd", "getty", "halt", "reboot", "poweroff",
}
_ENV = "PATH=/usr/local/bin:/usr/bin:/bin"
_build_lock = threading.Lock()


def _client(client=None):
    if client is not None:
        return client
    try:
        import docker
    except ImportError as e:  # pragma: no cover - the SDK is a dependency of the docker backend
        raise SandboxError("the docker SDK is not installed: pip install docker") from e
    try:
        return docker.from_env(timeout=120)
    except docker.errors.DockerException as e:
        raise SandboxError(f"no Docker engine answers: {e}") from e


def image_exists(tag: str = DEFAULT_IMAGE, client=None) -> bool:
    """True when the engine has an image called ``tag``."""
    import docker

    try:
        _client(client).images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _image_id(client, tag: str) -> str:
    return client.images.get(tag).id


def build_base_image(tag: str = DEFAULT_IMAGE, *, client=None, force: bool = False) -> str:
    """Build ``tag`` from the host's python3.11 + busybox and return the image id (existing one unless ``force``)."""
    client = _client(client)
    if not force and image_exists(tag, client):
        return _image_id(client, tag)
    missing = [p for p in (PYTHON, STDLIB, BASH) if not os.path.exists(p)]
    if _busybox() is None:
        missing.append(" or ".join(BUSYBOX_CANDIDATES))
    if missing:
        raise SandboxError(
            f"cannot build the sandbox image {tag!r}: the host lacks {', '.join(missing)}; {INSTALL_HINT}"
        )
    # One build at a time, in this process (threads) and across processes (a lock file).
    lock_path = Path(tempfile.gettempdir()) / f"relax-gym-image-{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}.lock"
    with _build_lock, open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            old_id = _image_id(client, tag) if image_exists(tag, client) else None
            if old_id and not force:
                return old_id
            new_id = _build(tag, client)
            if old_id and old_id != new_id:
                try:  # the replaced image is untagged now; drop it unless a container still uses it
                    client.images.remove(old_id)
                except Exception:
                    pass
            return new_id
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _build(tag: str, client) -> str:
    repository, _, version = tag.rpartition(":")
    if not repository or "/" in version:  # "name" or "host:5000/name" without a tag
        repository, version = tag, "latest"
    with tempfile.TemporaryDirectory(prefix="relax-gym-image-") as tmp:
        tar_path = os.path.join(tmp, "rootfs.tar")
        info = write_rootfs_tar(tar_path)
        changes = [
            f"ENV {_ENV}",
            "WORKDIR /workspace",
            f'LABEL {IMAGE_LABEL}="sandbox-base" {IMAGE_LABEL}.python="{info["python"]}" '
            f'{IMAGE_LABEL}.built="{time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}"',
        ]
        try:
            client.api.import_image(src=tar_path, repository=repository, tag=version, changes=changes)
        except Exception as e:
            raise SandboxError(f"docker import of the sandbox image {tag!r} failed: {e}") from e
    try:
        return _image_id(client, tag)
    except Exception as e:
        raise SandboxError(f"docker import of {tag!r} reported success but the image is not there: {e}") from e


# ---------------------------------------------------------------------------------------------- rootfs


class _RootfsTar:
    """Writes a root filesystem into a tar: host files keep their path (and symlink structure), owners are numeric."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.seen: set[str] = set()

    def _info(self, name: str, type_: bytes, mode: int, uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
        ti = tarfile.TarInfo(name.lstrip("/"))
        ti.type, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname, ti.mtime = type_, mode, uid, gid, "", "", int(time.time())
        return ti

    def mkdir(self, path: str, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        path = path.rstrip("/") or "/"
        if path == "/" or path in self.seen:
            return
        self.mkdir(os.path.dirname(path))
        self.seen.add(path)
        self.tar.addfile(self._info(path, tarfile.DIRTYPE, mode, uid, gid))

    def symlink(self, path: str, target: str) -> None:
        if path in self.seen:
            return
        self.mkdir(os.path.dirname(path))
        self.seen.add(path)
        ti = self._info(path, tarfile.SYMTYPE, 0o777)
        ti.linkname = target
        self.tar.addfile(ti)

    def data(self, path: str, payload: bytes, mode: int = 0o644) -> None:
        self.mkdir(os.path.dirname(path))
        self.seen.add(path)
        ti = self._info(path, tarfile.REGTYPE, mode)
        ti.size = len(payload)
        self.tar.addfile(ti, io.BytesIO(payload))

    def host_path(self, path: str) -> str:
        """Add host ``path`` resolving symlinks component by component (each link is reproduced); returns the
        real path of the final file, which is added as a regular file (set-id bits stripped)."""
        parts = [p for p in path.split("/") if p]
        current = "/"
        hops = 0
        while parts:
            nxt = os.path.join(current, parts.pop(0))
            if os.path.islink(nxt):
                target = os.readlink(nxt)
                self.symlink(nxt, target)
                resolved = os.path.normpath(os.path.join(current, target))
                parts = [p for p in resolved.split("/") if p] + parts
                current = "/"
                hops += 1
                if hops > 40:
                    raise SandboxError(f"symlink loop at {path}")
                continue
            current = nxt
        self.file(current)
        return current

    def file(self, real: str) -> None:
        if real in self.seen:
            return
        self.mkdir(os.path.dirname(real))
        self.seen.add(real)
        st = os.lstat(real)
        ti = self._info(real, tarfile.REGTYPE, st.st_mode & 0o755)
        ti.size = st.st_size
        ti.mtime = int(st.st_mtime)
        with open(real, "rb") as f:
            self.tar.addfile(ti, f)

    def tree(self, top: str, skip: set[str], skip_files: re.Pattern[str] | None = None) -> list[str]:
        """Add a host directory tree but its ``skip`` folders and the files ``skip_files`` matches (no symlink
        following; links that leave the tree, such as Debian's ``sitecustomize.py`` into /etc, are dropped);
        returns the shared objects found in it."""
        objects = []
        inside = os.path.realpath(top) + "/"
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d not in skip and not d.startswith("config-"))
            self.mkdir(root)
            for name in sorted(files):
                if skip_files is not None and skip_files.search(name):
                    continue
                full = os.path.join(root, name)
                if os.path.islink(full):
                    if os.path.realpath(full).startswith(inside):
                        self.symlink(full, os.readlink(full))
                elif os.path.isfile(full):
                    self.file(full)
                    if name.endswith(".so"):
                        objects.append(full)
            for d in dirs:
                full = os.path.join(root, d)
                if os.path.islink(full) and os.path.realpath(full).startswith(inside):
                    self.symlink(full, os.readlink(full))
        return objects


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def shared_libraries(binaries: list[str]) -> set[str]:
    """Every library (and the dynamic loader) ``ldd`` lists for ``binaries``."""
    libs: set[str] = set()
    for chunk in range(0, len(binaries), 64):
        proc = subprocess.run(["ldd", *binaries[chunk : chunk + 64]], capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if "not found" in line:
                raise SandboxError(f"ldd cannot resolve a library of the sandbox image: {line.strip()}")
            m = _LDD_LINE.search(line)
            if m:
                libs.add(m.group(1))
    return libs


def _busybox() -> str | None:
    return next((p for p in BUSYBOX_CANDIDATES if os.access(p, os.X_OK)), None)


def _applets(busybox: str) -> list[str]:
    proc = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    return [a for a in proc.stdout.split() if a and "/" not in a and a not in _SKIP_APPLETS]


def write_rootfs_tar(tar_path: str) -> dict[str, str]:
    """Write the sandbox root filesystem to ``tar_path`` (uncompressed); returns facts about it."""
    version = subprocess.run([PYTHON, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    user, uid, gid = SANDBOX_USER
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        fs = _RootfsTar(tar)
        for d in ("/proc", "/sys", "/dev", "/etc", "/usr/local/bin", "/root"):
            fs.mkdir(d, 0o700 if d == "/root" else 0o755)
        fs.mkdir("/tmp", 0o1777)
        fs.mkdir("/workspace", 0o755, uid, gid)
        python = fs.host_path(PYTHON)
        fs.host_path(BASH)
        busybox = _busybox()
        if busybox is None:
            raise SandboxError(f"busybox not found at {' or '.join(BUSYBOX_CANDIDATES)}; {INSTALL_HINT}")
        busybox = fs.host_path(busybox)
        binaries = [python, os.path.realpath(BASH), busybox]  # busybox is static in busybox-static; ldd is harmless
        binaries += fs.tree(STDLIB, _SKIP_STDLIB, _SKIP_FILES)
        for lib in sorted(shared_libraries(binaries)):
            fs.host_path(lib)
        for name in ("python3", "python"):
            fs.symlink(f"{os.path.dirname(python)}/{name}", os.path.basename(python))
        # Applets next to busybox (/usr/bin), and in /usr/bin and /bin when those are real directories on this host
        # (no merged /usr), so both /bin/sh and /usr/bin/env exist.
        bindirs = dict.fromkeys(os.path.realpath(d) for d in (os.path.dirname(busybox), "/usr/bin", "/bin"))
        for applet in _applets(busybox):
            for bindir in bindirs:
                if f"{bindir}/{applet}" not in fs.seen:
                    fs.symlink(f"{bindir}/{applet}", busybox)
        passwd = f"root:x:0:0:root:/root:/bin/sh\n{user}:x:{uid}:{gid}:{user}:/workspace:/bin/sh\n"
        fs.data("/etc/passwd", passwd.encode())
        fs.data("/etc/group", f"root:x:0:\n{user}:x:{gid}:\n".encode())
        for name in ("hosts", "hostname", "resolv.conf"):  # docker mounts over these
            fs.data(f"/etc/{name}", b"")
        fs.data("/etc/os-release", b'NAME="relax-gym sandbox"\nID=relax-gym\n')
    return {"python": version}


def main(argv: list[str] | None = None) -> int:
    """``python -m relax_gym.sandbox.image [--force] [TAG]``: build the sandbox base image."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("tag", nargs="?", default=DEFAULT_IMAGE)
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    image_id = build_base_image(args.tag, force=args.force)
    print(f"{args.tag} {image_id} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
