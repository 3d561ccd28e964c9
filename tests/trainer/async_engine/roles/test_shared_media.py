"""Media stored once per group, through the roles on the in-process bus: the actor trains on exactly the inputs it
trained on with a copy per row, the env worker's rewards do not change, and the bytes put shrink by the group size.
"""

from __future__ import annotations

import asyncio

import torch

from relax_gym.trainer.async_engine.roles.actor import ActorRole
from relax_gym.trainer.async_engine.roles.advantages import AdvantagesRole
from relax_gym.trainer.async_engine.roles.env_worker import EnvWorkerRole, group_rows
from relax_gym.trainer.databus import make_bus
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.rollout.media import is_media_ref
from relax_gym.trainer.rollout.samples import sample_id
from tests.trainer.async_engine.roles.test_streaming_roles import (
    G,
    ScriptedEngine,
    WeightSink,
    config,
    demos,
    rows_for,
)

__all__ = ["demos"]  # the fixture, imported for pytest


def _bits(t: torch.Tensor) -> tuple:
    return (t.dtype, tuple(t.shape), t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())


async def _train(demos, dedupe: bool):
    """One actor step on 4 groups put with (or without) shared media; the collated batch of every micro-batch,
    the step's answer and the bus's counters."""
    bus = make_bus("inprocess")
    cfg = config(dedupe_media=dedupe)
    actor = ActorRole(cfg.model_dump(mode="json"), bus, pusher=WeightSink())
    advantages = AdvantagesRole(cfg.algorithm.model_dump(mode="json"), bus)
    collated: list[dict[str, torch.Tensor]] = []
    original = actor.actor.stream_micro_batch

    def spy(items, *args, **kwargs):
        collated.append(actor.processor.collate(items, padding_side="right"))
        return original(items, *args, **kwargs)

    actor.actor.stream_micro_batch = spy
    rows = rows_for(1, demos)
    n = len(rows)
    await bus.open_partition(0, expected_rows=n, group_size=G)
    for p in range(len(demos)):
        shared, media, _ = group_rows([r for r in rows if r["group_id"] == p], dedupe=dedupe)
        assert all(is_media_ref(v) for r in shared for v in r["mm_inputs"].values() if not torch.is_tensor(v))
        await bus.put(0, shared, media=media)
    await bus.seal(0, n)
    _, res = await asyncio.gather(advantages.process(0, n, G), actor.train_step(0, n, G))
    return collated, res, bus.stats()


def test_actor_inputs_are_bit_identical_with_and_without_shared_media(demos):
    with_copies, res_copies, stats_copies = asyncio.run(_train(demos, dedupe=False))
    shared, res_shared, stats_shared = asyncio.run(_train(demos, dedupe=True))
    assert len(shared) == len(with_copies) == 2
    for a, b in zip(with_copies, shared, strict=True):
        assert set(a) == set(b) and any(k.startswith("pixel_values") for k in a)
        for key in a:
            assert _bits(a[key]) == _bits(b[key]), key
    assert res_shared["metrics"] == res_copies["metrics"]  # the same step: same loss, same gradient norm
    assert sorted(res_shared["sample_ids"]) == sorted(res_copies["sample_ids"])
    assert stats_copies["media_put"] == 0 and stats_shared["media_put"] == len(demos)  # one clip per group
    assert stats_shared["bytes_put"] * 3 < stats_copies["bytes_put"]  # G = 4 copies of the clip become one


def test_env_worker_puts_each_clip_once_and_rewards_do_not_change():
    async def run(dedupe: bool):
        bus = make_bus("inprocess")
        cfg = config(dedupe_media=dedupe)
        _, processor = build_policy()
        worker = EnvWorkerRole(cfg.model_dump(mode="json"), bus, ScriptedEngine(processor), pool_size=2,
                               eval_pool_size=1)
        await bus.open_partition(0, expected_rows=G, group_size=G)
        summaries = await worker.run_group(0, 0, [11] * G, [sample_id(1, 0, m) for m in range(G)])
        batch = await bus.fetch(0, "check", ["mm_inputs"], G, whole_groups=True, timeout=5)
        return summaries, batch, bus

    async def main():
        copies, rows_copies, _ = await run(False)
        shared, rows_shared, bus = await run(True)
        assert [s["reward"] for s in shared] == [s["reward"] for s in copies]
        assert [s["status"] for s in shared] == [s["status"] for s in copies] == ["ok"] * G
        refs = [v for mm in rows_shared.fields["mm_inputs"] for v in mm.values() if is_media_ref(v)]
        assert refs and len(set(refs)) * G == len(refs)  # every row references the same stored tensors
        stored = await bus.get_media(0, [r[len("media:"):] for r in set(refs)])
        for name, value in rows_copies.fields["mm_inputs"][0].items():
            if is_media_ref(rows_shared.fields["mm_inputs"][0][name]):
                assert _bits(stored[rows_shared.fields["mm_inputs"][0][name][len("media:"):]]) == _bits(value)
        put_copies = sum(s["bus_bytes"] for s in copies)
        put_shared = sum(s["bus_bytes"] for s in shared)
        assert sum(s["media_bytes_saved"] for s in copies) == 0
        assert put_shared + sum(s["media_bytes_saved"] for s in shared) == put_copies
        assert put_shared * 3 < put_copies
        assert bus.stats()["bytes_put"] == put_shared

    asyncio.run(main())
