"""PPO in the async engine's roles, without Ray, on the in-process data bus:

- one step through the critic role (values), the advantages role (GAE), the actor role and the critic role's update
  ends at the same actor and critic weights as the colocate trainer's PPO step on the same episodes;
- masked episodes get empty value / advantage / return rows and reach neither loss;
- the critic role's checkpoint round-trips (a resumed role answers the same values), it refuses to save a state
  that is not the checkpoint step's, and a replacement replica refuses work (its training state is gone);
- plan_roles deploys the critic (with the checkpoint to resume from) only under ppo;
- the supervisor treats the critic as a stateful role: a replaced critic replica, or a critic call whose replica died,
  asks for a global restart (never a retry).
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import relax_gym
from relax_gym.trainer.actors.factory import build_actor, build_critic
from relax_gym.trainer.async_engine.controller import plan_roles
from relax_gym.trainer.async_engine.recovery import (
    GlobalRestart,
    ReplacedActorError,
    ReplicaRegistry,
    Supervisor,
)
from relax_gym.trainer.async_engine.roles import critic as critic_module
from relax_gym.trainer.async_engine.roles.actor import ActorRole
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole, gae_fields
from relax_gym.trainer.async_engine.roles.critic import CriticRole
from relax_gym.trainer.config import RelaxConfig, load_recipe
from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.policy import build_policy, save_policy
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.rollout.samples import sample_id, trajectory_row
from relax_gym.trainer.run.checkpoint import CRITIC_DIR
from relax_gym.trainer.run.ppo import colocate_update, step_advantages
from relax_gym.trainer.run.warmup import demonstration

from ...test_recovery_units import Remote

G, P = 2, 3
RECIPE = Path(__file__).resolve().parents[4] / "recipes" / "cpu-nextqa-ppo.yaml"
REWARDS = [[1.0, 0.0], [0.5, 0.25], [0.0, 1.0]]
FAILED = (2, 1)  # one episode failed: masked
LR = 0.5  # large, with plain SGD below: one step moves the weights well above round-off


def config() -> RelaxConfig:
    return RelaxConfig.model_validate({
        "algorithm": {"name": "ppo", "lam": 0.9},
        "trainer": {"mode": "async", "group_size": G, "prompts_per_step": P, "sft_warmup_steps": 0},
        "actor": {"micro_batch_size": 2 * G, "lr": LR}, "critic": {"micro_batch_size": 3, "lr": LR},
        "env": {"id": "echo-ink"}})


@pytest.fixture(scope="module")
def trajectories():
    _, processor = build_policy()
    env = relax_gym.make("echo-ink")
    rng = np.random.default_rng(0)
    out = []
    for p in range(P):
        for m in range(G):
            r = demonstration(env, processor, p, rng)
            traj = Trajectory(group_id=p, seed=p, input_ids=list(r.input_ids), loss_mask=list(r.loss_mask),
                              rollout_logprobs=[-1.0 if x else 0.0 for x in r.loss_mask], mm=dict(r.mm), reward=REWARDS[p][m])
            if (p, m) == FAILED:
                traj.status, traj.loss_mask = "engine_error", [0] * len(traj.input_ids)
            out.append(traj)
    env.close()
    return out


class WeightSink:
    async def push(self, state, version):
        pass


def sgd(optimizer_owner, params):
    """Plain SGD on both paths: parameters move by exactly the gradient (AdamW would amplify round-off)."""
    optimizer_owner.optimizer = torch.optim.SGD(params, lr=LR)


async def async_step(cfg, trajs, init: Path, *, plain_sgd: bool = True):
    bus = make_bus("inprocess")
    actor = ActorRole(cfg.model_dump(mode="json"), bus, pusher=WeightSink())
    critic = CriticRole(cfg.model_dump(mode="json"), bus)
    advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
    await critic.start(str(init))
    if plain_sgd:
        sgd(actor.actor, actor.model.parameters())
        sgd(critic.critic, critic.critic.net.parameters())
    rows = [trajectory_row(t, sample_id(1, t.group_id, i % G), [1]) for i, t in enumerate(trajs)]
    n = len(rows)
    await bus.open_partition(0, expected_rows=n, group_size=G)
    await bus.put(0, rows)
    await bus.seal(0, n)
    answers = await asyncio.gather(critic.values(0, n), advantages.process(0, n, G), actor.train_step(0, n, G),
                                   critic.train(0, n))
    return actor, critic, bus, answers


def test_an_async_ppo_step_equals_the_colocate_one(trajectories, tmp_path):
    cfg = config()
    model, processor = build_policy(cfg.model)
    init = save_policy(model, processor, tmp_path / "warm")
    # colocate: the same policy, a critic on a copy of it, one PPO step
    actor = build_actor(cfg, copy.deepcopy(model), processor)
    critic = build_critic(cfg, copy.deepcopy(model), processor)
    sgd(actor, actor.model.parameters())
    sgd(critic, critic.net.parameters())
    valid = [t for t in trajectories if t.trainable]
    values_before = critic.values(valid)
    m_colocate = colocate_update(actor, critic, valid, cfg.algorithm)

    role_actor, role_critic, _, answers = asyncio.run(async_step(cfg, trajectories, init))
    values_answer, adv_answer, train_answer, critic_metrics = answers
    assert values_answer == {"rows": P * G, "forwarded": P * G - 1} and adv_answer["rows"] == P * G
    assert train_answer["episodes_trained"] == P * G - 1
    for (name, a), b in zip(actor.model.named_parameters(), role_actor.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    for (name, a), b in zip(critic.net.named_parameters(), role_critic.critic.net.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), actor.model.parameters()))  # it trained
    assert critic_metrics["value_loss"] == pytest.approx(m_colocate["value_loss"], rel=1e-5)
    assert critic_metrics["critic_grad_norm"] == pytest.approx(m_colocate["critic_grad_norm"], rel=1e-5)
    assert train_answer["metrics"]["grad_norm"] == pytest.approx(m_colocate["grad_norm"], rel=1e-4)
    assert m_colocate["critic_grad_norm"] > 0 and m_colocate["grad_norm"] > 0 and m_colocate["value_loss"] > 0
    assert torch.equal(torch.cat(values_before), torch.zeros(sum(len(v) for v in values_before)))  # zero head at first


def test_the_advantages_role_writes_gae_rows_and_leaves_masked_rows_empty(trajectories):
    cfg = config()
    values = [torch.linspace(0, 1, len(t.input_ids) - 1) * torch.tensor(t.loss_mask[1:], dtype=torch.float32)
              for t in trajectories]
    trainable = [t.trainable for t in trajectories]
    fields = gae_fields([t.loss_mask for t in trajectories], [v.tolist() for v in values], [t.reward for t in trajectories],
                        trainable, cfg.algorithm)
    valid = [i for i, ok in enumerate(trainable) if ok]
    adv, ret = step_advantages([trajectories[i].loss_mask for i in valid], [values[i] for i in valid],
                               [trajectories[i].reward for i in valid], cfg.algorithm)
    assert [fields["advantages"][i] for i in valid] == [a.tolist() for a in adv]
    assert [fields["returns"][i] for i in valid] == [r.tolist() for r in ret]
    masked = FAILED[0] * G + FAILED[1]
    assert fields["advantages"][masked] == [] and fields["returns"][masked] == [] and fields["keep"][masked] is False
    whitened = torch.cat([a[torch.tensor(trajectories[i].loss_mask[1:]).bool()] for a, i in zip(adv, valid)])
    assert abs(float(whitened.mean())) < 1e-5 and float(whitened.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_the_critic_roles_checkpoint_round_trips_and_a_replacement_refuses_work(trajectories, tmp_path, monkeypatch):
    cfg = config()
    model, processor = build_policy(cfg.model)
    init = save_policy(model, processor, tmp_path / "warm")
    _, role, _, _ = asyncio.run(async_step(cfg, trajectories, init, plain_sgd=False))
    valid = [t for t in trajectories if t.trainable]

    async def save_and_resume():
        with pytest.raises(RuntimeError, match="has trained on 1 step"):
            await role.save(2, str(tmp_path))
        staged = Path(await role.save(1, str(tmp_path)))
        assert staged.name == "step_000001.critic.partial" and (staged / "value_head.safetensors").is_file()
        ckpt = tmp_path / "checkpoints" / "step_000001"
        ckpt.mkdir(parents=True)
        staged.rename(ckpt / CRITIC_DIR)
        resumed = CriticRole(cfg.model_dump(mode="json"), make_bus("inprocess"), resume_from=str(ckpt))
        assert (await resumed.start(None, first_step=1))["trained"] == 1
        return resumed

    resumed = asyncio.run(save_and_resume())
    for a, b in zip(role.critic.values(valid), resumed.critic.values(valid)):
        assert torch.equal(a, b) and a.abs().sum() > 0  # trained once: no longer the zero head
    saved, loaded = role.critic.optimizer.state_dict(), resumed.critic.optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"] and saved["state"].keys() == loaded["state"].keys()
    assert all(torch.equal(saved["state"][i]["exp_avg"], loaded["state"][i]["exp_avg"]) for i in saved["state"])
    monkeypatch.setattr(critic_module, "announce_replica", lambda registry, name: 2)  # a second start: a replacement
    replacement = CriticRole(cfg.model_dump(mode="json"), make_bus("inprocess"))
    with pytest.raises(ReplacedActorError, match="critic replica replaced a dead one"):
        asyncio.run(replacement.start(str(init)))
    with pytest.raises(ReplacedActorError):
        asyncio.run(replacement.values(0, 1))


def test_plan_roles_deploys_the_critic_only_under_ppo():
    ppo = load_recipe(RECIPE, ["trainer.mode=async", "model.base=null"])
    specs = {s.name: s for s in plan_roles(ppo, "BUS", "DCS", "run", resume_from="CKPT")}
    assert set(specs) == {"inference", "env_worker", "advantages", "actor", "critic"}
    assert specs["critic"].kwargs["resume_from"] == "CKPT" and specs["critic"].section.replicas == 1
    assert specs["critic"].cls_path.endswith("roles.critic:CriticRole")
    grpo = load_recipe(RECIPE, ["trainer.mode=async", "model.base=null", "algorithm.name=grpo"])
    assert "critic" not in {s.name for s in plan_roles(grpo, "BUS", "DCS", "run")}


def test_a_replaced_or_dead_critic_means_a_global_restart():
    from ray.exceptions import ActorDiedError

    async def body():
        reg = ReplicaRegistry({"env_worker": 1, "actor": 1, "critic": 1})
        sup = Supervisor(Remote(reg), budget=3, wait_s=5)
        watch = asyncio.ensure_future(sup.watch())
        for role in ("env_worker", "critic", "env_worker"):  # the second env_worker start is within the budget
            await reg.started(role, "r")
        await asyncio.sleep(0.01)
        assert not watch.done()
        await reg.started("critic", "replacement")
        await asyncio.sleep(0.01)
        with pytest.raises(GlobalRestart, match="the critic replica was replaced"):
            watch.result()

        async def dead():
            raise ActorDiedError()

        with pytest.raises(GlobalRestart, match="the critic replica died during step 2 critic"):
            await sup.call("critic", dead, "step 2 critic")
        assert sup.failed_calls["critic"] == 1

    asyncio.run(body())
