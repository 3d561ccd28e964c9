"""SocketBridge and forward_in_sandbox: a sandbox without a network reaches one HTTP server on the host's loopback
(and, with SocketPort and ``--expose``, the host reaches a server in a sandbox).

Host-side unit tests (loopback-only targets, byte-for-byte forwarding with half-close, many connections, clean
close), then on every backend: the sandbox has only ``lo``, a host loopback server cannot be reached directly, and
through the bridge it can.
"""

from __future__ import annotations

import ast
import http.server
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from relax_gym.sandbox.bridge import (
    DEFAULT_LISTEN_PORT,
    SocketBridge,
    SocketPort,
    bridge_mounts,
    bridged_command,
    forwarder_dir,
    forwarder_script_path,
    shared_bridge,
)

from .conftest import run
from .test_mounts import with_mounts

pytestmark = pytest.mark.timeout(120)


class _Echo:
    """A TCP server on 127.0.0.1 that reads a connection to EOF, then sends back b"echo:" + everything it read."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    @staticmethod
    def _one(conn: socket.socket) -> None:
        with conn:
            data = bytearray()
            while chunk := conn.recv(65536):
                data += chunk
            conn.sendall(b"echo:" + data)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def echo():
    server = _Echo()
    yield server
    server.close()


def reply(handler: http.server.BaseHTTPRequestHandler, body: bytes, content_type: str) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        reply(self, f"hello from the host, path {self.path}".encode(), "text/plain")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _roundtrip(path: str, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)  # half-close: the echo answers only after EOF, on the still-open other half
        out = bytearray()
        while chunk := s.recv(65536):
            out += chunk
        return bytes(out)


# ---------------------------------------------------------------------------------------------- host side


# not-a-connection-target: addresses the bridge must refuse before connecting (the test checks the refusal)
@pytest.mark.parametrize("host", ["10.0.0.1", "0.0.0.0", "192.168.1.2", "::", "2001:db8::1", "example.com", ""])  # not-a-connection-target
def test_non_loopback_targets_are_refused(host):
    with pytest.raises(ValueError, match="not a loopback address"):
        SocketBridge(host, 80)
    with pytest.raises(ValueError, match="not a loopback address"):
        shared_bridge(host, 80)


def test_bad_ports_and_names_are_refused():
    for port in (0, 70000, "80"):
        with pytest.raises(ValueError, match="not a TCP port"):
            SocketBridge("127.0.0.1", port)
    with pytest.raises(ValueError, match="plain file name"):
        SocketBridge("127.0.0.1", 80, name="../x")


def test_bridge_forwards_bytes_with_half_close_and_many_connections():
    echo = _Echo("127.0.0.2")
    with SocketBridge("127.0.0.2", echo.port) as bridge:  # any 127.0.0.0/8 address is loopback
        assert os.path.dirname(bridge.socket_path) == bridge.directory
        assert stat.S_IMODE(os.stat(bridge.directory).st_mode) == 0o755
        assert stat.S_IMODE(os.stat(bridge.socket_path).st_mode) == 0o666
        assert os.listdir(bridge.directory) == ["api.sock"]
        big = os.urandom(3 << 20)
        assert _roundtrip(bridge.socket_path, big) == b"echo:" + big
        with ThreadPoolExecutor(32) as pool:
            payloads = [f"connection {i}".encode() * (i + 1) for i in range(64)]
            answers = list(pool.map(lambda p: _roundtrip(bridge.socket_path, p), payloads))
        assert answers == [b"echo:" + p for p in payloads]
    echo.close()


def test_close_is_idempotent_removes_the_directory_and_cuts_connections(echo):
    bridge = SocketBridge("localhost", echo.port)
    held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held.connect(bridge.socket_path)
    held.sendall(b"partial")
    bridge.close()
    bridge.close()
    assert bridge.closed and not os.path.exists(bridge.directory)
    assert _cut(held)  # the open connection was cut (EOF, or a reset if not accepted yet), not left hanging
    held.close()


def _wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def _cut(sock: socket.socket) -> bool:
    """True when the peer closed (EOF or reset) before sending anything."""
    sock.settimeout(30)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_connections_beyond_the_limit_are_closed(echo):
    with SocketBridge("127.0.0.1", echo.port, max_connections=2) as bridge:
        held = []
        for _ in range(2):
            held.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            held[-1].connect(bridge.socket_path)
        _wait_for(lambda: bridge._clients == 2, "two connections")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
            extra.connect(bridge.socket_path)
            assert _cut(extra)
        held.pop().close()
        _wait_for(lambda: bridge._clients == 1, "a free slot")
        assert _roundtrip(bridge.socket_path, b"room again") == b"echo:room again"
        for s in held:
            s.close()


def test_a_target_that_does_not_answer_closes_the_client_connection():
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with SocketBridge("127.0.0.1", port) as bridge, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        # nothing is sent: the bridge may close the connection before a write would land (a write then fails with
        # EPIPE, which only says the same thing earlier); reading shows the close whenever it comes
        s.connect(bridge.socket_path)
        assert s.recv(65536) == b""


def test_shared_bridge_is_one_per_target(echo):
    a = shared_bridge("127.0.0.1", echo.port)
    assert shared_bridge("127.0.0.1", echo.port) is a
    a.close()
    b = shared_bridge("127.0.0.1", echo.port)
    assert b is not a and not b.closed
    assert _roundtrip(b.socket_path, b"x") == b"echo:x"


def test_forwarder_runs_the_command_and_returns_its_status(echo):
    with SocketBridge("127.0.0.1", echo.port) as bridge:
        probe = socket.create_server(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        probe.close()
        client = (
            "import socket, sys, os\n"
            f"s = socket.create_connection(('127.0.0.1', {port}))\n"
            "s.sendall(os.environ['GREETING'].encode()); s.shutdown(socket.SHUT_WR)\n"
            "print(s.makefile('rb').read().decode()); sys.exit(5)\n"
        )
        argv = bridged_command([sys.executable, "-c", client], bridge.socket_path, port, python=sys.executable,
                               script_in_sandbox=str(forwarder_script_path()), env={"GREETING": "hi there"})
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert (r.returncode, r.stdout) == (5, "echo:hi there\n"), r.stderr
    r = subprocess.run([sys.executable, "-S", str(forwarder_script_path()), "--socket", "/x", "--", "sh", "-c",
                        "kill -9 $$"], capture_output=True, timeout=60, check=False)
    assert r.returncode == 128 + 9


def test_expose_and_socket_port_reach_a_server_the_other_way(echo, tmp_path):
    """In: the forwarder's ``--expose`` listens on a Unix socket and dials a server on its loopback; SocketPort gives
    that socket a loopback TCP port (how the host reaches an OpenEnv image's server in a sandbox)."""
    sock = tmp_path / "env.sock"
    child = "import os, sys; print(os.getcwd(), flush=True); sys.stdin.read()"  # runs until we close its stdin
    proc = subprocess.Popen([sys.executable, "-I", "-S", str(forwarder_script_path()), "--expose", str(sock), "--to",
                             f"127.0.0.1:{echo.port}", "--cwd", str(tmp_path), "--", sys.executable, "-c", child],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == str(tmp_path)  # CMD runs in --cwd, after the socket listens
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666
        with SocketPort(str(sock)) as port:
            assert port.url == f"http://127.0.0.1:{port.port}"
            with socket.create_connection(("127.0.0.1", port.port)) as s:
                s.sendall(b"ping")
                s.shutdown(socket.SHUT_WR)
                assert b"".join(iter(lambda: s.recv(65536), b"")) == b"echo:ping"
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    with pytest.raises(ValueError, match="not a loopback address"):
        SocketPort(str(sock), host="0.0.0.0")
    both = subprocess.run([sys.executable, "-I", "-S", str(forwarder_script_path()), "--socket", str(sock),
                           "--expose", str(sock), "--", "true"], capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and "give one of --socket (out of the sandbox) and --expose (into it)" in both.stderr


def test_bridged_command_and_mounts_recipe():
    argv = bridged_command(["python3", "agent.py"], env={"OPENAI_BASE_URL": "http://127.0.0.1:8765/v1"})
    assert argv == ["python3", "-I", "-S", "/opt/relax/bin/forward_in_sandbox.py", "--socket", "/run/relax/api.sock",
                    "--listen", f"127.0.0.1:{DEFAULT_LISTEN_PORT}", "--env",
                    "OPENAI_BASE_URL=http://127.0.0.1:8765/v1", "--", "python3", "agent.py"]
    with pytest.raises(ValueError, match="empty command"):
        bridged_command([])
    script = forwarder_script_path()
    assert script.is_file() and os.listdir(forwarder_dir()) == [script.name]
    with open(os.path.join(forwarder_dir(), script.name)) as copy:
        assert copy.read() == script.read_text()
    tree = ast.parse(script.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= set(sys.stdlib_module_names), imported


# ---------------------------------------------------------------------------------------------- in a sandbox


def test_sandbox_has_only_loopback(backend, spec):
    async def body():
        box = await backend.create(spec)
        try:
            r = await box.exec("cat /proc/net/dev")
        finally:
            await box.close()
        return r

    r = run(body())
    assert r.ok, r
    interfaces = sorted(line.split(":")[0].strip() for line in r.stdout.splitlines()[2:] if ":" in line)
    assert interfaces == ["lo"]


_FETCH = (
    "import socket, sys, urllib.request\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=10).close()\n"
    "    print('direct: connected')\n"
    "except OSError as e:\n"
    "    print('direct: refused' if isinstance(e, ConnectionRefusedError) else f'direct: {e}')\n"
    "with urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[2]}/through/the/bridge', timeout=30) as resp:\n"
    "    print(resp.status, resp.read().decode())\n"
)


def test_host_loopback_server_only_through_the_bridge(backend, spec, http_server):
    listen = DEFAULT_LISTEN_PORT if http_server != DEFAULT_LISTEN_PORT else DEFAULT_LISTEN_PORT + 1

    async def body(bridge):
        box = await backend.create(with_mounts(spec, *bridge_mounts(bridge)))
        try:
            direct = await box.exec(["python3", "-c", _FETCH.split("with urllib")[0], str(http_server), "0"])
            bridged = await box.exec(bridged_command(["python3", "-c", _FETCH, str(http_server), str(listen)],
                                                     listen_port=listen))
            again = await box.exec(bridged_command(["sh", "-c", "exit 3"], listen_port=listen))  # port free again
        finally:
            await box.close()
        return direct, bridged, again

    with SocketBridge("127.0.0.1", http_server) as bridge:
        direct, bridged, again = run(body(bridge))
    assert direct.ok and direct.stdout == "direct: refused\n", direct
    assert bridged.ok, bridged
    assert bridged.stdout == "direct: refused\n200 hello from the host, path /through/the/bridge\n"
    assert again.rc == 3, again


def test_forwarder_reads_secrets_from_an_env_file_and_deletes_it(tmp_path, echo):
    """The episode's key travels in a file, not on the command line (a host's ps shows command lines)."""
    secret = tmp_path / "agent.env"
    secret.write_text("OPENAI_API_KEY=relax-ek-123\nEMPTY=\n")
    with SocketBridge("127.0.0.1", echo.port) as bridge:
        argv = bridged_command([sys.executable, "-c", "import os; print(os.environ['OPENAI_API_KEY'], repr(os.environ['EMPTY']))"],
                               bridge.socket_path, 0, python=sys.executable, script_in_sandbox=str(forwarder_script_path()),
                               env_file=str(secret))
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert (r.returncode, r.stdout) == (0, "relax-ek-123 ''\n"), r.stderr
    assert not any("relax-ek-123" in a for a in argv) and not secret.exists()
    bad = tmp_path / "bad.env"
    bad.write_text("no equals sign\n")
    r = subprocess.run([sys.executable, "-S", str(forwarder_script_path()), "--socket", "/x", "--env-file", str(bad), "--",
                        "true"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 125 and "line 1" in r.stderr
