"""``nccl`` with the ``disk`` fallback (the transport SGLang engines are pushed with).

On CPU the NCCL transport cannot be built, so the first case is the real "no CUDA here" path. The second case
stands in a gloo (``tcp``) transport for NCCL, with the engine refusing to join the weight-update group: the push
must switch to ``/update_weights_from_disk`` in the same call, finish bit-identical, and stay on disk. A failure
after tensors moved is not turned into a fallback."""

from __future__ import annotations

import pytest
import torch

from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, DCSPushError, checkpoint_names
from relax_gym.trainer.dcs.client import DCSEngineError, EngineLink
from relax_gym.trainer.dcs.fallback import NcclOrDiskTransport
from relax_gym.trainer.dcs.transports import TcpTransport
from relax_gym.trainer.engines.client import EngineClient
from relax_gym.trainer.engines.process import spawn_engine
from relax_gym.trainer.dcs.group import GroupReceiver, tensor_digest
from relax_gym.trainer.policy.model import PolicyConfig, build_policy


@pytest.fixture(scope="module")
def engine():
    proc = spawn_engine(PolicyConfig(seed=0), weight_receiver=GroupReceiver())
    yield proc
    proc.stop()


def assert_bit_identical(url: str, model) -> None:
    names = checkpoint_names(model)
    local = {names[k]: tensor_digest(v) for k, v in model.state_dict().items()}
    with EngineClient(url, timeout=60) as client:
        assert client.weights_checksum(list(local)) == local


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA path")
def test_without_cuda_pushes_go_to_disk_from_the_start(engine, tmp_path):
    model = build_policy(PolicyConfig(seed=5))[0]
    transport = NcclOrDiskTransport(disk_dir=tmp_path)
    assert transport.name == "disk" and "CUDA" in transport.reason
    coordinator = DCSCoordinator([engine.url], transport="nccl")
    with DCSClient(coordinator, names=checkpoint_names(model), transport=transport) as dcs:
        report = dcs.push(model.state_dict(), version=31)
    assert report.transport == "disk" and coordinator.version == 31
    assert_bit_identical(engine.url, model)


def test_a_group_that_does_not_form_switches_the_push_to_disk(engine, tmp_path, monkeypatch):
    refused: list[str] = []

    def refuse(self: EngineLink, *args, **kwargs) -> None:
        refused.append(self.url)
        raise DCSEngineError(self.url, "init_weights_update_group", "Failed to initialize custom process group")

    monkeypatch.setattr(EngineLink, "join_group", refuse)
    transport = NcclOrDiskTransport(disk_dir=tmp_path, nccl_factory=lambda: TcpTransport(group_timeout_s=5))
    assert transport.name == "tcp"  # the stand-in for NCCL is active until it fails
    first, second = build_policy(PolicyConfig(seed=6))[0], build_policy(PolicyConfig(seed=7))[0]
    coordinator = DCSCoordinator([engine.url], transport="nccl")
    with DCSClient(coordinator, names=checkpoint_names(first), transport=transport) as dcs:
        report = dcs.push(first.state_dict(), version=41)
        assert report.transport == "disk" and refused == [engine.url]
        assert "Failed to initialize custom process group" in transport.reason
        assert_bit_identical(engine.url, first)
        report = dcs.push(second.state_dict(), version=42)  # stays on disk: no second attempt at the group
        assert report.transport == "disk" and refused == [engine.url] and coordinator.version == 42
        assert_bit_identical(engine.url, second)
    assert len(list(tmp_path.glob("v42-*"))) == 1 and not list(tmp_path.glob("v41-*"))  # newest shards kept only


def test_a_failure_after_tensors_moved_is_raised_not_hidden(engine, tmp_path, monkeypatch):
    def fail(self: EngineLink, *args, **kwargs) -> None:
        raise DCSEngineError(self.url, "update_weights_from_distributed", "shape mismatch")

    monkeypatch.setattr(EngineLink, "receive_distributed", fail)
    # SGLang stages nothing: the buckets go while the engine is paused, as here
    transport = NcclOrDiskTransport(disk_dir=tmp_path, nccl_factory=lambda: TcpTransport(group_timeout_s=10, staged=False))
    model = build_policy(PolicyConfig(seed=8))[0]
    coordinator = DCSCoordinator([engine.url], transport="nccl")
    dcs = DCSClient(coordinator, names=checkpoint_names(model), transport=transport, group_timeout_s=10)
    try:
        with pytest.raises(DCSPushError, match="update_weights_from_distributed failed: shape mismatch"):
            dcs.push(model.state_dict(), version=51)
        assert transport.name == "tcp" and transport.reason is None and coordinator.version != 51
    finally:
        dcs.resume()
        dcs.close()
