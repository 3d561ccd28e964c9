"""The virtual environment a foreign framework runs in: made by relax-gym on first use (and kept), or named by the user.

Made: ``$RELAX_GYM_CACHE/interop/<scheme>-<key>`` (default cache ``~/.cache/relax-gym``), where ``key`` hashes the
framework's pinned requirements, :data:`SERVER_REQUIREMENTS` and the interpreter's version, so a new pin makes a new
venv and never alters a kept one. It is built under a file lock (env workers in several processes may ask at once),
with this interpreter's ``venv`` module and pip from the package index; ``relax-gym-venv.json`` is written last and
marks it complete (a folder without it is an interrupted build, removed and built again). pip's output goes to
``<folder>.pip.log``, which a failed build's error names.

Named: ``venv=`` (an env kwarg) or ``RELAX_GYM_VENV_<SCHEME>`` (``RELAX_GYM_VENV_SKYRL_GYM``): a venv the user made,
which must import the framework and the env server's own needs; nothing is installed into it.

relax-gym itself is never installed into these venvs: the server started there finds this checkout's package on its
path (:mod:`relax_gym.envs.remote.launcher`) and needs only :data:`SERVER_REQUIREMENTS` beside the framework.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from relax_gym.envs.cache import cache_home
from relax_gym.envs.interop.frameworks import Framework
from relax_gym.envs.remote.launcher import log_tail

# what the env server and the env contract import (relax_gym.envs.remote.server, .core, .manifest), unpinned so the
# framework's own pins decide; torch, transformers and ray are not among them
SERVER_REQUIREMENTS = ("numpy", "pillow", "av", "soundfile", "gymnasium>=1.0", "pydantic>=2.6", "packaging")
SERVER_MODULES = ("numpy", "PIL", "av", "soundfile", "gymnasium", "pydantic", "packaging")
MARKER = "relax-gym-venv.json"
PIP_TIMEOUT_S = 1800.0


class FrameworkVenvError(RuntimeError):
    """A framework's venv could not be made or is not usable; the message names the venv and what to do."""


def cache_root() -> Path:
    return cache_home() / "interop"


def venv_var(fw: Framework) -> str:
    return "RELAX_GYM_VENV_" + fw.scheme.upper().replace("-", "_")


def venv_key(fw: Framework) -> str:
    text = json.dumps([list(fw.requirements), list(SERVER_REQUIREMENTS), list(sys.version_info[:2])])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def framework_python(fw: Framework, venv: str | os.PathLike | None = None) -> Path:
    """The interpreter of ``fw``'s venv: ``venv`` or the user's ``RELAX_GYM_VENV_<SCHEME>`` when given (checked),
    else the one made here (built on first use)."""
    named = venv if venv is not None else os.environ.get(venv_var(fw))
    if named:
        return _check_named(fw, Path(named).expanduser())
    return ensure_venv(fw)


def ensure_venv(fw: Framework) -> Path:
    """The made venv of ``fw`` (built now if it is not there yet); its interpreter."""
    hint = (f"Or make one yourself (pip install {' '.join(fw.requirements + SERVER_REQUIREMENTS)}) and name it with "
            f"venv=... or {venv_var(fw)}")
    return made_venv(f"{fw.scheme}-{venv_key(fw)}", fw.title, fw.requirements + SERVER_REQUIREMENTS, hint=hint,
                     record={"framework": fw.scheme, "requirements": list(fw.requirements),
                             "server_requirements": list(SERVER_REQUIREMENTS)})


# what relax-gym's sandbox packaging (relax_gym.sandbox.pyruntime) needs in a client's venv to copy from it
CLIENT_REQUIREMENTS = ("packaging", "pydantic>=2.6")


def client_venv(name: str, requirements: tuple[str, ...]) -> Path:
    """A venv holding ``requirements`` (e.g. an agent SDK or an API client whose pins are not ours) and
    :data:`CLIENT_REQUIREMENTS`, made once under the cache as ``<name>-<key>`` (the key hashes the requirements and
    the Python version); its interpreter. An agent program's packages can be copied from it
    (``AgentProgramEnv(python_venv=...)``)."""
    requirements = (*requirements, *CLIENT_REQUIREMENTS)
    key = hashlib.sha256(json.dumps([list(requirements), list(sys.version_info[:2])]).encode()).hexdigest()[:12]
    return made_venv(f"{name}-{key}", name, requirements, record={"client": name, "requirements": list(requirements)})


def made_venv(folder_name: str, title: str, requirements: tuple[str, ...], *, hint: str = "",
              record: dict | None = None) -> Path:
    """``$RELAX_GYM_CACHE/interop/<folder_name>`` with ``requirements`` pip-installed (built now, under a file lock,
    unless its marker says it is complete); its interpreter."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / folder_name
    with (root / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for that build
        if not (folder / MARKER).is_file():
            _build(folder, title, requirements, hint, record or {})
    return venv_python(folder)


def _build(folder: Path, title: str, requirements: tuple[str, ...], hint: str, record: dict) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # an interrupted build
    log_path = folder.with_name(folder.name + ".pip.log")
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"building {folder} for {title}: {' '.join(requirements)}\n")
        log.flush()
        try:
            subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, stdout=log, stderr=subprocess.STDOUT,
                           timeout=300)
            subprocess.run([str(venv_python(folder)), "-m", "pip", "install", "--disable-pip-version-check",
                            "--no-input", *requirements],
                           check=True, stdout=log, stderr=subprocess.STDOUT, timeout=PIP_TIMEOUT_S,
                           env={**os.environ, "PIP_NO_INPUT": "1"})
            freeze = subprocess.run([str(venv_python(folder)), "-m", "pip", "freeze", "--all"], check=True,
                                    capture_output=True, text=True, timeout=300).stdout.split()
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise FrameworkVenvError(
                f"could not make the {title} venv {folder} ({_why(exc)}); pip's log: {log_path}\n{log_tail(log_path, 12)}"
                + (f"\n{hint}" if hint else "")) from None
    record = {**record, "python": sys.version.split()[0], "built_s": round(time.monotonic() - started, 1),
              "packages": freeze}
    (folder / MARKER).write_text(json.dumps(record, indent=1) + "\n")


def _check_named(fw: Framework, venv: Path) -> Path:
    python = venv_python(venv) if venv.is_dir() else venv
    if not python.is_file() or not os.access(python, os.X_OK):
        raise FrameworkVenvError(f"{fw.title} venv {venv}: no Python interpreter at {python}")
    probe = ("import importlib.util, sys\n"
             f"missing = [m for m in {[fw.module, *SERVER_MODULES]!r} if importlib.util.find_spec(m) is None]\n"
             "print(' '.join(missing))")
    try:
        out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=True).stdout.split()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise FrameworkVenvError(f"{fw.title} venv {venv}: its interpreter {python} does not run ({_why(exc)})") from None
    if out:
        raise FrameworkVenvError(f"{fw.title} venv {venv} cannot import {', '.join(out)}: install "
                                 f"{' '.join(fw.requirements + SERVER_REQUIREMENTS)} into it, or leave venv unset "
                                 f"and relax-gym makes one")
    return python


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{Path(str(exc.cmd[0])).name} {' '.join(map(str, exc.cmd[1:3]))} exited with status {exc.returncode}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"{' '.join(map(str, exc.cmd[1:3]))} ran past {exc.timeout:.0f} s"
    return f"{type(exc).__name__}: {exc}"

