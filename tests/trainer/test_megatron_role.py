"""The async engine's actor role on the megatron backend (no Ray: the in-process data bus): one streamed step on
whole groups, one optimiser step, and a weight push under the HF thinker's names."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.run.warmup import demonstration
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.actors.megatron.actor import MegatronActor
from relax_gym.trainer.async_engine.roles.actor import ActorRole
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.rollout.samples import sample_id, trajectory_row

G = 2


class WeightSink:
    def __init__(self):
        self.pushed: list[tuple[int, dict]] = []

    async def push(self, state, version):
        self.pushed.append((version, state))


def test_actor_role_trains_and_pushes_hf_names_on_the_megatron_backend():
    reference, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    rows = []
    for p in range(2):
        for m in range(G):
            r = demonstration(env, processor, p, rng)
            traj = Trajectory(group_id=p, seed=p, input_ids=list(r.input_ids), loss_mask=list(r.loss_mask),
                              rollout_logprobs=[-1.0 if x else 0.0 for x in r.loss_mask], mm=dict(r.mm), reward=float(m))
            rows.append(trajectory_row(traj, sample_id(1, p, m), [1]))
    env.close()
    cfg = RelaxConfig.model_validate({
        "trainer": {"mode": "async", "group_size": G, "prompts_per_step": 2, "sft_warmup_steps": 0},
        "actor": {"backend": "megatron", "micro_batch_size": 2 * G, "lr": 1e-3}, "env": {"id": "nextqa-video"}})

    async def main():
        bus = make_bus("inprocess")
        sink = WeightSink()
        role = ActorRole(cfg.model_dump(mode="json"), bus, pusher=sink)
        try:
            assert isinstance(role.actor, MegatronActor)
            advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
            await bus.open_partition(0, expected_rows=len(rows), group_size=G)
            await bus.put(0, rows)
            await bus.seal(0, len(rows))
            _, res = await asyncio.gather(advantages.process(0, len(rows), G), role.train_step(0, len(rows), G))
        finally:
            role.actor.close()
        return res, sink

    res, sink = asyncio.run(main())
    assert res["version"] == 1 and res["episodes_trained"] == len(rows) and res["metrics"]["grad_norm"] > 0
    (version, state), = sink.pushed
    expected = reference.state_dict()
    assert version == 1 and list(state) == list(expected)  # HF names, HF order
    changed = [k for k in expected if not torch.equal(state[k], expected[k])]
    assert "model.language_model.layers.0.self_attn.q_proj.weight" in changed
