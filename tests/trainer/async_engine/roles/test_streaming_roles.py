"""The async engine's roles without Ray: env worker, advantages and actor on the in-process data bus.

- the streamed step (micro-batches as they arrive, one optimiser step at the end) equals the batch step;
- the actor trains on whole GRPO groups only, starts before the rollout has finished, consumes every sample once;
- the advantages role matches the colocate computation (and DAPO's filter);
- the env worker writes one row per episode, failed episodes masked, never an exception.
"""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import relax_gym
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import group_advantages, identical_reward_groups, preset
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.run.warmup import demonstration
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.async_engine.roles.actor import ActorRole
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole, group_fields
from relax_gym.trainer.async_engine.roles.env_worker import EnvWorkerRole
from relax_gym.trainer.rollout.episode import Trajectory
from relax_gym.trainer.rollout.samples import sample_id, trajectory_row

G = 4  # group size


@pytest.fixture(scope="module")
def demos():
    """Rendered demonstrations of 4 prompts x G answers (random answer letters: rewards differ within a group)."""
    _, processor = build_policy()
    env = relax_gym.make("nextqa-video")
    rng = np.random.default_rng(0)
    return [[demonstration(env, processor, p, rng) for _ in range(G)] for p in range(4)]


def rows_for(step: int, demos, *, versions=(1,), rewards=None, failed=()):
    out = []
    for p, group in enumerate(demos):
        for m, r in enumerate(group):
            traj = Trajectory(group_id=p, seed=p, input_ids=list(r.input_ids), loss_mask=list(r.loss_mask),
                              rollout_logprobs=[-1.0 if x else 0.0 for x in r.loss_mask], mm=dict(r.mm),
                              reward=float(rewards[p][m]) if rewards else float((p + m) % 2))
            if (p, m) in failed:
                traj.status, traj.loss_mask = "engine_error", [0] * len(traj.input_ids)
            out.append(trajectory_row(traj, sample_id(step, p, m), list(versions)))
    return out


def config(**trainer):
    return RelaxConfig.model_validate({
        "trainer": {"mode": "async", "group_size": G, "prompts_per_step": 4, "sft_warmup_steps": 0, **trainer},
        "actor": {"micro_batch_size": 2 * G, "lr": 1e-3}, "env": {"id": "nextqa-video"}})


class WeightSink:
    def __init__(self):
        self.pushed: list[int] = []

    async def push(self, state, version):
        self.pushed.append(version)


def test_streamed_step_equals_the_batch_step(demos):
    items = [Trajectory(group_id=p, seed=0, input_ids=r.input_ids, loss_mask=r.loss_mask,
                        rollout_logprobs=[-0.5] * len(r.input_ids), mm=r.mm) for p, g in enumerate(demos[:2]) for r in g]
    adv = torch.linspace(-1, 1, len(items))
    adv[2] = 0.0  # a zero-advantage sample: not forwarded by either path, its share still in the normaliser
    algo = preset("dapo", tis_cap=2.0)  # token-mean aggregation, truncated IS on
    torch.manual_seed(0)
    model, processor = build_policy()
    twin = copy.deepcopy(model)
    batch = HFActor(model, processor, lr=1e-2, micro_batch_size=3)
    stream = HFActor(twin, processor, lr=1e-2, micro_batch_size=3)
    for actor in (batch, stream):  # plain SGD: parameters move by exactly the gradient (Adam would amplify round-off)
        actor.optimizer = torch.optim.SGD(actor.model.parameters(), lr=1.0)
    m_batch = batch.rl_step(items, adv, algo)
    stream.begin_stream()
    for lo, hi in ((0, 3), (3, 4), (4, 8)):  # uneven micro-batches, as they would arrive
        stream.stream_micro_batch(items[lo:hi], adv[lo:hi], algo)
    m_stream = stream.end_stream()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert m_stream["grad_norm"] == pytest.approx(m_batch["grad_norm"], rel=1e-4)
    assert m_stream["pg_loss"] == pytest.approx(m_batch["pg_loss"], rel=1e-4, abs=1e-6)
    assert m_stream["samples_forwarded"] == m_batch["samples_forwarded"] == len(items) - 1
    stream.begin_stream()
    assert stream.end_stream() == {"grad_norm": 0.0, "samples_forwarded": 0.0}  # nothing arrived: no step


def test_advantages_match_the_colocate_computation():
    gids = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    rewards = [1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 0.3]
    trainable = [True, True, True, True, True, True, True, False, True]
    fields, counts = group_fields(gids, rewards, trainable, preset("dapo"))
    valid = [i for i in range(9) if trainable[i]]
    r = torch.tensor([rewards[i] for i in valid])
    g = torch.tensor([gids[i] for i in valid])
    expected = group_advantages(r, g)
    assert [fields["advantages"][i] for i in valid] == pytest.approx(expected.tolist())
    assert fields["advantages"][7] == 0.0 and not fields["keep"][7]  # masked: zero advantage, never trained
    dropped = identical_reward_groups(r, g)
    assert [fields["keep"][i] for i in valid] == (~dropped).tolist()  # DAPO: group 1 (all 1.0) is filtered
    assert counts == {"groups": 3, "zero_adv_groups": 1, "valid_groups": 3, "kept": 5, "masked": 1}
    grpo, _ = group_fields(gids, rewards, trainable, preset("grpo"))
    assert sum(grpo["keep"]) == 8  # no filter without dynamic sampling


def test_actor_streams_whole_groups_as_they_arrive(demos):
    """Groups arrive one by one, out of order; the actor starts training before the last one is put, trains on
    whole groups only, consumes every row exactly once, and takes one optimiser step."""

    async def main():
        bus = make_bus("inprocess")
        cfg = config(max_staleness=0)
        sink = WeightSink()
        actor = ActorRole(cfg.model_dump(mode="json"), bus, pusher=sink)
        advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
        calls: list[float] = []
        original = actor.actor.stream_micro_batch

        def spy(items, *args, **kwargs):
            calls.append(time.monotonic())
            assert len({it.group_id for it in items}) * G == len(items)  # whole groups
            return original(items, *args, **kwargs)

        actor.actor.stream_micro_batch = spy
        rows = rows_for(1, demos)
        n = len(rows)
        await bus.open_partition(0, expected_rows=n, group_size=G)
        puts: list[float] = []

        async def producer():
            for p in (2, 0, 3, 1):  # groups finish out of order
                if p == 1:  # the last group waits for the first micro-batch: without pipelining nothing would come
                    deadline = time.monotonic() + 60
                    while not calls:
                        assert time.monotonic() < deadline, "no micro-batch trained before the last group arrived"
                        await asyncio.sleep(0.01)
                await bus.put(0, [r for r in rows if r["group_id"] == p])
                puts.append(time.monotonic())
                await asyncio.sleep(0.3)  # spacing (the actor's data wait below is at least this)
            await bus.seal(0, n)

        adv_task = asyncio.create_task(advantages.process(0, n, G))
        _, res, adv = await asyncio.gather(producer(), actor.train_step(0, n, G), adv_task)
        assert sorted(res["sample_ids"]) == sorted(r["sample_id"] for r in rows)
        assert len(set(res["sample_ids"])) == n and res["partial_groups"] == 0
        assert len(calls) == 2 and calls[0] < puts[-1]  # 2 micro-batches of 2 groups; the first before the last put
        assert res["version"] == 1 and sink.pushed == [1] and res["metrics"]["grad_norm"] > 0
        assert adv["rows"] == n and res["episodes_trained"] == n
        assert res["data_wait_s"] > 0.3  # it waited for groups to arrive (S = 0 pipelining)

    asyncio.run(main())


def test_stale_samples_are_measured_and_corrected(demos):
    """Samples made by older policy versions: staleness is reported per step and the IS cap is applied (S >= 1);
    masked episodes are consumed but never trained on."""

    async def main():
        bus = make_bus("inprocess")
        cfg = config(max_staleness=2)
        actor = ActorRole(cfg.model_dump(mode="json"), bus, pusher=WeightSink())
        actor.version = 5  # the policy being trained is version 5
        advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
        rows = rows_for(1, demos, versions=(3, 4), failed={(0, 1)})
        n = len(rows)
        await bus.open_partition(0, expected_rows=n, group_size=G)
        await bus.put(0, rows)
        await bus.seal(0, n)
        _, res = await asyncio.gather(advantages.process(0, n, G), actor.train_step(0, n, G, max_staleness=2))
        assert res["staleness_max"] == 2 and res["staleness_avg"] == 2.0
        assert res["rollout_version_min"] == 3 and res["rollout_version_max"] == 4
        assert res["tis_cap"] == cfg.trainer.off_policy_tis_cap and "is_weight_mean" in res["metrics"]
        assert res["episodes_trained"] == n - 1 and len(res["sample_ids"]) == n

    asyncio.run(main())


@dataclass
class Out:
    output_ids: list[int]
    output_logprobs: list[float]
    weight_version: str | None


class ScriptedEngine:
    """Answers the gold action of the prompt; fails every call after ``fail_after`` calls."""

    def __init__(self, processor, fail_after=None):
        self.processor, self.fail_after, self.calls = processor, fail_after, 0

    async def generate(self, input_ids, **kwargs):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise ConnectionError("engine went away")
        ids = self.processor.encode_text("<think></think><answer>A</answer>") + [self.processor.eos_token_id]
        return Out(ids, [-0.25] * len(ids), "7")


def test_env_worker_writes_one_row_per_episode_and_masks_failures():
    async def main():
        bus = make_bus("inprocess")
        cfg = config()
        _, processor = build_policy()
        engine = ScriptedEngine(processor, fail_after=2)
        worker = EnvWorkerRole(cfg.model_dump(mode="json"), bus, engine, pool_size=2, eval_pool_size=1)
        await bus.open_partition(0, expected_rows=G, group_size=G)
        sids = [sample_id(1, 0, m) for m in range(G)]
        summaries = await worker.run_group(0, 0, [11] * G, sids)
        assert [s["sample_id"] for s in summaries] == sids
        statuses = sorted(s["status"] for s in summaries)
        assert statuses.count("engine_error") == 2 and statuses.count("ok") == 2
        batch = await bus.fetch(0, "check", ["tokens", "loss_mask", "trainable", "policy_versions", "status"], G,
                                whole_groups=True, timeout=5)
        assert sorted(batch.sample_ids) == sids
        for i, sid in enumerate(batch.sample_ids):
            ok = batch.fields["status"][i] == "ok"
            assert batch.fields["trainable"][i] == ok
            assert (sum(batch.fields["loss_mask"][i]) > 0) == ok  # failed episodes are masked
            assert list(batch.fields["policy_versions"][i]) == ([7] if ok else [])
        evals = await worker.evaluate([500_000])
        assert len(evals) == 1 and evals[0]["status"] == "engine_error"  # still failing: reported, not raised

    asyncio.run(main())
