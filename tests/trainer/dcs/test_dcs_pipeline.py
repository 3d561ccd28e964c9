"""Pipelined, staged DCS pushes (``tcp``, over the socket wire and over a gloo group): the engine receives every
bucket while it keeps generating and is paused only to swap the received tensors in.

The engine runs in this process behind its HTTP server (the actor's end of the gloo group is another rank in the
same process), so the test can record, on the engine itself, when each bucket was received, when it was paused
and resumed, and whether it served a generate while a push was arriving. Checked: bit-identical weights (SHA-256
per tensor) for buckets smaller than one tensor, of a few tensors and larger than the model, several pushes in a
row (the engine's staging buffers take turns); the order of events; a push that fails on bucket k (an engine
that refuses it, or a broadcast that breaks) leaves the engine unpaused on its previous version, and the next
push goes through."""

from __future__ import annotations

import threading
import time

import pytest

from relax_gym.trainer.dcs import (
    DCSClient,
    DCSCoordinator,
    DCSPushError,
    checkpoint_names,
)
from relax_gym.trainer.dcs.group import WeightUpdateGroup
from relax_gym.trainer.dcs.wire import SocketWire
from relax_gym.trainer.engines.embedded import EmbeddedEngine, EngineRequestError
from relax_gym.trainer.engines.protocol import EngineRequest, SamplingParams

from .engine_helpers import assert_holds, shifted


def one_token(eng: EmbeddedEngine) -> str:
    req = EngineRequest(rid=f"probe-{time.monotonic_ns()}", input_ids=[int(eng.processor.eos_token_id)],
                        sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0))
    return eng.generate(req, timeout=30).meta_info.weight_version


@pytest.mark.parametrize("wire", ["socket", "gloo"])
@pytest.mark.parametrize("bucket_mb", [0.01, 0.25, 64.0], ids=["smaller-than-a-tensor", "a-few-tensors", "larger-than-the-model"])
def test_staged_pushes_are_bit_identical(engine, actor, bucket_mb, wire):
    eng, url = engine
    names = checkpoint_names(actor)
    biggest = max(t.numel() * t.element_size() for t in actor.state_dict().values())
    coordinator = DCSCoordinator([url], bucket_mb=bucket_mb, transport="tcp")
    with DCSClient(coordinator, names=names, group_timeout_s=10, wire=wire) as dcs:
        for k in range(3):  # three in a row: the engine's two sets of buffers take turns
            state = shifted(actor, 0.25 * k + bucket_mb)
            version = f"{bucket_mb}-{k}"
            report = dcs.push(state, version=version)
            assert report.version == version and eng.weight_version == version and not eng.paused
            assert report.bytes == coordinator.weights.nbytes and 0 < report.paused_seconds < report.seconds
            assert isinstance(dcs.transport.group, SocketWire if wire == "socket" else WeightUpdateGroup)
            assert_holds(eng, state, names)
    if bucket_mb == 0.01:
        assert bucket_mb * (1 << 20) < biggest and report.buckets == len(coordinator.buckets()) > 10
    if bucket_mb == 64.0:
        assert report.buckets == 1


@pytest.mark.parametrize("wire", ["socket", "gloo"])
def test_the_engine_serves_while_buckets_arrive_and_pauses_only_to_swap(engine, actor, monkeypatch, wire):
    eng, url = engine
    names = checkpoint_names(actor)
    events: list[tuple[str, float, bool]] = []  # (what, when, paused then)
    served: list[str] = []
    lock = threading.Lock()

    def record(what: str) -> None:
        with lock:
            events.append((what, time.monotonic(), eng.paused))

    # the gloo wire stages call by call; the socket wire stages every call in one request (stage_weights)
    staging = "stage_weights" if wire == "socket" else "stage_weights_from_distributed"

    def spy(name: str):
        original = getattr(eng, name)

        def wrapped(*args, **kwargs):
            record(f"{name}:start")
            if name == staging and kwargs.get("seq", 1) == 1:
                served.append(one_token(eng))  # a generate completes while the push is arriving
            try:
                return original(*args, **kwargs)
            finally:
                record(f"{name}:end")
        monkeypatch.setattr(eng, name, wrapped)

    for name in (staging, "apply_staged_weights", "pause", "resume"):
        spy(name)
    coordinator = DCSCoordinator([url], bucket_mb=0.25, transport="tcp")
    with DCSClient(coordinator, names=names, group_timeout_s=10, wire=wire) as dcs:
        dcs.push(shifted(actor, 1.0), version="p-1")  # forms the group
        events.clear()
        served.clear()
        before = eng.weight_version
        report = dcs.push(shifted(actor, 2.0), version="p-2")
    kinds = [what for what, _, _ in events]
    receives = [e for e in events if e[0].startswith(staging + ":")]
    assert len(receives) == 2 * (report.buckets if wire == "gloo" else 1) and all(not paused for _, _, paused in receives)
    pause_at = next(t for what, t, _ in events if what == "pause:start")
    assert max(t for _, t, _ in receives) < pause_at  # every bucket arrived before the pause
    assert served == [before]  # the engine generated, on its old weights, while the push arrived
    # paused only around the swap: pause, apply (while paused), resume
    tail = [k for k in kinds if not k.startswith("stage_weights")]
    assert tail == ["pause:start", "pause:end", "apply_staged_weights:start", "apply_staged_weights:end",
                    "resume:start", "resume:end"]
    apply_paused = [paused for what, _, paused in events if what.startswith("apply_staged_weights")]
    assert apply_paused == [True, True] and eng.weight_version == "p-2"
    assert report.paused_seconds < report.seconds and report.phases["stage"] > report.phases["load"]


@pytest.mark.parametrize("wire", ["socket", "gloo"])
def test_an_engine_refusing_bucket_k_leaves_it_unpaused_on_its_version(engine, actor, monkeypatch, wire):
    eng, url = engine
    names = checkpoint_names(actor)
    coordinator = DCSCoordinator([url], bucket_mb=0.25, transport="tcp", version=0)
    with DCSClient(coordinator, names=names, group_timeout_s=10, wire=wire) as dcs:
        dcs.push(shifted(actor, 3.0), version="r-1")
        k = len(coordinator.buckets()) // 2
        refused = set(coordinator.buckets()[k].names)
        original = eng._plan

        def plan(shapes):
            if any(name in refused for name, _ in shapes):
                raise EngineRequestError("weight update refused, nothing was loaded: 1 shape mismatch(es) (injected)")
            return original(shapes)

        monkeypatch.setattr(eng, "_plan", plan)
        with pytest.raises(DCSPushError) as info:
            dcs.push(shifted(actor, 4.0), version="r-2")
        err = info.value
        # over the socket wire the whole stage is one request (/stage_weights_from_distributed)
        step = "stage_weights_from_distributed" if wire == "socket" else "update_weights_from_distributed"
        assert err.url == url and err.step == step and err.untouched and err.paused == ()
        assert "shape mismatch" in str(err) and "no engine was paused" in str(err)
        assert eng.weight_version == "r-1" and not eng.paused and coordinator.version == "r-1"
        assert one_token(eng) == "r-1"
        assert_holds(eng, shifted(actor, 3.0), names)
        monkeypatch.setattr(eng, "_plan", original)
        state = shifted(actor, 5.0)
        dcs.push(state, version="r-3")  # the group was rebuilt; the push goes through
        assert eng.weight_version == "r-3"
        assert_holds(eng, state, names)


def test_a_broadcast_that_breaks_on_bucket_k_leaves_the_engine_unpaused(engine, actor, monkeypatch):
    """The gloo group's broadcast breaking (test_dcs_wire.py breaks the socket wire)."""
    eng, url = engine
    names = checkpoint_names(actor)
    coordinator = DCSCoordinator([url], bucket_mb=0.25, transport="tcp", version=0)
    with DCSClient(coordinator, names=names, group_timeout_s=10, wire="gloo") as dcs:
        dcs.push(shifted(actor, 6.0), version="b-1")
        group = dcs.transport.group
        k = len(coordinator.buckets()) // 2
        sent = [0]
        original = WeightUpdateGroup.broadcast

        def breaks(self, tensor, src=0, *, async_op=False):
            if self is group:
                sent[0] += 1
                if sent[0] == k + 1:
                    raise RuntimeError("Connection reset by peer (injected)")
            return original(self, tensor, src, async_op=async_op)

        monkeypatch.setattr(WeightUpdateGroup, "broadcast", breaks)
        with pytest.raises(DCSPushError) as info:
            dcs.push(shifted(actor, 7.0), version="b-2")
        err = info.value
        assert err.untouched and err.paused == () and "no engine was paused" in str(err)
        assert eng.weight_version == "b-1" and not eng.paused and coordinator.version == "b-1"
        assert one_token(eng) == "b-1"
        assert_holds(eng, shifted(actor, 6.0), names)
        state = shifted(actor, 8.0)
        report = dcs.push(state, version="b-3")  # a new group; the stage of b-2 was dropped
        assert report.version == "b-3" and eng.weight_version == "b-3"
        assert_holds(eng, state, names)
