"""Let a sandbox without a network reach one HTTP endpoint on the host's loopback, through a Unix socket.

A sandbox has no network interface but ``lo``, so it cannot connect to a server on the host. :class:`SocketBridge`
listens on a Unix socket in a private directory on the host and forwards every connection, byte for byte, to one
loopback TCP address (an inference server). That directory is bind-mounted read-only into the sandbox (a Unix
socket can be connected through a read-only mount), and inside the sandbox ``forward_in_sandbox.py`` (stdlib only,
run by the sandbox's own python) listens on the sandbox's loopback and forwards each connection to the socket, so an
agent program talks plain HTTP to ``http://127.0.0.1:8765``. The sandbox still has no route anywhere: the socket
reaches exactly one host port, chosen by the trusted side, and the target must be a loopback address.

The other way, :class:`SocketPort` lets the host reach a server that runs in such a sandbox (an OpenEnv env's
image): the forwarder (``--expose``) listens on a Unix socket in a directory the host mounted writable and dials
the server on the sandbox's loopback; on the host a loopback TCP port dials that socket. The sandbox gains no
route: it only answers connections the host makes.

Recipe, with ``import openai`` from :mod:`relax_gym.sandbox.pyruntime`::

    bridge = shared_bridge("127.0.0.1", server_port)        # one per target per process, closed at exit
    site = python_packages_dir(["openai"])
    spec = SandboxSpec(mounts=(*bridge_mounts(bridge), runtime_mount(site)))
    # bridge dir -> /run/relax (ro), forwarder -> /opt/relax/bin (ro), packages -> /opt/relax/site (ro)
    argv = bridged_command(["python3", "agent.py"],
                           env={**runtime_env(site), "OPENAI_BASE_URL": "http://127.0.0.1:8765/v1"})
    # python3 -I -S /opt/relax/bin/forward_in_sandbox.py --socket /run/relax/api.sock --listen 127.0.0.1:8765
    #     --env PYTHONPATH=/opt/relax/site --env LD_LIBRARY_PATH=... --env OPENAI_BASE_URL=... -- python3 agent.py
    result = await box.exec(argv)
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import selectors
import shutil
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from relax_gym.sandbox.forward_in_sandbox import (  # the same copying code runs on both sides
    shut,
    splice,
)
from relax_gym.sandbox.spec import Mount

log = logging.getLogger(__name__)

SOCKET_DIR_IN_SANDBOX = "/run/relax"  # where bridge_mounts() shows the bridge's directory
BIN_DIR_IN_SANDBOX = "/opt/relax/bin"  # where bridge_mounts() shows the forwarder script
DEFAULT_LISTEN_PORT = 8765  # the sandbox-side loopback port of the forwarder
SCRIPT_NAME = "forward_in_sandbox.py"
CONNECT_TIMEOUT_S = 10.0
BACKLOG = 128
MAX_CONNECTIONS = 256  # open at once per bridge (each costs two host threads); more are closed at once


def forwarder_script_path() -> Path:
    """The stdlib-only forwarder shipped in this package (``forward_in_sandbox.py``)."""
    return Path(__file__).with_name(SCRIPT_NAME)


def check_loopback(host: str) -> str:
    """``host`` if it is a loopback address (127.0.0.0/8, ::1) or ``localhost``; anything else is a ValueError."""
    if host == "localhost":
        return host
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"bridge target {host!r} is not a loopback address (127.0.0.0/8, ::1 or 'localhost')") from None
    if not addr.is_loopback:
        raise ValueError(f"bridge target {host!r} is not a loopback address (127.0.0.0/8, ::1 or 'localhost')")
    return host


def _private_dir(prefix: str) -> str:
    """A fresh directory under the system temp dir, 0755 (readable by the sandbox uid, writable by us only)."""
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o755)
    return path


class _Relay:
    """Accepts on ``listener`` and splices each connection, byte for byte, to a new one from :meth:`_dial`.

    One thread accepts; each connection gets two copying threads, and either side's EOF is passed on as a
    half-close; beyond ``max_connections`` open at once a new one is closed at once. ``close()`` is idempotent: it
    stops accepting and cuts open connections."""

    def __init__(self, listener: socket.socket, max_connections: int, thread_name: str) -> None:
        self.max_connections = max_connections
        self._listener = listener
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._clients = 0  # connections being served (each holds a client socket and, once connected, an upstream)
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)
        self._thread.start()

    def _dial(self) -> socket.socket:
        raise NotImplementedError

    def _cleanup(self) -> None:
        """What a relay removes after it stopped (its socket's directory, say)."""

    @property
    def closed(self) -> bool:
        return self._closed

    def _serve(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        sel.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closed:
                for key, _ in sel.select():
                    if key.fileobj is self._wake_r:
                        return
                    try:
                        client, _ = self._listener.accept()
                    except OSError as e:  # e.g. out of descriptors: let some be freed rather than spin
                        log.debug("%r: accept failed: %s", self, e)
                        time.sleep(0.05)
                        continue
                    threading.Thread(target=self._handle, args=(client,), daemon=True,
                                     name="relax-gym-bridge-conn").start()
        finally:
            sel.close()

    def _track(self, sock: socket.socket, new_client: bool = False) -> bool:
        with self._lock:
            if self._closed:
                return False
            if new_client:
                if self._clients >= self.max_connections:
                    log.warning("%r: %d connections open; refusing another", self, self._clients)
                    return False
                self._clients += 1
            self._conns.add(sock)
            return True

    def _handle(self, client: socket.socket) -> None:
        upstream = None
        counted = False
        try:
            counted = self._track(client, new_client=True)
            if not counted:
                return
            try:
                upstream = self._dial()
            except OSError as e:
                log.debug("%r: cannot reach the target: %s", self, e)
                return
            upstream.settimeout(None)
            if not self._track(upstream):
                return
            splice(client, upstream)
        finally:
            with self._lock:
                self._clients -= counted
                self._conns.discard(client)
                if upstream is not None:
                    self._conns.discard(upstream)
            client.close()
            if upstream is not None:
                upstream.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._conns:  # under the lock: a handler closes its sockets only after dropping them here
                shut(conn, socket.SHUT_RDWR)  # their threads see EOF / errors and close them
            self._conns.clear()
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)
        self._listener.close()
        self._cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SocketBridge(_Relay):
    """Unix socket ``<directory>/<name>.sock`` -> TCP ``target_host:target_port`` (loopback only): a sandbox reaches
    one server on the host.

    The directory is a fresh private temp dir (0755) holding only the socket (0666), so the sandbox uid can connect
    through a read-only bind mount of it. ``close()`` also removes the directory."""

    def __init__(self, target_host: str, target_port: int, name: str = "api",
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.target_host = check_loopback(target_host)
        if not (isinstance(target_port, int) and 0 < target_port < 65536):
            raise ValueError(f"bridge target port {target_port!r} is not a TCP port")
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bridge name {name!r} must be a plain file name")
        self.target_port = target_port
        self.owner_pid = os.getpid()  # a forked child's exit must not remove its parent's socket
        self.directory = _private_dir("relax-gym-bridge-")
        self.socket_path = os.path.join(self.directory, f"{name}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.socket_path)
            os.chmod(self.socket_path, 0o666)
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            shutil.rmtree(self.directory, ignore_errors=True)
            raise
        super().__init__(listener, max_connections, f"relax-gym-bridge-{target_port}")

    def __repr__(self) -> str:
        return f"SocketBridge({self.socket_path} -> {self.target_host}:{self.target_port})"

    def _dial(self) -> socket.socket:
        return socket.create_connection((self.target_host, self.target_port), timeout=CONNECT_TIMEOUT_S)

    def _cleanup(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class SocketPort(_Relay):
    """TCP ``127.0.0.1:<port>`` (a free port) -> Unix socket ``socket_path``: the host reaches a server in a sandbox
    with no network, whose ``forward_in_sandbox.py --expose`` listens on that socket (in a directory the host made
    and mounted writable). ``url`` is ``http://127.0.0.1:<port>``; ``close()`` leaves the socket's directory to
    its owner."""

    def __init__(self, socket_path: str, host: str = "127.0.0.1", max_connections: int = MAX_CONNECTIONS) -> None:
        self.socket_path = socket_path
        family = socket.AF_INET6 if ":" in check_loopback(host) else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((host, 0))
            listener.listen(BACKLOG)
        except BaseException:
            listener.close()
            raise
        self.host, self.port = host, listener.getsockname()[1]
        super().__init__(listener, max_connections, f"relax-gym-port-{self.port}")

    @property
    def url(self) -> str:
        return f"http://{'[' + self.host + ']' if ':' in self.host else self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"SocketPort({self.host}:{self.port} -> {self.socket_path})"

    def _dial(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.connect(self.socket_path)
        except BaseException:
            sock.close()
            raise
        return sock


_shared: dict[tuple[str, int], SocketBridge] = {}
_shared_lock = threading.Lock()
_forwarder_dir: tuple[str, int] | None = None  # (path, pid of the process that made it)


def shared_bridge(target_host: str, target_port: int) -> SocketBridge:
    """One bridge per target per process (a new one if the last was closed); all are closed at exit."""
    key = (check_loopback(target_host), int(target_port))
    with _shared_lock:
        bridge = _shared.get(key)
        if bridge is None or bridge.closed:
            bridge = _shared[key] = SocketBridge(*key)
        return bridge


def forwarder_dir() -> str:
    """A private 0755 directory (per process, removed at exit) holding only a copy of the forwarder script: a mount
    source the sandbox uid can always reach, which the installed package (e.g. under a 0700 home) may not be."""
    global _forwarder_dir
    with _shared_lock:
        if _forwarder_dir is None or not os.path.isfile(os.path.join(_forwarder_dir[0], SCRIPT_NAME)):
            path = _private_dir("relax-gym-forwarder-")
            dst = os.path.join(path, SCRIPT_NAME)
            shutil.copyfile(forwarder_script_path(), dst)
            os.chmod(dst, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
            _forwarder_dir = (path, os.getpid())
        return _forwarder_dir[0]


def _close_shared() -> None:
    me = os.getpid()
    with _shared_lock:
        bridges = [b for b in _shared.values() if b.owner_pid == me]
        _shared.clear()
        path = _forwarder_dir[0] if _forwarder_dir and _forwarder_dir[1] == me else None
    for bridge in bridges:
        try:
            bridge.close()
        except Exception as e:  # noqa: BLE001 - best effort at interpreter exit
            log.debug("closing %r at exit: %s", bridge, e)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(_close_shared)


def bridge_mounts(bridge: SocketBridge, socket_dir: str = SOCKET_DIR_IN_SANDBOX,
                  bin_dir: str = BIN_DIR_IN_SANDBOX) -> tuple[Mount, Mount]:
    """Read-only mounts for ``SandboxSpec.mounts``: the bridge's directory at ``socket_dir`` and the forwarder
    script's directory at ``bin_dir``."""
    return (Mount(source=bridge.directory, target=socket_dir), Mount(source=forwarder_dir(), target=bin_dir))


def bridged_command(cmd_argv: Sequence[str], socket_in_sandbox: str | None = None,
                    listen_port: int = DEFAULT_LISTEN_PORT, *, socket_name: str = "api",
                    script_in_sandbox: str = f"{BIN_DIR_IN_SANDBOX}/{SCRIPT_NAME}", listen_host: str = "127.0.0.1",
                    env: Mapping[str, str] | None = None, python: str = "python3",
                    env_file: str | None = None) -> list[str]:
    """The argv that runs ``cmd_argv`` inside a sandbox with ``http://<listen_host>:<listen_port>`` forwarded to
    the bridge's socket (default ``/run/relax/<socket_name>.sock``); ``env`` is added to the command's environment.
    The forwarder exits with the command's exit status."""
    if not cmd_argv:
        raise ValueError("empty command")
    sock = socket_in_sandbox or f"{SOCKET_DIR_IN_SANDBOX}/{socket_name}.sock"
    # -I -S: the forwarder needs only the standard library; a PYTHONPATH meant for the command must not shadow it
    argv = [python, "-I", "-S", script_in_sandbox, "--socket", sock, "--listen", f"{listen_host}:{int(listen_port)}"]
    for key, value in (env or {}).items():
        if not key or "=" in key:
            raise ValueError(f"bad environment variable name {key!r}")
        argv += ["--env", f"{key}={value}"]
    if env_file is not None:  # secrets: read from a file in the sandbox (then deleted), never on a command line
        argv += ["--env-file", env_file]
    return [*argv, "--", *map(str, cmd_argv)]
