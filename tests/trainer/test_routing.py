"""Routed experts as data: SGLang's wire format, per-episode merging, batching, mismatch counts, bus rows."""

from __future__ import annotations

import asyncio
import base64

import pytest
import torch

from relax_gym.trainer.databus import InProcessBus
from relax_gym.trainer.policy import PolicyConfig
from relax_gym.trainer.policy.config import routing_dims
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.policy.routing import (
    RoutingCounts,
    batch_routing,
    decode_routed_experts,
    encode_routed_experts,
    merge_turn,
    mismatch_counts,
)
from relax_gym.trainer.rollout.samples import ROUTING_FIELD, masked_row, train_items, trajectory_row


def test_wire_format_is_sglangs_flat_row_major_base64():
    ids = torch.tensor([[[0, 3]], [[7, 1]]], dtype=torch.int16)  # 2 positions, 1 layer, top-2
    payload, dtype = encode_routed_experts(ids)
    assert (payload, dtype) == (base64.b64encode(bytes([0, 3, 7, 1])).decode(), "uint8")
    back = decode_routed_experts({"routed_experts": payload, "routed_experts_dtype": dtype}, 1, 2)
    assert back.dtype == torch.int16 and back.tolist() == ids.tolist()
    wide = torch.tensor([[[300, 2]]], dtype=torch.int16)
    assert encode_routed_experts(wide)[1] == "uint16"
    # SGLang's older servers send int32 without a dtype field
    legacy = base64.b64encode(torch.tensor([5, 6, 7, 8], dtype=torch.int32).numpy().tobytes()).decode()
    assert decode_routed_experts({"routed_experts": legacy}, 2, 1).tolist() == [[[5], [6]], [[7], [8]]]


def test_decode_names_what_is_wrong():
    with pytest.raises(ValueError, match="return_routed_experts"):
        decode_routed_experts({}, 1, 2)
    with pytest.raises(ValueError, match="whole number of positions"):
        decode_routed_experts({"routed_experts": base64.b64encode(bytes(3)).decode(), "routed_experts_dtype": "uint8"}, 1, 2)
    with pytest.raises(ValueError, match="routed_experts_dtype 'int8'"):
        decode_routed_experts({"routed_experts": "AA==", "routed_experts_dtype": "int8"}, 1, 1)
    with pytest.raises(ValueError, match="base64"):
        decode_routed_experts({"routed_experts": "@@", "routed_experts_dtype": "uint8"}, 1, 1)


def test_merge_keeps_first_records_and_appends_new_positions():
    so_far = torch.tensor([[[1]], [[2]]], dtype=torch.int16)
    turn = torch.tensor([[[9]], [[9]], [[3]], [[4]]], dtype=torch.int16)
    assert merge_turn(so_far, turn).flatten().tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="shape"):
        merge_turn(so_far, torch.zeros(3, 2, 1, dtype=torch.int16))


def test_batch_routing_right_pads_with_minus_one():
    out = batch_routing([torch.tensor([[[1, 2]]], dtype=torch.int16), None], 3, 1, 2)
    assert out.tolist() == [[[[1, 2]], [[-1, -1]], [[-1, -1]]], [[[-1, -1]], [[-1, -1]], [[-1, -1]]]]
    with pytest.raises(ValueError, match="row 0"):
        batch_routing([torch.zeros(2, 3, 2, dtype=torch.int16)], 3, 1, 2)


def test_mismatch_counts_ignore_slot_order():
    recorded = torch.tensor([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])  # (N=2, L=2, K=2)
    chosen = torch.tensor([[[1, 0], [2, 5]], [[4, 6], [7, 0]]])
    # layer 0: {0,1} vs {1,0} none missing, {4,5} vs {4,6} misses 5; layer 1: {2,3} vs {2,5} misses 3, {6,7} vs {7,0} 6
    assert mismatch_counts(recorded, chosen).tolist() == [1, 2]
    counts = RoutingCounts()
    rec = recorded.unsqueeze(0)  # (B=1, T=2, L, K)
    counts.add(rec, [chosen[:, 0].unsqueeze(0), chosen[:, 1].unsqueeze(0)], [rec[0, :, 0].unsqueeze(0), rec[0, :, 1].unsqueeze(0)],
               torch.tensor([[True, True]]))
    m = counts.metrics()
    assert m["routing_mismatch_l0"] == 1 / 4 and m["routing_mismatch_l1"] == 2 / 4
    assert m["routing_mismatch"] == 3 / 8 and m["routing_mismatch_used"] == 0.0 and m["routing_tokens"] == 2


def test_rows_carry_routing_as_an_int16_tensor_through_the_bus():
    routing = routing_dims(PolicyConfig(family="qwen3_omni_moe", num_layers=3, moe_top_k=2))
    assert routing == (3, 2) and routing_dims(PolicyConfig()) is None
    traj = Trajectory(group_id=0, seed=1, input_ids=[5, 6, 7], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -2.0],
                      routed_experts=torch.tensor([[[0, 1], [2, 3], [4, 5]], [[1, 0], [3, 2], [5, 4]]], dtype=torch.int16))
    row = trajectory_row(traj, "s1", [1])
    empty = masked_row("s2", 0, 1, routing)
    assert row[ROUTING_FIELD].dtype == torch.int16 and empty[ROUTING_FIELD].shape == (0, 3, 2)

    async def main():
        bus = InProcessBus()
        try:
            await bus.put(0, [{**row, "advantages": 1.0, "keep": True}, {**empty, "advantages": 0.0, "keep": True}])
            fields = ["group_id", "tokens", "loss_mask", "rollout_logprobs", "mm_inputs", "status", "trainable",
                      "policy_version", "policy_versions", "advantages", "keep", ROUTING_FIELD]
            batch = await bus.fetch(0, "actor", fields, 2, timeout=5)
            return train_items(batch.sample_ids, batch.fields)
        finally:
            await bus.close()

    items = {it.sample_id: it for it in asyncio.run(main())}
    assert torch.equal(items["s1"].routed_experts, traj.routed_experts)
    assert items["s2"].routed_experts.shape == (0, 3, 2)
