"""Simulated engines (processor sharing, queueing, pauses) and the cost models' draws, checked against closed forms."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.plan.clock import run_virtual
from relax_gym.trainer.plan.costs import (
    Cluster,
    Costs,
    Dist,
    EpisodeCost,
    GenerationCost,
    episode_rng,
)
from relax_gym.trainer.plan.sim_roles import Engine, parse_sample_id
from relax_gym.trainer.rollout.samples import sample_id


def _ends(cost: GenerationCost, works: list[float], pause: tuple[float, float, int] | None = None) -> list[tuple[float, int]]:
    async def main():
        loop = asyncio.get_running_loop()
        engine = Engine(0, cost)

        async def one(work: float) -> tuple[float, int]:
            version = await engine.generate(work)
            return loop.time(), version

        async def pauser() -> None:
            at, length, version = pause
            await asyncio.sleep(at)
            engine.pause()
            await asyncio.sleep(length)
            engine.version = version
            engine.resume()

        tasks = [asyncio.ensure_future(one(w)) for w in works]
        if pause is not None:
            await pauser()
        return await asyncio.gather(*tasks)

    return run_virtual(main())


def test_engine_shares_its_throughput_among_running_sequences():
    ends = _ends(GenerationCost(peak_tokens_per_s=1000.0, half_batch=0.0), [100.0, 200.0, 300.0])
    assert [t for t, _ in ends] == pytest.approx([0.3, 0.5, 0.6], abs=1e-9)  # 3 share, then 2, then 1


def test_engine_batch_curve_and_queue():
    cost = GenerationCost(peak_tokens_per_s=1000.0, half_batch=1.0)  # one sequence alone: 500 tokens/s
    assert _ends(cost, [100.0])[0][0] == pytest.approx(0.2)
    two = _ends(cost, [100.0, 100.0])  # two together: 667 tokens/s in all, 333 each
    assert [t for t, _ in two] == pytest.approx([0.3, 0.3])
    fifo = _ends(GenerationCost(peak_tokens_per_s=1000.0, half_batch=0.0, max_batch=1), [100.0, 200.0, 300.0])
    assert [t for t, _ in fifo] == pytest.approx([0.1, 0.3, 0.6])


def test_a_paused_engine_makes_no_progress_and_answers_the_version_it_serves_at_the_end():
    ends = _ends(GenerationCost(peak_tokens_per_s=1000.0, half_batch=0.0), [1000.0, 100.0], pause=(0.05, 2.0, 7))
    # 0.05 s shared (25 tokens each), 2 s paused, 0.15 s shared (the short one's last 75), then 900 tokens alone
    assert ends[1] == (pytest.approx(2.2), 7)
    assert ends[0] == (pytest.approx(2.2 + 0.9), 7)


def test_episode_draws_depend_on_the_episode_only():
    cost = EpisodeCost(turns=Dist(kind="lognormal", value=2.0, sigma=0.5, min=1, max=5),
                       completion_tokens=Dist.lognormal(100, 1.0, 400), tool_s=Dist(kind="pareto", scale=0.5, alpha=1.2, max=30))
    a = cost.draw(episode_rng(0, 3, 1, 0))
    assert a == cost.draw(episode_rng(0, 3, 1, 0))
    assert a != cost.draw(episode_rng(0, 3, 1, 1)) and a != cost.draw(episode_rng(1, 3, 1, 0))
    assert a.turns[-1].tool_s == 0.0 and all(1 <= t.completion_tokens <= 400 for t in a.turns)
    many = [cost.draw(episode_rng(0, s, 0, 0)) for s in range(200)]
    assert {len(d.turns) for d in many} <= {1, 2, 3, 4, 5} and len({len(d.turns) for d in many}) > 2
    assert max(t.tool_s for d in many for t in d.turns) <= 30.0


def test_empirical_episodes_and_token_caps():
    cost = EpisodeCost(empirical=((3, 10, 50), (1, 500, 20)), max_new_tokens=300)
    shapes = {tuple(t.completion_tokens for t in cost.draw(episode_rng(0, s, 0, 0)).turns) for s in range(50)}
    assert shapes == {(4, 3, 3), (300,)}
    calls = EpisodeCost(empirical=((3, 10, 50, 4),), tool_s=Dist.fixed(1.0)).draw(episode_rng(0, 1, 0, 0))
    assert [t.tool_s for t in calls.turns] == [2.0, 1.0, 1.0] and calls.tokens == 60  # 4 calls over 3 turns
    with pytest.raises(ValueError, match="empirical episode"):
        EpisodeCost(empirical=((3, 10),))


def test_dist_means_and_checks():
    assert Dist.fixed(3.0).mean() == 3.0
    assert Dist.lognormal(1.0, 0.5).mean() == pytest.approx(1.133, rel=0.03)  # exp(sigma^2 / 2)
    assert Dist(kind="empirical", samples=(1.0, 3.0)).mean() == pytest.approx(2.0, rel=0.03)
    with pytest.raises(ValueError, match="samples"):
        Dist(kind="empirical")


def test_cluster_split_and_costs_updates():
    c = Costs(cluster=Cluster(gpus=16, replicas=4), generation=GenerationCost(gpus_per_replica=2))
    assert c.cluster.split("async", 2) == (4, 8) and c.cluster.split("colocate", 2) == (8, 16)
    assert c.with_updates(cluster={"replicas": 6}).cluster.split("async", 2) == (6, 4)
    with pytest.raises(ValueError, match="no GPU"):
        c.with_updates(cluster={"replicas": 8}).cluster.split("async", 2)


def test_sample_ids_round_trip():
    assert parse_sample_id(sample_id(12, 3, 1)) == (12, 3, 1)
