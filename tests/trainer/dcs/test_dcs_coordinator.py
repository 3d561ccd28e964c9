"""The DCS coordinator and its pure parts: bucket plans, weight metadata, topology and versions, transport
selection (nccl included, which cannot run here), and the flattened-bucket codec."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as dist

from relax_gym.trainer.dcs import (
    DCSCoordinator,
    DiskTransport,
    NcclTransport,
    TcpTransport,
    TensorMeta,
    WeightMetadata,
    make_transport,
    plan_buckets,
)
from relax_gym.trainer.dcs.coordinator import MIB
from relax_gym.trainer.dcs.transports import DistributedTransport
from relax_gym.trainer.dcs.group import WeightUpdateGroup, flatten_tensors, tensor_digest, unflatten_tensors


def metas(sizes: list[int]) -> list[TensorMeta]:
    return [TensorMeta(f"t{i}", (n,), "uint8", n) for i, n in enumerate(sizes)]


# ---------------------------------------------------------------------------------------------- buckets


@pytest.mark.parametrize("bucket", [1, 7, 10, 64, 1000])
def test_buckets_respect_the_size_and_hold_every_tensor_once_in_order(bucket):
    tensors = metas([3, 5, 2, 9, 1, 1, 12, 4, 4, 4, 30, 2])
    buckets = plan_buckets(tensors, bucket)
    flat = [name for b in buckets for name in b.names]
    assert flat == [t.name for t in tensors]  # each tensor exactly once, in the given order
    sizes = {t.name: t.nbytes for t in tensors}
    for b in buckets:
        assert b.nbytes == sum(sizes[n] for n in b.names)
        assert b.nbytes <= bucket or len(b.names) == 1  # only a tensor larger than the bucket travels alone over it
    assert [b.index for b in buckets] == list(range(len(buckets)))
    for a, b in zip(buckets, buckets[1:]):  # greedy: the next tensor did not fit
        assert a.nbytes + sizes[b.names[0]] > bucket
    assert plan_buckets(tensors, bucket) == buckets  # deterministic


def test_bucket_edge_cases():
    assert plan_buckets([], 10) == []
    (only,) = plan_buckets(metas([100]), 10)
    assert only.names == ("t0",) and only.nbytes == 100
    assert [b.names for b in plan_buckets(metas([5, 5, 5]), 10)] == [("t0", "t1"), ("t2",)]
    with pytest.raises(ValueError, match="at least 1 byte"):
        plan_buckets(metas([1]), 0)


# ---------------------------------------------------------------------------------------------- metadata


def test_metadata_from_a_state_dict_renames_and_skips_aliases():
    embed = torch.zeros(4, 3)
    state = {"model.embed.weight": embed, "model.norm.weight": torch.ones(3, dtype=torch.bfloat16),
             "lm_head.weight": embed, "empty": torch.zeros(0), "empty2": torch.zeros(0)}
    meta = WeightMetadata.from_state_dict(state, {"model.embed.weight": "embed_tokens.weight"})
    assert meta.names == ["embed_tokens.weight", "model.norm.weight", "empty", "empty2"]
    assert meta.aliases == {"lm_head.weight": "embed_tokens.weight"}
    assert meta.by_name()["model.norm.weight"] == TensorMeta("model.norm.weight", (3,), "bfloat16", 6)
    assert meta.nbytes == 4 * 3 * 4 + 6
    with pytest.raises(ValueError, match="same name"):
        WeightMetadata.from_state_dict({"a": torch.zeros(1), "b": torch.zeros(1)}, lambda key: "x")


def test_policy_metadata_uses_checkpoint_names():
    from relax_gym.trainer.dcs import checkpoint_names
    from relax_gym.trainer.policy.model import PolicyConfig, build_policy

    model, _ = build_policy(PolicyConfig())
    names = checkpoint_names(model)
    assert set(names) == set(model.state_dict())
    meta = WeightMetadata.from_state_dict(model.state_dict(), names)
    assert "audio_tower.conv1.weight" in meta.names and "model.embed_tokens.weight" in meta.names
    assert meta.aliases == {"lm_head.weight": "model.embed_tokens.weight"}  # tied: sent once


# ---------------------------------------------------------------------------------------------- coordinator


def test_topology_ranks_and_epochs():
    c = DCSCoordinator(["http://a:1/", "http://b:2"])
    assert [(e.url, e.rank) for e in c.engines] == [("http://a:1", 1), ("http://b:2", 2)] and c.world_size == 3
    epoch = c.topology_epoch
    assert c.add_engine("http://a:1").rank == 1 and c.topology_epoch == epoch  # idempotent
    c.add_engine("http://c:3")
    c.remove_engine("http://a:1")
    assert [(e.url, e.rank) for e in c.engines] == [("http://b:2", 1), ("http://c:3", 2)]
    assert c.topology_epoch == epoch + 2
    c.engine_restarted("http://b:2")
    assert c.topology_epoch == epoch + 3
    with pytest.raises(KeyError, match="http://zz:9"):
        c.remove_engine("http://zz:9")
    with pytest.raises(ValueError, match="http://"):
        c.add_engine("a:1")


def test_versions_move_only_when_every_engine_holds_them():
    c = DCSCoordinator(["http://a:1", "http://b:2"], version=3)
    c.commit(4, ["http://a:1"])
    assert c.version == 3 and c.engine_versions == {"http://a:1": 4, "http://b:2": None}
    c.commit(4, ["http://b:2"])
    assert c.version == 4
    c.engine_restarted("http://b:2")
    assert c.engine_versions["http://b:2"] is None and c.version == 4
    with pytest.raises(KeyError, match="http://x:1"):
        c.commit(5, ["http://x:1"])


def test_coordinator_plans_pickles_and_restores():
    c = DCSCoordinator(["http://a:1"], bucket_mb=1.0, transport="disk")
    with pytest.raises(RuntimeError, match="no weight metadata"):
        c.buckets()
    assert c.push_plan().weights is None and c.push_plan().buckets == ()
    c.set_weights(WeightMetadata(tuple(TensorMeta(f"w{i}", (MIB // 4,), "float32", MIB) for i in range(3))))
    assert [b.names for b in c.buckets()] == [("w0",), ("w1",), ("w2",)]
    assert [b.names for b in c.buckets(bucket_mb=2)] == [("w0", "w1"), ("w2",)]
    c.commit(7)
    clone = pickle.loads(pickle.dumps(c))
    assert clone.push_plan() == c.push_plan()
    restored = DCSCoordinator.restore(c.snapshot())
    assert restored.push_plan() == c.push_plan() and restored.engine_versions == {"http://a:1": 7}
    with pytest.raises(ValueError, match="unknown transport 'carrier-pigeon'"):
        DCSCoordinator(transport="carrier-pigeon")
    with pytest.raises(ValueError, match="bucket_mb"):
        DCSCoordinator(bucket_mb=0)


# ---------------------------------------------------------------------------------------------- transports


def test_transport_selection(tmp_path):
    assert isinstance(make_transport("tcp"), TcpTransport) and make_transport("tcp").backend == "gloo"
    disk = make_transport("disk", disk_dir=tmp_path / "w")
    assert isinstance(disk, DiskTransport) and disk.directory == tmp_path / "w" and disk.directory.is_dir()
    with pytest.raises(ValueError, match="unknown DCS transport 'udp'.*tcp, nccl, disk"):
        make_transport("udp")


def test_nccl_refuses_clearly_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # what this CPU machine says anyway
    with pytest.raises(RuntimeError, match=r"'nccl' needs CUDA.*torch.cuda.is_available\(\) is False"):
        make_transport("nccl")
    with pytest.raises(RuntimeError, match="needs CUDA"):
        WeightUpdateGroup("127.0.0.1", 1, 0, 2, backend="nccl")
    with pytest.raises(ValueError, match="choose from gloo, nccl"):
        WeightUpdateGroup("127.0.0.1", 1, 0, 2, backend="mpi")


def test_nccl_selection_where_cuda_exists(monkeypatch):
    """On a CUDA machine the nccl transport is the tcp code with backend nccl and tensors on the GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    transport = make_transport("nccl", device="cuda:1", flatten=True)
    assert isinstance(transport, NcclTransport) and isinstance(transport, DistributedTransport)
    assert transport.backend == "nccl" and transport.device == torch.device("cuda", 1) and transport.flatten is True
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(RuntimeError, match="torch build with NCCL"):
        make_transport("nccl", device="cuda:0")


def test_flattened_bucket_round_trip():
    tensors = [torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.arange(6, dtype=torch.int64).view(2, 3),
               torch.tensor(2.5), torch.randn(4, 2).t()]  # mixed dtypes, a scalar, a non-contiguous view
    flat = flatten_tensors(tensors)
    assert flat.dtype == torch.uint8 and flat.numel() == sum(t.numel() * t.element_size() for t in tensors)
    back = unflatten_tensors(flat, [t.dtype for t in tensors], [t.shape for t in tensors])  # misaligned offsets: copied
    assert [tensor_digest(a) for a in back] == [tensor_digest(b) for b in tensors]
    out = torch.empty(flat.numel() + 10, dtype=torch.uint8)
    assert torch.equal(flatten_tensors(tensors, out=out), flat)
    with pytest.raises(ValueError, match="bytes"):
        unflatten_tensors(flat[:-1], [t.dtype for t in tensors], [t.shape for t in tensors])
    with pytest.raises(ValueError, match="at least"):
        flatten_tensors(tensors, out=torch.empty(3, dtype=torch.uint8))
    assert tensor_digest(torch.zeros(2)) != tensor_digest(torch.zeros(2, dtype=torch.float64))
    assert tensor_digest(torch.zeros(2, 1)) != tensor_digest(torch.zeros(1, 2))
