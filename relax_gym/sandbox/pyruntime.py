"""Python packages for the sandbox's interpreter, copied from this environment (no index, no network).

``python_packages_dir(["openai"])`` returns a cached directory holding the installed files of those distributions
and of their whole runtime dependency closure (``Requires-Dist`` from ``importlib.metadata``, minus requirements
whose marker is false here, extras included only when asked for, e.g. ``"openai[aiohttp]"``). Mount it read-only
(:func:`runtime_mount`) and put :func:`runtime_env` in the command's environment, and the sandbox's ``python3``
imports them::

    site = python_packages_dir(["openai"])
    spec = SandboxSpec(mounts=(runtime_mount(site),), env=runtime_env(site))
    await box.exec(["python3", "-c", "import openai"])

The files are copied as they are, compiled extensions included, so the sandbox's interpreter must have the same
ABI as this one: the same ``major.minor`` (both backends use the host's Debian ``python3.11``, and the project's
environment is cp311, so binary wheels such as ``pydantic_core`` and ``jiter`` load). The tag of the copying
interpreter (``python_tag()``) is part of the cache key and recorded in ``relax-gym-runtime.json`` in the directory;
a sandbox whose python differs gets import errors, not a refusal. Shared libraries those extensions need from
outside their wheels (``libgcc_s.so.1``, glibc's ``libpthread``/``librt``/``libdl`` stubs: missing from the minimal
docker image) are copied from the host into ``.relax-libs/``, which :func:`runtime_env` puts on
``LD_LIBRARY_PATH``; the sandbox's libc must be the host's (true for bwrap and for the image that
``relax-gym sandbox build-image`` makes from the host).

The directory is built in a temporary directory next to it and renamed into place, so a reader never sees half of
one and concurrent builders (threads or processes) are safe: the first rename wins, the others discard theirs.
Cache root: ``$RELAX_GYM_CACHE`` or ``~/.cache/relax-gym``, under ``pyruntime/``. With the bwrap backend the
directory must be reachable by the sandbox uid (not under a 0700 home): bwrap mounts it after dropping privileges.
"""

from __future__ import annotations

import compileall
import functools
import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from relax_gym.sandbox.spec import Mount

SITE_IN_SANDBOX = "/opt/relax/site"
LIBS_DIR = ".relax-libs"
MANIFEST = "relax-gym-runtime.json"
FORMAT = 1
# Provided by every sandbox's own C library / loader; copying them would mix two glibcs.
_SYSTEM_LIBS = re.compile(r"^(linux-vdso|linux-gate|ld-linux[^/]*|libc|libm)\.so")


def python_tag() -> str:
    """The interpreter the copied files are built for, e.g. ``cpython-311-linux-x86_64-glibc2.36``."""
    libc, version = platform.libc_ver()
    return f"{sys.implementation.cache_tag}-{sysconfig.get_platform()}-{libc}{version}"


def cache_root() -> Path:
    """``$RELAX_GYM_CACHE/pyruntime`` (or ``~/.cache/relax-gym/pyruntime``) when every folder above it lets others
    through (a sandbox's uid must reach it to mount it); otherwise ``<tmp>/relax-gym-pyruntime-<uid>``, a folder
    this user owns that nobody else may write (a repo cloned under root's 0700 home still works with bwrap)."""
    base = os.environ.get("RELAX_GYM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "relax-gym")
    preferred = Path(base) / "pyruntime"
    if _others_can_reach(preferred) and not _others_can_write(preferred):
        return preferred
    fallback = Path(tempfile.gettempdir()) / f"relax-gym-pyruntime-{os.getuid()}"
    fallback.mkdir(mode=0o755, exist_ok=True)
    st = fallback.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"{fallback} is not a folder owned by uid {os.getuid()} and closed to other writers; "
                              "remove it or set RELAX_GYM_CACHE to a folder every user can pass through")
    return fallback


def _others_can_write(path: Path) -> bool:
    """True when another user could plant a runtime: ``path`` or its parent exists and is group/other-writable."""
    for folder in (path, path.parent):
        try:
            if folder.stat().st_mode & 0o022:
                return True
        except FileNotFoundError:
            continue
    return False


def _others_can_reach(path: Path) -> bool:
    """True when every existing folder from ``/`` down to ``path`` is searchable by other users (o+x)."""
    for folder in reversed([path, *path.parents]):
        try:
            st = folder.stat()
        except FileNotFoundError:
            return True  # made below with default permissions (0755 under the usual umask)
        if not st.st_mode & stat.S_IXOTH:
            return False
    return True


def _requirement(text: str, wanted_by: str | None) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as e:
        who = f" (required by {wanted_by})" if wanted_by else ""
        raise ValueError(f"invalid requirement {text!r}{who}: {e}") from None


def _by_import_name(name: str) -> md.Distribution:
    """The one installed distribution that provides the top-level module ``name`` (``agents`` ->
    ``openai-agents``); else a ValueError saying what to name instead."""
    providers = sorted(set(md.packages_distributions().get(name, ())))
    if len(providers) == 1:
        return md.distribution(providers[0])
    if providers:
        raise ValueError(f"the module {name!r} comes from several distributions here ({', '.join(providers)}): "
                         f"name the one the program needs")
    raise ValueError(f"{name!r} is neither a distribution nor a module installed in {sys.prefix}: name the "
                     f"distribution the program imports from (pip's name, e.g. 'openai-agents' for `import agents`)")


def distribution_closure(names: Iterable[str]) -> list[md.Distribution]:
    """The installed distributions ``names`` need at run time, themselves included, sorted by name. A name that is
    no distribution may be a module's (``yaml`` for ``pyyaml``): the distribution that provides it is taken."""
    found: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [(_requirement(n, None), None) for n in names]
    if not todo:
        raise ValueError("no distributions named")
    while todo:
        req, wanted_by = todo.pop()
        key = canonicalize_name(req.name)
        try:
            dist = found.get(key) or md.distribution(req.name)
        except md.PackageNotFoundError:
            if wanted_by is not None:
                raise ValueError(f"distribution {req.name!r} (required by {wanted_by}) is not installed in "
                                 f"{sys.prefix}") from None
            dist = _by_import_name(req.name)
            key = canonicalize_name(dist.metadata["Name"])
        found[key] = dist
        for extra in ("", *sorted(canonicalize_name(e) for e in req.extras)):
            if (key, extra) in done:
                continue
            done.add((key, extra))
            for text in dist.requires or ():
                dep = _requirement(text, key)
                if dep.marker is None or dep.marker.evaluate({"extra": extra}):
                    todo.append((dep, key))
    return [found[k] for k in sorted(found)]


def _editable(dist: md.Distribution) -> bool:
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return False
    return bool(info.get("dir_info", {}).get("editable"))


def _files(dist: md.Distribution) -> list[tuple[Path, str]]:
    """(absolute source, path relative to site-packages) of every installed file of ``dist`` under its root."""
    name = dist.metadata["Name"]
    if _editable(dist):
        raise ValueError(f"distribution {name!r} is an editable install; its files cannot be copied into a sandbox")
    root = Path(dist.locate_file("")).absolute()
    if dist.files is None:
        raise ValueError(f"distribution {name!r} has no RECORD listing its files; reinstall it with pip")
    out = []
    for entry in dist.files:
        path = Path(os.path.normpath(root / entry))
        try:
            rel = path.relative_to(root)
        except ValueError:
            continue  # scripts and data outside site-packages (../../bin/...)
        if path.is_file():
            out.append((path, rel.as_posix()))
    return out


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    executable = os.stat(dst).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.chmod(dst, 0o755 if executable else 0o644)


def _needed_libs(extension: Path) -> dict[str, str]:
    """soname -> host path of the shared libraries ``extension`` loads (as ``ldd`` resolves them here)."""
    try:
        out = subprocess.run(["ldd", str(extension)], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    libs = {}
    for line in out.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow and rest.startswith("/"):
            libs[name] = rest.split(" (", 1)[0]
    return libs


def _copy_native_libs(tree: Path, extensions: list[Path]) -> list[str]:
    """Copy into ``tree/.relax-libs`` what the extensions need beyond libc and the tree itself; the sonames."""
    inside = str(tree.resolve()) + "/"
    wanted: dict[str, str] = {}
    for ext in extensions:
        for soname, host in _needed_libs(ext).items():
            if not _SYSTEM_LIBS.match(soname) and not os.path.realpath(host).startswith(inside):
                wanted.setdefault(soname, host)
    libs = tree / LIBS_DIR
    libs.mkdir(mode=0o755, exist_ok=True)
    for soname, host in sorted(wanted.items()):
        _copy(Path(os.path.realpath(host)), libs / soname)
    return sorted(wanted)


def _chmod_dirs(tree: Path) -> None:
    for dirpath, _dirs, _files in os.walk(tree):
        os.chmod(dirpath, 0o755)


def _build(tree: Path, dists: list[md.Distribution], manifest: dict) -> None:
    extensions = []
    for dist in dists:
        for src, rel in _files(dist):
            dst = tree / rel
            _copy(src, dst)
            if dst.suffix == ".so" or ".so." in dst.name:
                extensions.append(dst)
    # pip's RECORD usually lists the .pyc files; compile what is missing (the sandbox cannot write them: ro mount)
    compileall.compile_dir(str(tree), quiet=2)
    manifest["native_libs"] = _copy_native_libs(tree, extensions)
    (tree / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    _chmod_dirs(tree)


@functools.lru_cache(maxsize=32)
def _identity(names: tuple[str, ...]) -> tuple[list[md.Distribution], list[str], str, str, str]:
    """What names a runtime: the distributions, their pins, the python tag, the digest and the folder label. Read
    once per process (walking every installed distribution's metadata costs ~25 ms, and an agent-program env asks
    for its runtime every episode)."""
    dists = distribution_closure(names)
    pins = sorted(f"{canonicalize_name(d.metadata['Name'])}=={d.version}" for d in dists)
    tag = python_tag()
    digest = hashlib.sha256(json.dumps([FORMAT, tag, pins]).encode()).hexdigest()[:16]
    label = "-".join(sorted(canonicalize_name(_requirement(n, None).name) for n in names))[:60]
    return dists, pins, tag, digest, label


# runs in another interpreter (a venv of an agent SDK whose pins are not ours): this checkout's pyruntime, there
_FOREIGN = ("import sys; sys.path.append({root!r}); from relax_gym.sandbox.pyruntime import main; "
            "sys.exit(main(sys.argv[1:]))")


def python_packages_dir(names: Iterable[str], cache_dir: str | os.PathLike | None = None,
                        python: str | os.PathLike | None = None) -> Path:
    """A cached directory of ``names`` and their runtime dependencies, copied from this environment (see the
    module docstring), or from the environment of the interpreter ``python`` (a venv's ``bin/python``: an agent
    SDK whose pins differ from ours; it must have ``packaging`` and ``pydantic``, and the sandbox's Python version).
    Raises ValueError naming a distribution that is missing, editable or unlistable."""
    names = list(names)
    if python is not None and Path(python).absolute() != Path(sys.executable).absolute():  # a venv's own python
        # (a venv's interpreter is a link to the same binary as ours: its path, not its target, names the venv)
        root = str(Path(__file__).resolve().parents[2])
        cache = str(Path(cache_dir) if cache_dir is not None else cache_root())
        run = subprocess.run([str(python), "-c", _FOREIGN.format(root=root), *names, "--cache-dir", cache],
                             capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            raise ValueError(f"copying {', '.join(names)} from {python}: "
                             f"{(run.stderr.strip().splitlines() or ['no output'])[-1]}")
        return Path(run.stdout.strip().splitlines()[-1])
    dists, pins, tag, digest, label = _identity(tuple(names))
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"{label}-{digest}"
    if (final / MANIFEST).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{label}-", dir=root))
    try:
        _build(tmp, dists, {"format": FORMAT, "python": tag, "requested": names, "distributions": pins})
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).is_file():  # not a concurrent builder that won: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def runtime_mount(path: str | os.PathLike, target: str = SITE_IN_SANDBOX) -> Mount:
    """The read-only mount of a :func:`python_packages_dir` directory at ``target``."""
    return Mount(source=str(path), target=target, read_only=True)


def runtime_env(path: str | os.PathLike | None = None, target: str = SITE_IN_SANDBOX) -> dict[str, str]:
    """``PYTHONPATH`` (and ``LD_LIBRARY_PATH`` when ``path`` has copied native libraries, or ``path`` is not
    given) for a command that should import from the directory mounted at ``target``."""
    env = {"PYTHONPATH": target}
    if path is None or any((Path(path) / LIBS_DIR).glob("*.so*")):
        env["LD_LIBRARY_PATH"] = f"{target}/{LIBS_DIR}"
    return env


def main(argv: list[str] | None = None) -> int:
    """``python -m relax_gym.sandbox.pyruntime NAME... [--cache-dir DIR]``: build (or find) the directory of NAME
    and its dependencies from this interpreter's environment and print its path."""
    import argparse

    parser = argparse.ArgumentParser(prog="relax_gym.sandbox.pyruntime", description=main.__doc__)
    parser.add_argument("names", nargs="+")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    try:
        print(python_packages_dir(args.names, args.cache_dir))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
