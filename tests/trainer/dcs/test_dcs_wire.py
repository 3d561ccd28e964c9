"""The ``tcp`` transport's ``socket`` wire (``dcs/wire.py``): a plain TCP stream per engine, the actor's tensors
sent from their own memory and received straight into the engine's staging buffers.

Checked on the wire alone (both ends in this process): calls arrive bit for bit over 1, 2 or 3 streams (several
dtypes, an empty and a non-contiguous tensor, flattened or per tensor, one call or several at once); a stranger (wrong group name or rank) is refused while the
engine is welcomed; an out-of-step call (another stage, another size) is refused before a byte of it is read
and closes the stream; a peer that stops reading or dies is a ``WireError`` naming its rank within the timeout.

Checked through the DCS against embedded engines behind their HTTP servers (in this process, and a spawned one
that can be killed): staged pushes over the wire are bit-identical and the engine advertises the wire; a stage
that fails (an engine refusing bucket k, a stream out of step) leaves every engine unpaused on its version and
weights; an engine that dies mid-push is named (the survivor untouched), and once it is dropped, and again once
a replacement joins (a new epoch), pushes go through; an engine drops a stream whose actor went away; an engine
that does not advertise the wire gets the gloo group (and asking for the wire there names it)."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import torch

from relax_gym.trainer.dcs import (
    DCSClient,
    DCSCoordinator,
    DCSPushError,
    checkpoint_names,
)
from relax_gym.trainer.dcs import wire as wire_module
from relax_gym.trainer.dcs.errors import DCSEngineError
from relax_gym.trainer.dcs.group import (
    GroupReceiver,
    WeightUpdateGroup,
    flatten_tensors,
)
from relax_gym.trainer.dcs.transports import TcpTransport
from relax_gym.trainer.dcs.wire import (
    SocketEnd,
    SocketWire,
    WireError,
    byte_view,
    split_bytes,
)
from relax_gym.trainer.engines.client import EngineClient
from relax_gym.trainer.engines.embedded import EngineRequestError
from relax_gym.trainer.engines.process import spawn_engine
from relax_gym.trainer.policy.model import PolicyConfig

from .engine_helpers import assert_holds, in_process_engine, shifted

BUCKET_MB = 0.25  # the tiny policy is ~2.8 MiB: about a dozen calls


# ---------------------------------------------------------------------------------------------- the wire alone


def connect(wire: SocketWire, rank: int, name: str | None = None, timeout_s: float = 5.0) -> tuple[threading.Thread, dict]:
    """An engine's end connecting from a thread (the actor's ``accept`` runs in the test's thread)."""
    box: dict = {}

    def run() -> None:
        try:
            box["end"] = SocketEnd.connect("127.0.0.1", wire.port, rank, group_name=name or wire.group_name,
                                           timeout_s=timeout_s)
        except Exception as exc:  # noqa: BLE001 - checked by the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def pair(timeout_s: float = 5.0, streams: int = 2) -> tuple[SocketWire, SocketEnd]:
    wire = SocketWire("127.0.0.1", [1], group_name="relax-dcs-test", timeout_s=timeout_s, streams=streams)
    thread, box = connect(wire, 1, timeout_s=timeout_s)
    wire.accept(time.monotonic() + 5)
    thread.join(5)
    return wire, box["end"]


def test_split_bytes_cuts_contiguous_page_aligned_ranges():
    bufs = [memoryview(bytes(range(256)) * n) for n in (40, 1, 0, 77)]  # 10240, 256, 0, 19712 bytes
    whole = b"".join(bytes(b) for b in bufs)
    for parts in (1, 2, 3, 7):
        ranges = split_bytes(bufs, parts)
        assert len(ranges) == parts and b"".join(bytes(v) for r in ranges for v in r) == whole
        sizes = [sum(v.nbytes for v in r) for r in ranges]
        assert all(size % 4096 == 0 for size in sizes[:-1])  # only the last range ends off a page
    assert [sum(v.nbytes for v in r) for r in split_bytes([memoryview(b"x" * 100)], 3)] == [0, 0, 100]


@pytest.mark.parametrize("streams", [1, 2, 3])
def test_calls_arrive_bit_for_bit_flattened_or_per_tensor(streams):
    wire, end = pair(streams=streams)
    assert end.streams == streams
    try:
        calls = [
            [torch.randn(64, 33), torch.randn(0), torch.randn(8, 8).t(), torch.randn(())],  # empty, non-contiguous, 0-d
            [torch.randn(1000).to(torch.bfloat16), torch.randn(7).to(torch.bfloat16)],
            [torch.randint(0, 1 << 30, (513,), dtype=torch.int64)],
        ]
        received: list = []

        def receive() -> None:
            for seq, call in enumerate(calls):
                if seq % 2 == 0:  # flattened into one buffer, as a staged call lands
                    flat = torch.empty(sum(t.numel() * t.element_size() for t in call), dtype=torch.uint8)
                    end.receive([byte_view(flat)], count=len(call), stage=("stage-a", seq))
                    received.append(flat)
                else:  # per tensor, into tensors of their own
                    outs = [torch.empty(t.shape, dtype=t.dtype) for t in call]
                    end.receive([byte_view(t) for t in outs], count=len(call), stage=("stage-a", seq))
                    received.append(outs)

        thread = threading.Thread(target=receive, daemon=True)
        thread.start()
        for seq, call in enumerate(calls):
            assert wire.send(call, stage=("stage-a", seq)) == sum(t.numel() * t.element_size() for t in call)
        thread.join(10)
        assert not thread.is_alive() and len(received) == len(calls)
        assert torch.equal(received[0], flatten_tensors(calls[0]))
        assert all(torch.equal(a, b) for a, b in zip(received[1], calls[1]))
        assert torch.equal(received[2], flatten_tensors(calls[2]))
        assert end.alive and wire.alive
        # several calls at once (a staged push's): each stream takes its range of every call in turn
        big = [[torch.randn(300_000)], [torch.randn(5)], [torch.randn(123_457).to(torch.bfloat16), torch.randn(3)]]
        outs = [[torch.empty(t.shape, dtype=t.dtype) for t in call] for call in big]
        thread = threading.Thread(target=lambda: end.receive_calls(
            [([byte_view(t) for t in out], len(out)) for out in outs], stage_id="stage-b", first_seq=0), daemon=True)
        thread.start()
        wire.send_calls(big, stage_id="stage-b")
        thread.join(10)
        assert all(torch.equal(a, b) for call, out in zip(big, outs) for a, b in zip(call, out))
    finally:
        wire.destroy()
        end.destroy()


def test_strangers_are_refused_and_the_engine_welcomed(monkeypatch):
    monkeypatch.setattr(wire_module, "HELLO_S", 0.5)
    wire = SocketWire("127.0.0.1", [1, 2], group_name="relax-dcs-secret", timeout_s=5)
    try:
        with socket.create_connection(("127.0.0.1", wire.port)) as silent:  # connects, never says hello
            threads = [connect(wire, 1, name="relax-dcs-guess"), connect(wire, 7), connect(wire, 1), connect(wire, 2)]
            wire.accept(time.monotonic() + 10)
            for thread, _ in threads:
                thread.join(10)
            silent.settimeout(5)
            assert silent.recv(1) == b""  # closed without a welcome
        (_, wrong_name), (_, wrong_rank), (_, one), (_, two) = threads
        assert isinstance(wrong_name["error"], WireError) and isinstance(wrong_rank["error"], WireError)
        assert one["end"].alive and two["end"].alive and wire.missing == [] and wire._listener is None
        with pytest.raises(OSError):  # the listener is gone once every rank is in
            socket.create_connection(("127.0.0.1", wire.port), timeout=2).close()
    finally:
        wire.destroy()


def test_an_out_of_step_call_is_refused_unread_and_closes_the_stream():
    wire, end = pair()
    try:
        payload = torch.randn(4096)
        buf = torch.zeros(payload.numel() * 4, dtype=torch.uint8)
        wire.send([payload], stage=("push-1", 0))
        with pytest.raises(WireError, match="out of step.*seq 0 of stage.*request announced.*seq 1"):
            end.receive([byte_view(buf)], count=1, stage=("push-1", 1))
        assert not end.alive and torch.count_nonzero(buf) == 0  # not a byte of the call was read
        with pytest.raises(WireError, match="closed"):
            end.receive([byte_view(buf)], count=1, stage=("push-1", 0))
    finally:
        wire.destroy()


def test_a_stalled_or_dead_peer_is_a_bounded_error():
    wire, end = pair(timeout_s=0.5)
    big = torch.zeros(64 << 18)  # 64 MiB: far more than the socket buffers hold
    try:
        with pytest.raises(WireError, match="rank 1 took no bytes") as info:  # its timeout, not a hang
            wire.send([big])  # the engine never reads
        assert info.value.rank == 1
    finally:
        wire.destroy()
        end.destroy()
    wire, end = pair(timeout_s=0.3)
    try:  # the engine's side: a call whose bytes never come
        with pytest.raises(WireError, match="no byte arrived for 0.3 s"):  # its timeout, not a hang
            end.receive([memoryview(bytearray(16))], count=1)
        assert not end.alive
    finally:
        wire.destroy()
    wire, end = pair(timeout_s=5)
    try:
        calls = [0]

        def check() -> None:  # the DCS watches the engines' HTTP answers here
            calls[0] += 1
            raise DCSEngineError("http://127.0.0.1:1", "update_weights_from_distributed", "refused (injected)")

        with pytest.raises(DCSEngineError, match="refused"):
            wire.send([big], check=check)
        assert calls[0] == 1
        end.destroy()  # the engine's end goes away (its process died)
        with pytest.raises(WireError, match="rank 1") as info:
            for _ in range(3):
                wire.send([big])
        assert info.value.rank == 1
    finally:
        wire.destroy()


def test_no_engine_connecting_is_a_timeout_naming_the_rank():
    wire = SocketWire("127.0.0.1", [3], group_name="relax-dcs-lonely", timeout_s=0.2)
    try:
        with pytest.raises(WireError, match=r"rank\(s\) \[3\] did not connect") as info:
            wire.accept(time.monotonic() + 0.2)
        assert info.value.rank == 3
    finally:
        wire.destroy()


# ---------------------------------------------------------------------------------------------- through the DCS


class GlooOnly(GroupReceiver):
    """A receiver without the socket wire (what an engine that does not advertise it looks like)."""

    backends = ("gloo", "nccl")


@pytest.mark.parametrize("streams", [None, 2], ids=["default", "2-streams"])
def test_staged_pushes_over_the_socket_wire_are_bit_identical(engine, actor, streams):
    eng, url = engine
    names = checkpoint_names(actor)
    with EngineClient(url) as client:
        info = client.get_server_info()
    assert "socket" in info["weight_update_backends"] and info["weight_update_staging"] is True
    coordinator = DCSCoordinator([url], bucket_mb=BUCKET_MB, transport="tcp")
    transport = TcpTransport(group_timeout_s=10, streams=streams) if streams else None
    with DCSClient(coordinator, names=names, group_timeout_s=10, transport=transport) as dcs:
        for k in range(3):  # three in a row: the engine's staging buffers take turns
            state = shifted(actor, 0.5 * k + 0.1)
            report = dcs.push(state, version=f"w-{k}")
            assert isinstance(dcs.transport.group, SocketWire) and dcs.transport.group.alive
            assert report.bytes == coordinator.weights.nbytes and report.buckets == len(coordinator.buckets()) > 5
            assert eng.weight_version == f"w-{k}" and not eng.paused and coordinator.version == f"w-{k}"
            assert_holds(eng, state, names)
        wire = dcs.transport.group
        (end,) = [g for n, g in eng._groups.items() if n == wire.group_name]
        assert isinstance(end, SocketEnd) and end.alive and end.streams == wire.streams == (streams or 1)
    assert not wire.alive and not end.alive and wire.group_name not in eng._groups  # close() left it on both ends


def test_the_one_request_stage_is_validated_before_anything_is_read(engine):
    eng, url = engine
    call = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[128]]}
    with httpx.Client(base_url=url, timeout=30) as http:
        bad = http.post("/stage_weights_from_distributed", json={"stage_id": "s", "calls": [{**call, "dtypes": []}]})
        assert bad.status_code == 400 and "calls.0" in bad.json()["message"] and "same length" in bad.json()["message"]
        assert http.post("/stage_weights_from_distributed", json={"stage_id": "s", "calls": []}).status_code == 400
        unknown = http.post("/stage_weights_from_distributed", json={"group_name": "nope", "stage_id": "s", "calls": [call]})
        assert unknown.status_code == 400 and unknown.json()["success"] is False
        assert "no weight update group 'nope'" in unknown.json()["message"]
    assert not eng.paused


def test_a_stream_whose_actor_went_away_is_dropped_by_the_engine(engine, actor):
    eng, url = engine
    names = checkpoint_names(actor)
    coordinator = DCSCoordinator([url], bucket_mb=BUCKET_MB, transport="tcp")
    gone = DCSClient(coordinator, names=names, group_timeout_s=10)
    gone.push(shifted(actor, 1.0), version="a-1")
    old = gone.transport.group.group_name
    gone.transport.group.destroy()  # the actor's process died: its sockets closed, nobody told the engine
    deadline = time.monotonic() + 5
    while eng._groups[old].alive and time.monotonic() < deadline:  # the engine notices when asked ...
        time.sleep(0.01)
    assert not eng._groups[old].alive
    with DCSClient(coordinator, names=names, group_timeout_s=10) as dcs:
        state = shifted(actor, 2.0)
        dcs.push(state, version="a-2")  # ... and leaves it when the next actor's stream joins
        assert old not in eng._groups and eng.weight_version == "a-2"
        assert_holds(eng, state, names)
    gone._pool.shutdown(wait=False)


@pytest.mark.parametrize("failure", ["refused", "out-of-step"])
def test_a_failed_stage_leaves_version_and_weights_unchanged(engine, actor, monkeypatch, failure):
    eng, url = engine
    names = checkpoint_names(actor)
    coordinator = DCSCoordinator([url], bucket_mb=BUCKET_MB, transport="tcp", version=0)
    with DCSClient(coordinator, names=names, group_timeout_s=10) as dcs:
        before = shifted(actor, 3.0)
        dcs.push(before, version="f-1")
        wire = dcs.transport.group
        k = len(coordinator.buckets()) // 2
        if failure == "refused":  # the engine refuses bucket k (its bytes are still read: the stream stays in step)
            refused = set(coordinator.buckets()[k].names)
            original = eng._plan

            def plan(shapes):
                if any(name in refused for name, _ in shapes):
                    raise EngineRequestError("weight update refused, nothing was loaded: 1 shape mismatch(es) (injected)")
                return original(shapes)

            monkeypatch.setattr(eng, "_plan", plan)
        else:  # call k goes out under another seq: the engine refuses it unread and closes its end
            send_calls = SocketWire.send_calls

            def skewed(self, calls, *, stage_id=None, first_seq=0, check=None):
                n = send_calls(self, calls[:k], stage_id=stage_id, first_seq=first_seq, check=check)
                return n + send_calls(self, calls[k:], stage_id=stage_id, first_seq=first_seq + k + 1, check=check)

            monkeypatch.setattr(SocketWire, "send_calls", skewed)
        with pytest.raises(DCSPushError) as info:
            dcs.push(shifted(actor, 4.0), version="f-2")
        err = info.value
        assert err.url == url and err.untouched and err.paused == () and "no engine was paused" in str(err)
        assert ("shape mismatch" if failure == "refused" else "out of step") in str(err)
        assert eng.weight_version == "f-1" and not eng.paused and coordinator.version == "f-1"
        assert_holds(eng, before, names)
        assert not wire.alive and dcs.transport.group is None  # discarded: the next push forms a new stream
        monkeypatch.undo()
        state = shifted(actor, 5.0)
        dcs.push(state, version="f-3")
        assert eng.weight_version == "f-3" and dcs.transport.group is not wire
        assert_holds(eng, state, names)
        assert wire.group_name not in eng._groups  # the broken stream was left on the engine


def test_an_engine_dying_mid_push_is_named_and_the_survivor_untouched(engine, actor, monkeypatch):
    eng, url = engine
    names = checkpoint_names(actor)
    doomed = spawn_engine(PolicyConfig(seed=0), weight_receiver=GroupReceiver())
    replacement = None
    try:
        coordinator = DCSCoordinator([url, doomed.url], bucket_mb=BUCKET_MB, transport="tcp", version=0)
        with DCSClient(coordinator, names=names, timeout_s=20, group_timeout_s=10) as dcs:
            first = shifted(actor, 6.0)
            dcs.push(first, version="d-1")
            with EngineClient(doomed.url) as other:
                assert_holds(other, first, names)
            wire = dcs.transport.group
            assert isinstance(wire, SocketWire) and len(wire.ranks) == 2
            send_calls = SocketWire.send_calls

            def dies_after_first_call(self, calls, *, stage_id=None, first_seq=0, check=None):
                n = send_calls(self, calls[:1], stage_id=stage_id, first_seq=first_seq, check=check)
                doomed.kill()  # SIGKILL: its sockets close as a crashed replica's would
                return n + send_calls(self, calls[1:], stage_id=stage_id, first_seq=first_seq + 1, check=check)

            monkeypatch.setattr(SocketWire, "send_calls", dies_after_first_call)
            t0 = time.monotonic()
            with pytest.raises(DCSPushError) as info:
                dcs.push(shifted(actor, 7.0), version="d-2")
            assert time.monotonic() - t0 < 15  # found at once, not at a timeout
            err = info.value
            assert err.url == doomed.url and err.untouched and err.paused == ()
            assert isinstance(err.__cause__, DCSEngineError) and err.__cause__.url == doomed.url and url not in str(err)
            # the survivor: unpaused, on its version and weights; its end of the dead stream is closed
            assert eng.weight_version == "d-1" and not eng.paused and coordinator.version == "d-1"
            assert_holds(eng, first, names)
            assert not wire.alive and dcs.transport.group is None  # the actor closed every stream of the push
            monkeypatch.undo()
            coordinator.remove_engine(doomed.url)  # the roles drop it: a new epoch, a new stream
            state = shifted(actor, 8.0)
            report = dcs.push(state, version="d-3")
            assert report.engines == 1 and eng.weight_version == "d-3" and wire.group_name not in eng._groups
            assert_holds(eng, state, names)
            new_eng, replacement = in_process_engine(GroupReceiver())
            coordinator.add_engine(replacement.url)  # a replacement joins: another epoch
            state = shifted(actor, 9.0)
            report = dcs.push(state, version="d-4")
            assert report.engines == 2 and coordinator.engine_versions == {url: "d-4", replacement.url: "d-4"}
            assert isinstance(dcs.transport.group, SocketWire) and len(dcs.transport.group.ranks) == 2
            assert_holds(new_eng, state, names)
            assert_holds(eng, state, names)
    finally:
        doomed.stop()
        if replacement is not None:
            replacement.close()


def test_gloo_is_used_when_an_engine_does_not_advertise_the_wire(engine, actor):
    eng, url = engine
    gloo_eng, server = in_process_engine(GlooOnly())
    try:
        names = checkpoint_names(actor)
        with EngineClient(server.url) as client:
            assert "socket" not in client.get_server_info()["weight_update_backends"]
        coordinator = DCSCoordinator([url, server.url], bucket_mb=BUCKET_MB, transport="tcp")
        with DCSClient(coordinator, names=names, group_timeout_s=10) as dcs:
            state = shifted(actor, 10.0)
            dcs.push(state, version="g-1")
            assert isinstance(dcs.transport.group, WeightUpdateGroup)  # one engine lacks the wire: gloo for both
            assert_holds(eng, state, names)
            assert_holds(gloo_eng, state, names)
        with DCSClient(coordinator, names=names, group_timeout_s=10, wire="socket") as dcs, \
                pytest.raises(DCSPushError) as info:  # the wire asked for anyway
            dcs.push(shifted(actor, 11.0), version="g-2")
        err = info.value
        assert err.url == server.url and err.step == "init_weights_update_group" and err.untouched
        assert "backend 'socket' is not available" in str(err)
        assert eng.weight_version == gloo_eng.weight_version == "g-1" and not eng.paused and not gloo_eng.paused
    finally:
        server.close()
