"""A foreign env as seen from the trainer: its adapter's env server, started in the framework's venv, and a client.

:func:`make_foreign` writes a manifest for the framework (``[server] python`` = its venv's interpreter; the entry
point its adapter) under ``$RELAX_GYM_CACHE/interop/manifests`` and hands it to
:func:`~relax_gym.envs.remote.launcher.served_env`: the first make in a process starts the server there (the
foreign id and the env kwargs are its constructor kwargs, fixed at startup), later makes with the same kwargs share
it, and it stops with this process. What goes wrong inside a foreign env comes back as the env contract's
``env_error`` status, its text naming the framework, the env and the call (:mod:`.adapter`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from relax_gym.envs.interop.frameworks import FRAMEWORKS, Framework
from relax_gym.envs.interop.openenv_image import image_url, is_image
from relax_gym.envs.interop.venvs import cache_root, framework_python
from relax_gym.envs.remote.launcher import ServerStartError, bootstrap, served_env, wait_ready
from relax_gym.envs.remote.wire import encode_value
from relax_gym.watchdog import guard


def manifest_for(fw: Framework, python: Path) -> Path:
    """The manifest that serves ``fw``'s adapter with ``python`` (written once per interpreter)."""
    text = (f"# written by relax-gym for {fw.title} envs ({', '.join(fw.requirements)}): their adapter, served from\n"
            f"# the framework's venv\n"
            f"id = {json.dumps(fw.scheme)}\n"
            f"description = {json.dumps(f'{fw.title} envs, run in their own venv')}\n"
            f"entry_point = {json.dumps(fw.adapter)}\n\n"
            f"[server]\npython = {json.dumps(str(python))}\nstartup_timeout_s = 300\n")
    folder = cache_root() / "manifests" / f"{fw.scheme}-{hashlib.sha256(str(python).encode()).hexdigest()[:12]}"
    path = folder / "env.toml"
    if not path.is_file() or path.read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def start_openenv_server(env_id: str, *, host: str = "127.0.0.1", port: int = 0, kwargs: dict[str, Any] | None = None,
                         max_sessions: int = 64, venv: str | None = None, startup_timeout_s: float = 300.0
                         ) -> tuple[subprocess.Popen, str]:
    """OpenEnv's server of our ``env_id``, started in the OpenEnv venv (made if needed): ``(process, url)`` once it
    accepts connections. The process is the caller's to stop; it logs to its stdout / stderr, which it inherits."""
    fw = FRAMEWORKS["openenv"]
    python = framework_python(fw, venv)
    workdir = Path(tempfile.mkdtemp(prefix="relax-gym-openenv-"))
    ready = workdir / "ready.json"
    cmd = [str(python), "-c", bootstrap("relax_gym.envs.interop.openenv_serve"), env_id, "--host", host,
           "--port", str(port), "--max-sessions", str(max_sessions), "--ready-file", str(ready)]
    if kwargs:
        (workdir / "kwargs.json").write_text(json.dumps(encode_value(kwargs)))
        cmd += ["--kwargs-file", str(workdir / "kwargs.json")]
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
    guard(process)
    why = wait_ready(process, ready, startup_timeout_s)
    if why is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        raise ServerStartError(f"OpenEnv's server of {env_id} ({python}) {why}")
    url = json.loads(ready.read_text())["url"]
    shutil.rmtree(workdir, ignore_errors=True)
    return process, url


def make_foreign(fw: Framework, foreign_id: str, *, venv: str | None = None, **kwargs: Any) -> Any:
    """``fw``'s env ``foreign_id`` with ``kwargs`` (the adapter's), served from ``fw``'s venv (``venv``: the user's
    own instead of the one made here); a framework with no package of its own (a protocol spoken from here) is its
    adapter, made in this process. An OpenEnv id that is no URL is a Docker image: its server runs in a docker
    sandbox first (``sandbox``: its limits, :mod:`relax_gym.envs.interop.openenv_image`) and the env is its URL."""
    if fw.scheme == "openenv":
        sandbox = kwargs.pop("sandbox", None)
        if is_image(foreign_id):
            kwargs["image"], foreign_id = foreign_id, image_url(foreign_id, sandbox)
        elif sandbox is not None:
            raise ValueError(f"openenv:{foreign_id}: sandbox= sets the limits of an image's sandbox; a URL has none")
    if not fw.requirements:
        module, _, name = fw.adapter.partition(":")
        return getattr(importlib.import_module(module), name)(foreign_id, **kwargs)
    python = framework_python(fw, venv)
    return served_env(relax_manifest=str(manifest_for(fw, python)), env_id=foreign_id, **kwargs)
