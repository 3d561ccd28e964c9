"""Routing replay (R3) on the tiny Qwen3-Omni MoE thinker: the embedded engine records the routed experts of every
forwarded token, and a training forward under replay selects exactly those experts and reproduces the rollout's
log-probs; without replay a perturbed router is caught as mismatch."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
import torch

from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.engines.client import EngineClient, GenerateOutput
from relax_gym.trainer.engines.embedded import EmbeddedEngine, EngineRequestError
from relax_gym.trainer.engines.http_server import serve
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.policy.routers import moe_routers, replay_routing, routing_shape
from relax_gym.trainer.policy.routing import decode_routed_experts

pytestmark = pytest.mark.timeout(300)

LAYERS, TOP_K = 2, 2


@dataclass
class Item:
    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    routed_experts: torch.Tensor | None
    mm: dict[str, torch.Tensor] = field(default_factory=dict)


@pytest.fixture(scope="module")
def moe_policy():
    return build_policy(PolicyConfig(family="qwen3_omni_moe", num_layers=LAYERS, moe_top_k=TOP_K, num_experts=8))


@pytest.fixture(scope="module")
def rollout(moe_policy):
    """Two sampled completions of prompts of different lengths (the engine left-pads them in one batch), with
    their log-probs and routed experts, from an engine on a copy of the policy's weights."""
    model, processor = moe_policy
    engine = EmbeddedEngine(copy.deepcopy(model), processor)
    # the first prompt twice: the engine prefills it once and copies its routing record to both rows (shared prefill)
    first = processor.encode_text("what moves to the left in the clip?")
    prompts = [first, processor.encode_text("count"), list(first)]
    try:
        outs = engine.generate({"input_ids": prompts, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "ignore_eos": True},
                                "return_logprob": True, "return_routed_experts": True})
        assert engine.stats()["shared_prefill_rows"] == 1
    finally:
        engine.close()
    items = []
    for prompt, out in zip(prompts, outs):
        js = out.to_json()
        routed = decode_routed_experts(js["meta_info"], LAYERS, TOP_K)
        assert routed.shape == (len(prompt) + len(out.output_ids) - 1, LAYERS, TOP_K)
        assert js["meta_info"]["routed_experts_dtype"] == "uint8"
        lps = [lp for lp, _, _ in js["meta_info"]["output_token_logprobs"]]
        items.append(Item(prompt + out.output_ids, [0] * len(prompt) + [1] * len(out.output_ids),
                          [0.0] * len(prompt) + lps, routed))
    return items


def _padded(items):
    width = max(len(it.input_ids) for it in items)
    out = torch.full((len(items), width, LAYERS, TOP_K), -1, dtype=torch.long)
    for b, it in enumerate(items):
        out[b, : len(it.routed_experts)] = it.routed_experts.long()
    return out


def _rollout_logprobs(items, shape):
    out = torch.zeros(shape)
    for b, it in enumerate(items):
        out[b, : len(it.input_ids) - 1] = torch.tensor(it.rollout_logprobs[1:])
    return out


def test_the_engine_records_what_a_full_forward_routes(moe_policy, rollout):
    model, _ = moe_policy
    for it in rollout:
        ids = torch.tensor([it.input_ids])
        with torch.no_grad(), replay_routing(model, None, batch=1) as trace:
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
        natural = torch.stack(trace.natural, dim=2)[0, : len(it.routed_experts)]
        assert torch.equal(natural.sort(-1).values, it.routed_experts.long().sort(-1).values)


def test_replay_selects_the_recorded_experts_and_reproduces_the_rollout_logprobs(moe_policy, rollout):
    model, processor = moe_policy
    actor = HFActor(model, processor, lr=1e-3, routing_replay=True)
    recorded = _padded(rollout)
    batch = processor.collate(rollout, padding_side="right")
    batch.pop("loss_mask")
    with torch.no_grad(), replay_routing(model, recorded, batch=len(rollout)) as trace:
        model.model(**batch, use_cache=False)
    used, forced = torch.stack(trace.used, dim=2), torch.stack(trace.forced, dim=2)
    has = (recorded >= 0).all(-1)
    assert torch.equal(used[has], recorded[has])  # bit-exact: the recorded ids, in the recorded order
    assert forced.equal(has)
    with torch.no_grad():
        lps, mask = actor.forward_logprobs(rollout)
    rollout_lps = _rollout_logprobs(rollout, lps.shape)
    assert mask.sum() == sum(len(it.input_ids) - sum(1 for m in it.loss_mask if not m) for it in rollout)
    torch.testing.assert_close(lps * mask, rollout_lps * mask, atol=1e-5, rtol=0)
    metrics = actor._routing_metrics()
    assert metrics["routing_mismatch_used"] == 0.0 and metrics["routing_mismatch"] == 0.0
    assert metrics["routing_tokens"] == sum(len(it.routed_experts) for it in rollout)


def test_a_perturbed_router_mismatches_without_replay_and_not_with_it(moe_policy, rollout):
    model, processor = moe_policy
    perturbed = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for router in moe_routers(perturbed):
            router.weight.add_(torch.randn(router.weight.shape, generator=gen) * router.weight.std() * 2)
    algo = AlgorithmConfig()
    adv = torch.tensor([1.0, -1.0, 0.5])
    free = HFActor(copy.deepcopy(perturbed), processor, lr=1e-3, routing_replay=False)
    m_free = free.rl_step(rollout, adv, algo)
    assert m_free["routing_mismatch"] > 0.05
    assert m_free["routing_mismatch_used"] == pytest.approx(m_free["routing_mismatch"], abs=1e-6)
    assert {f"routing_mismatch_l{i}" for i in range(LAYERS)} <= set(m_free)

    replayed = HFActor(copy.deepcopy(perturbed), processor, lr=1e-3, routing_replay=True)
    free_copy = HFActor(copy.deepcopy(perturbed), processor, lr=1e-3, routing_replay=False)
    for actor in (replayed, free_copy):
        actor.optimizer.zero_grad()
        lps, mask = actor.forward_logprobs(rollout)
        (lps * mask).sum().backward()
    router = moe_routers(replayed.model)[0]
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0  # gradients still reach the router
    assert not torch.equal(router.weight.grad, moe_routers(free_copy.model)[0].weight.grad)  # other experts: other grads
    m_replay = replayed.rl_step(rollout, adv, algo)
    assert m_replay["routing_mismatch_used"] == 0.0
    # the router's own choice is still measured: the same in the first layer (same input); later layers see the
    # replayed experts' outputs
    assert m_free["routing_mismatch_l0"] > 0
    assert m_replay["routing_mismatch_l0"] == pytest.approx(m_free["routing_mismatch_l0"], abs=1e-6)


def test_the_patch_is_gone_after_the_block_even_on_error(moe_policy):
    model, _ = moe_policy
    routers = moe_routers(model)
    with pytest.raises(RuntimeError, match="boom"):
        with replay_routing(model, None, batch=1):
            assert all("forward" in r.__dict__ for r in routers)
            raise RuntimeError("boom")
    assert all("forward" not in r.__dict__ for r in routers)
    with pytest.raises(ValueError, match="does not fit"):
        with replay_routing(model, torch.zeros(1, 3, LAYERS + 1, TOP_K, dtype=torch.long), batch=1):
            pass
    assert all("forward" not in r.__dict__ for r in routers)


def test_routing_travels_over_http_in_sglang_format(moe_policy):
    model, processor = moe_policy
    engine = EmbeddedEngine(copy.deepcopy(model), processor)
    server = serve(engine, port=0)
    client = EngineClient(server.url)
    try:
        prompt = processor.encode_text("left or right")
        out: GenerateOutput = client.generate(prompt, sampling_params={"max_new_tokens": 4, "ignore_eos": True},
                                              return_routed_experts=True)
        routed = decode_routed_experts(out.meta_info, *routing_shape(model))
        assert routed.shape == (len(prompt) + 3, LAYERS, TOP_K) and routed.dtype == torch.int16
        plain = client.generate(prompt, sampling_params={"max_new_tokens": 2})
        assert "routed_experts" not in plain.meta_info
    finally:
        client.close()
        server.close()
        engine.close()


def test_a_dense_policy_refuses_routing(policy_dense):
    model, processor = policy_dense
    engine = EmbeddedEngine(model, processor)
    try:
        with pytest.raises(EngineRequestError, match="mixture-of-experts"):
            engine.generate({"input_ids": processor.encode_text("hi"), "return_routed_experts": True})
    finally:
        engine.close()
    with pytest.raises(ValueError, match="dense"):
        HFActor(model, processor, lr=1e-3, routing_replay=True)


@pytest.fixture(scope="module")
def policy_dense():
    return build_policy(PolicyConfig(num_layers=1))
