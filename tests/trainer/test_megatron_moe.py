"""The Qwen3-Omni MoE thinker on the megatron backend (megatron-core MoE layers, CPU, fp32, one process):

- HF -> Megatron -> HF is bit-exact (dict level, with expert-parallel shards, and through the live model);
- HF and Megatron token log-probs agree within 1e-4 on rendered video / audio / image episodes (interleaved mrope
  and deepstack included), and a nudged expert weight breaks that;
- routing replay (R3) on megatron-core's routers forces recorded experts that differ from the router's own choice:
  the used experts equal the record, the log-probs change and equal the hf backend's under the same replay, and the
  mismatch metrics say so;
- one RL step of the hf and the megatron actor gives the same loss and the same weights (within 1e-4).
"""

from __future__ import annotations

import copy

import pytest
import torch

from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.actors.megatron import moe
from relax_gym.trainer.actors.megatron.actor import MegatronActor
from relax_gym.trainer.actors.megatron.replay import megatron_routers, replay_routing
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.policy.routers import replay_routing as hf_replay_routing
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.tools.megatron_check import TOLERANCE, demonstration_batch, logprob_gap

pytestmark = pytest.mark.timeout(600)

P = "model.language_model."
CFG = PolicyConfig(family="qwen3_omni_moe")  # 2 layers, 8 experts, top-2


@pytest.fixture(scope="module")
def moe_pair():
    """``(HF MoE thinker, MegatronActor)`` on the same seed-0 weights, and the demonstration batch."""
    hf_model, processor = build_policy(CFG)
    mc_model, _ = build_policy(CFG)
    actor = MegatronActor(mc_model, processor, lr=1e-3, micro_batch_size=8)
    items = demonstration_batch(processor, per_env=1)
    yield hf_model, actor, items
    actor.close()


def _trajectories(items, routed=None):
    return [Trajectory(group_id=i, seed=i, input_ids=list(it.input_ids), loss_mask=list(it.loss_mask),
                       rollout_logprobs=[0.0] * len(it.input_ids), mm=it.mm,
                       routed_experts=None if routed is None else routed[i]) for i, it in enumerate(items)]


# -- conversion -------------------------------------------------------------------------------------------------------

def test_expert_blocks_per_expert_parallel_rank():
    assert list(moe.local_experts(8, 2, 0)) == [0, 1, 2, 3] and list(moe.local_experts(8, 2, 1)) == [4, 5, 6, 7]
    assert list(moe.local_experts(8, 1, 0)) == list(range(8))
    full = torch.arange(8 * 3).view(8, 3)
    shards = [moe.shard_experts(full, 4, r) for r in range(4)]
    assert shards[2].tolist() == [[12, 13, 14], [15, 16, 17]]
    assert torch.equal(moe.gather_expert_shards(shards), full)
    with pytest.raises(ValueError, match="do not split"):
        moe.local_experts(8, 3, 0)


def test_hf_megatron_hf_round_trip_is_bit_exact_also_in_expert_parallel_shards():
    model, _ = build_policy(CFG)
    text = model.config.get_text_config()
    hf = model.state_dict()
    shape = moe.MoEShape.of(text)
    assert (shape.num_layers, shape.num_experts, shape.top_k, shape.norm_topk_prob) == (2, 8, 2, True)
    one = moe.hf_to_megatron_experts(hf, shape, prefix=P)
    # expert 5 of layer 1: its gate rows then its up rows, as HF's gate_up_proj[5]; its down projection
    assert torch.equal(one["decoder.layers.1.mlp.experts.local_experts.5.linear_fc1.weight"], hf[f"{P}layers.1.mlp.experts.gate_up_proj"][5])
    assert torch.equal(one["decoder.layers.1.mlp.experts.local_experts.5.linear_fc2.weight"], hf[f"{P}layers.1.mlp.experts.down_proj"][5])
    assert torch.equal(one["decoder.layers.0.mlp.router.weight"], hf[f"{P}layers.0.mlp.gate.weight"])
    ranks = [moe.hf_to_megatron_experts(hf, shape, prefix=P, ep_size=2, ep_rank=r) for r in range(2)]
    # rank 1 holds global expert 5 as its local expert 1, and only 4 experts per layer
    assert torch.equal(ranks[1]["decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight"], hf[f"{P}layers.1.mlp.experts.gate_up_proj"][5])
    assert not any(".local_experts.4." in k for k in ranks[1])
    moe_keys = {k for k in hf if k.startswith(P) and ".mlp." in k}
    for back in (moe.megatron_to_hf_experts([one], shape, prefix=P), moe.megatron_to_hf_experts(ranks, shape, prefix=P)):
        assert set(back) == moe_keys
        assert all(torch.equal(back[k], hf[k]) for k in moe_keys)


def test_live_megatron_moe_thinker_round_trip_is_bit_exact(moe_pair):
    hf_model, actor, _ = moe_pair
    layer = actor.model.model.language_model.gpt.decoder.layers[0]
    assert type(layer.mlp).__name__ == "MoELayer" and type(layer.mlp.experts).__name__ == "SequentialMLP"
    assert len(layer.mlp.experts.local_experts) == 8 and layer.self_attention.q_layernorm is not None
    reference = hf_model.state_dict()
    converted = actor.state_dict()
    assert list(converted) == list(reference)
    assert all(torch.equal(converted[k], reference[k]) for k in reference)
    actor.load_weights({k: v.clone() for k, v in reference.items()})  # and back in: still the same
    assert all(torch.equal(actor.state_dict()[k], reference[k]) for k in reference)


def test_dist_checkpoint_round_trip_of_the_moe_thinker_is_exact(moe_pair, tmp_path):
    _, actor, _ = moe_pair
    saved = {k: v.clone() for k, v in actor.state_dict().items()}
    out = actor.save_checkpoint(tmp_path / "step")
    with torch.no_grad():
        for p in actor.model.parameters():
            p.add_(1.0)
    key = f"{P}layers.1.mlp.experts.down_proj"
    assert not torch.equal(actor.state_dict()[key], saved[key])
    actor.load_checkpoint(out)
    restored = actor.state_dict()
    assert all(torch.equal(restored[k], saved[k]) for k in saved)


# -- log-probs ---------------------------------------------------------------------------------------------------------

def test_hf_and_megatron_moe_logprobs_agree(moe_pair):
    hf_model, actor, items = moe_pair
    batch = actor.processor.collate(items)
    assert {"pixel_values_videos", "input_features", "pixel_values"} <= set(batch)
    seen = []
    hook = actor.model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs.get("deepstack_visual_embeds")), with_kwargs=True)
    try:
        gap, tokens = logprob_gap(HFActor(hf_model, actor.processor, lr=1e-3), actor, items)
    finally:
        hook.remove()
    assert seen and seen[0] is not None and len(seen[0]) == 1  # the vision tower's deepstack level reached the decoder
    assert tokens > 30
    assert gap <= TOLERANCE


def test_a_changed_megatron_expert_changes_the_logprobs(moe_pair):
    hf_model, actor, items = moe_pair
    weights = [e.linear_fc2.weight for layer in actor.model.model.language_model.gpt.decoder.layers
               for e in layer.mlp.experts.local_experts]
    saved = [w.detach().clone() for w in weights]
    try:
        with torch.no_grad():
            for w in weights:
                w.add_(0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))
        gap, _ = logprob_gap(HFActor(hf_model, actor.processor, lr=1e-3), actor, items)
    finally:
        with torch.no_grad():
            for w, s in zip(weights, saved):
                w.copy_(s)
    assert gap > 100 * TOLERANCE


# -- routing replay ----------------------------------------------------------------------------------------------------

def _natural_routing(hf_model, processor, items):
    """Per item ``(tokens, layers, K)``: the experts the HF thinker's routers pick on the item's tokens."""
    batch = processor.collate(items, padding_side="right")
    batch.pop("loss_mask")
    with torch.no_grad(), hf_replay_routing(hf_model, None, batch=len(items)) as trace:
        hf_model.model(**batch, use_cache=False)
    natural = torch.stack(trace.natural, dim=2)  # (B, T, L, K)
    return [natural[b, : len(it.input_ids)].clone() for b, it in enumerate(items)]


def _other_experts(natural, num_experts):
    """A record that differs from the routers' choice: each expert id shifted by half the experts (distinct ids stay
    distinct); the last 3 positions of each item have no record (-1) and must route freely."""
    out = []
    for rec in natural:
        other = ((rec + num_experts // 2) % num_experts).to(torch.int16)
        other[-3:] = -1
        out.append(other)
    return out


def test_replay_forces_recorded_experts_that_the_router_would_not_pick(moe_pair):
    hf_model, actor, items = moe_pair
    processor = actor.processor
    natural = _natural_routing(hf_model, processor, items)
    record = _other_experts(natural, 8)
    free_items, replay_items = _trajectories(items), _trajectories(items, record)

    # the megatron routers' own choice equals the HF routers' choice (same weights)
    batch = processor.collate(free_items, padding_side="right")
    batch.pop("loss_mask")
    width = batch["input_ids"].shape[1]
    recorded = torch.full((len(items), width, 2, 2), -1, dtype=torch.long)
    for b, rec in enumerate(record):
        recorded[b, : len(rec)] = rec.long()
    with torch.no_grad(), replay_routing(actor.model, None, batch=len(items)) as free:
        actor.model.model(**batch, use_cache=False)
    with torch.no_grad(), replay_routing(actor.model, recorded, batch=len(items)) as forced:
        actor.model.model(**batch, use_cache=False)
    for b, nat in enumerate(natural):
        n = len(nat)
        mc_nat = torch.stack(free.natural, dim=2)[b, :n]
        assert torch.equal(mc_nat.sort(-1).values, nat.sort(-1).values)
    used = torch.stack(forced.used, dim=2)
    has = (recorded >= 0).all(-1).all(-1)  # (B, T)
    assert torch.equal(torch.stack(forced.forced, dim=2).all(-1), has)
    assert torch.equal(used[has], recorded[has])  # every recorded token used exactly the recorded experts
    unrecorded = ~has
    assert torch.equal(used[unrecorded], torch.stack(forced.natural, dim=2)[unrecorded])  # -1 rows route freely
    assert all(r.router_replay.router_replay_action is None for r in megatron_routers(actor.model))  # disarmed

    # through the actor: the metrics, the log-probs
    actor.routing_replay = False
    try:
        with torch.no_grad():
            lps_free, mask = actor.forward_logprobs(replay_items)  # records present, not replayed: measured only
        m_free = actor._routing_metrics()
        actor.routing_replay = True
        with torch.no_grad():
            lps_replay, _ = actor.forward_logprobs(replay_items)
        m_replay = actor._routing_metrics()
    finally:
        actor.routing_replay = False
    where = mask.bool()
    assert m_free["routing_mismatch"] > 0.5 and m_free["routing_mismatch_used"] == pytest.approx(m_free["routing_mismatch"])
    assert m_replay["routing_mismatch_used"] == 0.0 and m_replay["routing_mismatch_l0"] > 0.5
    assert m_replay["routing_tokens"] == sum(len(r) - 3 for r in record)
    assert float((lps_free - lps_replay)[where].abs().max()) > 100 * TOLERANCE  # the forced experts were used
    # the hf backend under the same replay gives the same log-probs
    hf_actor = HFActor(hf_model, processor, lr=1e-3, routing_replay=True)
    with torch.no_grad():
        lps_hf, _ = hf_actor.forward_logprobs(replay_items)
    assert float((lps_hf - lps_replay)[where].abs().max()) <= TOLERANCE


# -- training ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("replay", [False, True], ids=["free", "replayed"])
def test_an_rl_step_equals_the_hf_backend_step(moe_pair, replay):
    """hf vs megatron, one GRPO step over 3 episodes in micro-batches of 2 (accumulation), plain SGD: same loss,
    same gradient norm, same weights afterwards; with replay both force the same (non-natural) experts."""
    hf_model, ref_actor, items = moe_pair
    processor = ref_actor.processor
    record = _other_experts(_natural_routing(hf_model, processor, items), 8) if replay else None
    batch = _trajectories(items, record)
    hf = HFActor(copy.deepcopy(hf_model), processor, lr=1.0, micro_batch_size=2, routing_replay=replay)
    mc_model, _ = build_policy(CFG)
    mc = MegatronActor(mc_model, processor, lr=1.0, micro_batch_size=2, routing_replay=replay)
    try:
        for actor in (hf, mc):
            actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1e-2)
        adv = torch.tensor([1.0, -1.0, 0.5])
        m_hf = hf.rl_step(batch, adv, preset("grpo"))
        m_mc = mc.rl_step(batch, adv, preset("grpo"))
        assert m_mc["grad_norm"] > 0 and abs(m_mc["grad_norm"] - m_hf["grad_norm"]) <= 1e-4 * m_hf["grad_norm"]
        assert abs(m_mc["pg_loss"] - m_hf["pg_loss"]) <= 1e-4
        if replay:
            assert m_mc["routing_mismatch_used"] == 0.0 and m_hf["routing_mismatch_used"] == 0.0
            assert m_mc["routing_mismatch"] == pytest.approx(m_hf["routing_mismatch"], abs=1e-6)
        before, hf_after, mc_after = hf_model.state_dict(), hf.state_dict(), mc.state_dict()
        assert max(float((hf_after[k] - mc_after[k]).abs().max()) for k in hf_after) <= 1e-4
        moved = [k for k in hf_after if ".mlp." in k and not torch.equal(mc_after[k], before[k])]
        assert any("experts" in k for k in moved) and any("gate.weight" in k for k in moved)  # experts and routers learn
    finally:
        mc.close()
