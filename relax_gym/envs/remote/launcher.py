"""Start (and stop) the env server of a manifest whose ``[server]`` table names an interpreter.

``relax_gym.make(ID)`` for such a manifest calls :func:`served_env`: the first call in a process starts
``<python> -m relax_gym.envs.remote.server ID --manifest <env.toml> --port 0 ...`` as a child process, waits until
it has written its URL to a ready file, and every env of that manifest made in this process with the same kwargs
shares it. The kwargs ``make`` received (a recipe's ``env.kwargs``, say) are the trainer's own: they are written to a
file the child reads at startup (``--kwargs-file``) and apply to every session of that child, which, like any env
server, takes no constructor kwargs from its clients. Other kwargs (an eval split) get a server of their own. The child:

- binds a free loopback port and needs a random token (passed in its environment, never on its command line);
- finds relax_gym in its own environment if installed there, and otherwise this process's copy (its folder is
  appended to the child's ``sys.path``, so the child's interpreter still needs relax_gym's dependencies);
- writes its stdout and stderr to ``$RELAX_GYM_CACHE/env-servers/<id>-<parent pid>.log`` (default cache:
  ``~/.cache/relax-gym``), which every startup error names;
- is stopped when this process exits (and stops by itself when this process is gone).
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import relax_gym
from relax_gym.envs.cache import cache_home
from relax_gym.envs.manifest import EnvManifest, ManifestError, load_manifest
from relax_gym.envs.remote.client import RemoteEnv
from relax_gym.envs.remote.access import TOKEN_VAR
from relax_gym.envs.remote.wire import encode_value
from relax_gym.watchdog import guard

# Runs in the child: its own relax_gym if it has one, else ours (appended, so its own packages come first). A spec
# without an origin is a namespace package (e.g. a folder of data files left by an editable install), not relax_gym.
_BOOTSTRAP = """\
import importlib.util, sys
_spec = importlib.util.find_spec("relax_gym")
if _spec is None or _spec.origin is None:
    sys.path.append({root!r})
from {module} import main
sys.exit(main(sys.argv[1:]))
"""


def bootstrap(module: str) -> str:
    """``python -c`` code that runs ``module``'s ``main(argv)`` with the child's own relax_gym, else this one's."""
    return _BOOTSTRAP.format(root=str(Path(relax_gym.__file__).resolve().parent.parent), module=module)


class ServerStartError(RuntimeError):
    """The env server of a manifest did not start; the message names its log file."""


@dataclass
class ServerProcess:
    env_id: str
    manifest: Path
    kwargs: dict[str, Any]  # the constructor kwargs of every session (over the manifest's), fixed at startup
    python: Path
    process: subprocess.Popen
    url: str
    token: str
    log_path: Path
    workdir: Path
    owner_pid: int

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout_s: float = 5.0) -> None:
        if os.getpid() != self.owner_pid:  # a forked child shares the parent's server: never stop it from there
            return
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_servers: dict[tuple[str, str], ServerProcess] = {}  # (manifest path, its kwargs as JSON) -> its server
_lock = threading.Lock()


def log_dir() -> Path:
    return cache_home() / "env-servers"


def served_env(*, relax_manifest: str, **kwargs: Any) -> RemoteEnv:
    """gymnasium's entry point for a ``[server]`` manifest: a client env of its server (started here if needed).
    ``kwargs``: the caller's env kwargs (the manifest's own are applied on the server) and ``remote_*`` options.
    A ``url`` server gets the env kwargs as a client's (it refuses those its operator did not allow); a server started
    here gets them at startup (see the module docstring), so they are never sent as a client's."""
    path = Path(relax_manifest)
    m = load_manifest(path)
    spec = m.server
    if spec is None:
        raise ManifestError(path, "has no [server] table", field="server")
    kwargs.setdefault("remote_media", spec.media)
    if spec.url:
        kwargs.setdefault("remote_token", os.environ.get(spec.token_env))
        return RemoteEnv(spec.url, spec.env_id or m.id, **kwargs)
    client = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("remote_") or k == "render_mode"}
    server = ensure_server(path, m, kwargs)
    client["remote_token"] = server.token
    return RemoteEnv(server.url, m.id, **client)


def ensure_server(path: Path, manifest: EnvManifest | None = None, kwargs: dict[str, Any] | None = None) -> ServerProcess:
    """The running server of this manifest with these constructor kwargs in this process, started if there is none
    (or it died)."""
    kwargs = encode_value(dict(kwargs or {}))  # what the child will read back (as a client's kwargs would travel)
    key = (os.path.abspath(path), json.dumps(kwargs, sort_keys=True))
    with _lock:
        known = _servers.get(key)
        if known is not None and known.alive():
            return known
        m = manifest or load_manifest(path)
        server = _start(Path(key[0]), m, kwargs)
        _servers[key] = server
        return server


def stop_all() -> None:
    with _lock:
        servers = list(_servers.values())
        _servers.clear()
    for s in servers:
        s.stop()


atexit.register(stop_all)


def _start(path: Path, m: EnvManifest, kwargs: dict[str, Any]) -> ServerProcess:
    python = m.server.interpreter(path.parent)
    field = "server.python" if m.server.python else "server.venv"
    if not python.is_file() or not os.access(python, os.X_OK):
        raise ManifestError(path, f"no Python interpreter at {python}", field=field)
    logs = log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{m.id}-{os.getpid()}.log"
    workdir = Path(tempfile.mkdtemp(prefix=f"relax-gym-env-{m.id}-"))
    ready = workdir / "ready.json"
    token = secrets.token_hex(16)
    cmd = [str(python), "-c", bootstrap("relax_gym.envs.remote.server"), m.id, "--manifest", str(path), "--host", "127.0.0.1",
           "--port", "0", "--ready-file", str(ready), "--spool", str(workdir / "spool"), "--parent-pid", str(os.getpid())]
    if kwargs:  # in a file of the private workdir, not on the command line (kwargs may hold credentials)
        kwargs_file = workdir / "kwargs.json"
        kwargs_file.write_text(json.dumps(kwargs))
        cmd += ["--kwargs-file", str(kwargs_file)]
    env = {**os.environ, TOKEN_VAR: token, "PYTHONUNBUFFERED": "1"}
    with log_path.open("ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {python} -m relax_gym.envs.remote.server {m.id}"
                  f"{' with kwargs ' + ', '.join(sorted(kwargs)) if kwargs else ''}\n".encode())
        log.flush()
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    guard(process)
    why = wait_ready(process, ready, m.server.startup_timeout_s)
    if why is not None:
        shutil.rmtree(workdir, ignore_errors=True)
        raise ServerStartError(f"the env server of {path} ({python}) {why} ([server] startup_timeout_s); its log: "
                               f"{log_path}\n{log_tail(log_path)}")
    url = json.loads(ready.read_text())["url"]
    return ServerProcess(m.id, path, kwargs, python, process, url, token, log_path, workdir, os.getpid())


def wait_ready(process: subprocess.Popen, ready: Path, timeout_s: float) -> str | None:
    """Wait until a started server writes its ready file: None, or why it will not (it exited, killed here when it
    was not ready within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while not ready.is_file():
        code = process.poll()
        if code is not None:
            return f"exited with status {code}"
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            return f"was not ready after {timeout_s:.0f} s"
        time.sleep(0.02)
    return None


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` of a log file, indented for an error message ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("  | " + line for line in text[-lines:])
