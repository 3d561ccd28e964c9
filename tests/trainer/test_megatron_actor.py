"""The megatron actor: SFT steps lower the loss; an RL step equals the hf backend's (same loss, same gradient, same
update, micro-batch accumulation included); dist_checkpointing round-trips the weights exactly; its HF-named
weights load into an embedded engine (in process, and through a DCS push to an engine process) and change what
it generates."""

from __future__ import annotations

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import preset
from relax_gym.trainer.dcs import DCSClient, DCSCoordinator, checkpoint_names
from relax_gym.trainer.run.warmup import demonstration
from relax_gym.trainer.engines.client import EngineClient
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.engines.process import spawn_engine
from relax_gym.trainer.engines.admin_protocol import serialize_named_tensors
from relax_gym.trainer.dcs.group import GroupReceiver, tensor_digest
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.actors.megatron.actor import CHECKPOINT_DIR, MegatronActor
from relax_gym.trainer.rollout.episode import Trajectory

from .megatron_fixtures import megatron_policy  # noqa: F401 - fixture

PROMPT = "Describe the weather in three words:"
GREEDY = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}


def demonstrations(processor, env_id: str, n: int) -> list:
    env = relax_gym.make(env_id)
    rng = np.random.default_rng(0)
    try:
        return [demonstration(env, processor, s, rng) for s in range(n)]
    finally:
        env.close()


def test_sft_steps_reduce_the_nll():
    torch.manual_seed(0)
    model, processor = build_policy()
    actor = MegatronActor(model, processor, lr=1e-3, micro_batch_size=4)
    try:
        batch = demonstrations(processor, "echo-ink", 8)
        first = actor.sft_step(batch)["sft_nll"]
        for _ in range(9):
            last = actor.sft_step(batch)["sft_nll"]
    finally:
        actor.close()
    assert np.isfinite(first) and last < first * 0.7


def test_an_rl_step_equals_the_hf_backend_step():
    """Two answers to one prompt that differ in the answer letter, advantages +1 / -1, one micro-batch each: both
    backends report the same loss and gradient norm and end at the same weights (plain SGD, so parameters move by
    exactly the gradient); the first letter became more likely, the second less."""
    hf_model, processor = build_policy()
    mc_model, _ = build_policy()
    hf = HFActor(hf_model, processor, lr=1.0, micro_batch_size=1)
    mc = MegatronActor(mc_model, processor, lr=1.0, micro_batch_size=1)
    try:
        for actor in (hf, mc):
            actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1e-2)
        env = relax_gym.make("nextqa-video")
        rng = np.random.default_rng(0)
        good = demonstration(env, processor, 0, rng)
        bad = demonstration(env, processor, 0, rng)
        while bad.input_ids == good.input_ids:  # same prompt, another (random) answer letter
            bad = demonstration(env, processor, 0, rng)
        env.close()
        pos = next(i for i, (a, b) in enumerate(zip(good.input_ids, bad.input_ids)) if a != b)
        items = [Trajectory(group_id=0, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                            rollout_logprobs=[0.0] * len(r.input_ids), mm=r.mm) for r in (good, bad)]
        before = [float(row[pos - 1]) for row in mc.logprobs(items)]
        m_hf = hf.rl_step(items, torch.tensor([1.0, -1.0]), preset("grpo"))
        m_mc = mc.rl_step(items, torch.tensor([1.0, -1.0]), preset("grpo"))
        after = [float(row[pos - 1]) for row in mc.logprobs(items)]
        assert m_mc["grad_norm"] > 0 and abs(m_mc["grad_norm"] - m_hf["grad_norm"]) <= 1e-4 * m_hf["grad_norm"]
        assert abs(m_mc["pg_loss"] - m_hf["pg_loss"]) <= 1e-5
        hf_after, mc_after = hf.state_dict(), mc.state_dict()
        assert max(float((hf_after[k] - mc_after[k]).abs().max()) for k in hf_after) <= 1e-5
        assert after[0] > before[0] and after[1] < before[1]
    finally:
        mc.close()


def test_dist_checkpoint_round_trip_is_exact(megatron_policy, tmp_path):  # noqa: F811
    _, actor = megatron_policy
    saved = {k: v.clone() for k, v in actor.state_dict().items()}
    out = actor.save_checkpoint(tmp_path / "step")
    assert (out / CHECKPOINT_DIR / "metadata.json").is_file() and (out / "tokenizer.json").is_file()
    with torch.no_grad():
        for p in actor.model.parameters():
            p.add_(1.0)
    assert not torch.equal(actor.state_dict()["model.language_model.norm.weight"], saved["model.language_model.norm.weight"])
    actor.load_checkpoint(out)
    restored = actor.state_dict()
    assert all(torch.equal(restored[k], saved[k]) for k in saved)


def test_state_dict_pushed_into_an_embedded_engine_changes_it_to_the_hf_weights(megatron_policy):  # noqa: F811
    """An engine on other weights (seed 1) loads the megatron actor's weights (seed 0, HF names) through
    ``update_weights_from_tensor``: it then holds the HF thinker's weights bit for bit and answers differently."""
    hf_model, actor = megatron_policy
    other, processor = build_policy(PolicyConfig(seed=1))
    with EmbeddedEngine(other, processor) as engine:
        before = engine.generate({"text": PROMPT, "sampling_params": GREEDY}).output_ids
        engine.update_weights_from_tensor([serialize_named_tensors(actor.state_dict())], weight_version="7")
        after = engine.generate({"text": PROMPT, "sampling_params": GREEDY}).output_ids
        assert engine.weight_version == "7"
        loaded = engine.model.state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in hf_model.state_dict().items())
    with EmbeddedEngine(actor.hf_model(), processor) as reference:
        expected = reference.generate({"text": PROMPT, "sampling_params": GREEDY}).output_ids
    assert after != before and after == expected


def test_dcs_push_from_the_megatron_actor_reaches_an_engine_process_with_hf_names(megatron_policy):  # noqa: F811
    _, actor = megatron_policy
    names = checkpoint_names(actor.hf_template)  # state_dict key -> checkpoint name, from the meta-device template
    assert names["model.audio_tower.conv1.weight"] == "audio_tower.conv1.weight"
    engine = spawn_engine(PolicyConfig(seed=1), weight_receiver=GroupReceiver())
    try:
        with EngineClient(engine.url, timeout=60) as client:
            before = client.generate(text=PROMPT, sampling_params=GREEDY).output_ids
            coordinator = DCSCoordinator([engine.url], bucket_mb=0.25, transport="tcp", version=0)
            state = actor.state_dict()
            with DCSClient(coordinator, names=names) as dcs:
                report = dcs.push(state, version=3)
            assert report.version == 3 and report.engines == 1
            local = {names[k]: tensor_digest(v) for k, v in state.items()}
            assert client.weights_checksum(list(local)) == local
            after = client.generate(text=PROMPT, sampling_params=GREEDY)
            assert after.weight_version == "3" and after.output_ids != before
    finally:
        engine.stop()

