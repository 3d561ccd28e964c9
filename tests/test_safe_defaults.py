"""The safe defaults that docs/security.md promises, each checked against the code that provides it.

- Servers we start listen on loopback unless a caller asks otherwise: the embedded engine's HTTP server (its
  SGLang and OpenAI routes have no authentication), the DCS weight-update store and gloo pairs, TransferQueue's
  sockets (see also ``tests/trainer/databus/test_databus.py::test_tq_binds_loopback_with_one_storage_unit``), and Ray Serve runs
  with its HTTP proxy off.
- Ray's token authentication is turned off only by the test suite and the benchmarks, never by the library.
- A default sandbox has no network, runs as a non-root user with every capability dropped, and has a read-only
  root filesystem; both backends turn those settings into the matching engine options.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import threading
import types
from pathlib import Path

import pytest
from pydantic import ValidationError

from relax_gym.sandbox.spec import SandboxSpec

REPO = Path(__file__).resolve().parents[1]
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def _is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address in LOOPBACK or address == ipaddress.IPv6Address("::1")


def _own_listeners() -> set[tuple[str, int]]:
    """(address, port) of every TCP socket this process is listening on, read from /proc/net/tcp{,6} and matched
    to this process's file descriptors by inode."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # words are printed little-endian
            found.add((str(ipaddress.ip_address(raw)), int(port_hex, 16)))
    return found


def _outward_address() -> str | None:
    """An IPv4 address of this machine outside loopback, if it has one (read from its interfaces; nothing is sent)."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not _is_loopback(a.address):
                return a.address
    return None


# ---------------------------------------------------------------------------------------------- engine HTTP server


class _NoEngine:
    """The server's constructor only keeps the engine; nothing here generates."""

    def close(self) -> None:
        pass


def test_embedded_engine_server_binds_loopback_by_default():
    from relax_gym.trainer.engines.http_server import serve

    before = _own_listeners()
    with serve(_NoEngine()) as server:
        assert server.host == "127.0.0.1"
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert _own_listeners() - before == {("127.0.0.1", server.port)}
        with socket.create_connection(("127.0.0.1", server.port), timeout=5):
            pass
        outward = _outward_address()
        if outward is not None:  # the same port is not reachable through the machine's own network address
            with pytest.raises(OSError):
                socket.create_connection((outward, server.port), timeout=2).close()


def test_engine_host_defaults_are_loopback_everywhere():
    import inspect

    from relax_gym.trainer.config import load_recipe
    from relax_gym.trainer.engines.settings import InferenceSection
    from relax_gym.trainer.engines.http_server import EngineServer, serve
    from relax_gym.trainer.engines.process import spawn_engine

    for fn in (serve, EngineServer.__init__, spawn_engine):
        assert inspect.signature(fn).parameters["host"].default == "127.0.0.1", fn
    assert InferenceSection().host == "127.0.0.1"
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes
    for recipe in recipes:  # no shipped recipe opens the engine to the network
        assert _is_loopback(load_recipe(recipe).inference.host), recipe


# ---------------------------------------------------------------------------------------------- DCS weight sync


def test_dcs_master_address_is_loopback_when_engines_are_local():
    from relax_gym.trainer.dcs.transports import _free_port, _master_address

    assert _master_address(["http://127.0.0.1:30000", "http://localhost:30001", "http://[::1]:30002"]) == "127.0.0.1"
    with socket.socket() as probe:
        port = _free_port("127.0.0.1")
        probe.bind(("127.0.0.1", port))  # the port it hands out is free on loopback


def test_weight_update_group_on_loopback_listens_on_loopback_only():
    """Both ends of a gloo weight-update group in one process: while they are up, every socket the group listens
    on (the store's port and gloo's pairs) is bound to loopback -- the store serves unauthenticated reads and writes
    to whoever connects."""
    from relax_gym.trainer.dcs.transports import _free_port
    from relax_gym.trainer.dcs.group import WeightUpdateGroup

    port = _free_port("127.0.0.1")
    before = _own_listeners()
    groups: dict[int, WeightUpdateGroup] = {}
    errors: list[BaseException] = []

    def join(rank: int) -> None:
        try:
            groups[rank] = WeightUpdateGroup("127.0.0.1", port, rank, 2, group_name="safe-defaults", timeout_s=30)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert not errors, errors
        assert set(groups) == {0, 1}
        opened = _own_listeners() - before
        assert port in {p for _, p in opened}, f"nothing listens on the store's port {port}: {opened}"
        wide = {(a, p) for a, p in opened if not _is_loopback(a)}
        assert not wide, f"the weight-update group listens beyond loopback: {wide}"
        # and the group works: rank 1 receives rank 0's tensor
        import torch

        sent, received = torch.arange(6, dtype=torch.float32), torch.zeros(6)
        work = groups[1].broadcast(received, 0, async_op=True)
        groups[0].broadcast(sent, 0)
        work.wait()
        assert torch.equal(received, sent)
    finally:
        for group in groups.values():
            group.destroy()


# ---------------------------------------------------------------------------------------------- TransferQueue


def test_transferqueue_servers_are_told_to_bind_loopback():
    """``_node_ip`` is how the bus makes TransferQueue's controller and storage units bind loopback: inside it, the
    address they ask Ray for is 127.0.0.1; outside it, Ray's own answer is back."""
    import ray.util

    from relax_gym.trainer.databus.tq_system import LOOPBACK, _node_ip

    original = ray.util.get_node_ip_address
    assert LOOPBACK == "127.0.0.1"
    with _node_ip(LOOPBACK):
        assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert ray.util.get_node_ip_address is original


# ---------------------------------------------------------------------------------------------- Ray and Ray Serve


class _Stop(Exception):
    pass


def test_serve_starts_without_its_http_proxy(monkeypatch):
    from ray import serve

    from relax_gym.trainer.async_engine.controller import AsyncTrainer

    seen: dict = {}

    def fake_start(*args, **kwargs):
        seen.update(kwargs, args=args)
        raise _Stop

    monkeypatch.setattr(serve, "start", fake_start)
    with pytest.raises(_Stop):
        AsyncTrainer._start(types.SimpleNamespace())
    assert seen["proxy_location"] == "Disabled"
    assert "http_options" not in seen


# The benchmark harness starts throw-away local clusters for its child processes, like the tests do.
BENCHMARK_HARNESS = REPO / "relax_gym" / "bench"


def test_library_never_turns_ray_auth_off(monkeypatch):
    """Only the test suite and the benchmarks set RAY_AUTH_MODE; the trainer starts Ray without touching it, so a
    new local cluster gets Ray's default (token authentication)."""
    offenders = []
    for root in (REPO / "relax_gym", REPO / ".ci"):
        for path in root.rglob("*"):
            if BENCHMARK_HARNESS in path.parents:
                continue
            if path.is_file() and path.suffix in {".py", ".sh", ".toml", ".yaml", ".yml", ""}:
                if "RAY_AUTH_MODE" in path.read_text(errors="replace"):
                    offenders.append(path)
    for path in (REPO / "Makefile", REPO / "pyproject.toml"):
        if "RAY_AUTH_MODE" in path.read_text():
            offenders.append(path)
    assert not offenders, f"RAY_AUTH_MODE set outside tests/benchmarks: {offenders}"

    from relax_gym.trainer.config import RelaxConfig
    from relax_gym.trainer.async_engine.controller import ensure_ray

    calls: list[dict] = []
    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kw: calls.append(kw))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("TQ_NUM_THREADS", "2")
    assert ensure_ray(RelaxConfig()) is True
    (kwargs,) = calls
    assert kwargs.get("include_dashboard") is False
    assert "AUTH_MODE" not in (kwargs.get("_system_config") or {})
    assert "RAY_AUTH_MODE" not in os.environ


# ---------------------------------------------------------------------------------------------- sandboxes


def test_sandbox_spec_defaults_are_the_safe_ones():
    spec = SandboxSpec()
    assert spec.network is False
    assert spec.uid >= 1 and spec.gid >= 1
    assert 0 < spec.exec_timeout_s < float("inf") and 0 < spec.lifetime_s < float("inf")
    assert spec.memory_mb <= 4096 and spec.pids <= 1024 and spec.cpus <= 4
    assert spec.env == {} and spec.runtime is None
    for field in ("uid", "gid"):
        with pytest.raises(ValidationError):
            SandboxSpec(**{field: 0})
    with pytest.raises(ValidationError):
        SandboxSpec(read_only=False)  # there is no switch for a writable root


def test_bwrap_namespaces_leave_the_network_out_unless_asked():
    from relax_gym.sandbox.bwrap import _namespace_args

    closed = _namespace_args(SandboxSpec().network)
    assert "--share-net" not in closed
    for flag in ("--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in closed
    assert closed[closed.index("--cap-drop") + 1] == "ALL"
    assert "--share-net" in _namespace_args(True)


def test_docker_container_options_follow_the_spec(monkeypatch):
    """The options handed to the Docker engine for a default spec: no network, read-only root, no capabilities,
    no privilege gain, the sandbox user, the limits -- recorded from a stand-in for the engine API."""
    from relax_gym.sandbox.docker import DockerBackend

    recorded: dict = {}

    class FakeAPI:
        def create_host_config(self, **kwargs):
            recorded["host"] = kwargs
            return kwargs

        def create_container(self, *args, **kwargs):
            recorded["container"] = kwargs
            raise _Stop

    backend = DockerBackend()
    try:
        monkeypatch.setattr(backend, "_ensure_image", lambda image: None)
        monkeypatch.setattr(backend, "_api", lambda: FakeAPI())
        for network in (False, True):
            spec = SandboxSpec(network=network)
            with pytest.raises(_Stop):
                backend._create_blocking(spec, f"safe-defaults-{network}")
            host, container = recorded["host"], recorded["container"]
            assert host["network_mode"] == ("bridge" if network else "none")
            assert host["read_only"] is True
            assert host["cap_drop"] == ["ALL"] and "no-new-privileges" in host["security_opt"]
            assert host["pids_limit"] == spec.pids and host["mem_limit"] == host["memswap_limit"] == f"{spec.memory_mb}m"
            assert all("nosuid" in opts for opts in host["tmpfs"].values())
            assert container["user"] == f"{spec.uid}:{spec.gid}"
    finally:
        backend._pool.shutdown(wait=False)
