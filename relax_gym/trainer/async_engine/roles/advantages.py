"""The advantages role: stateless; turns whole groups of rewards into per-sample advantages.

It asks the bus for whole groups of a step's partition (``reward``, ``group_id``, ``trainable``), computes the
advantage of every valid sample with the algorithm's registered estimator (``algorithm.advantage_estimator``,
trainer/algorithms/registry.py; the masked ones get 0: they never reach the loss), applies DAPO's
dynamic-sampling filter when the algorithm asks for it (a group whose valid rewards are all equal carries no
signal and is marked ``keep = False``), and writes ``advantages`` and ``keep`` back as new columns of the same
rows. The numbers are those of the colocate trainer: the same functions, on the same groups.

Under an estimator that needs a critic (ppo's ``gae``) it also needs each row's ``loss_mask`` and the critic role's ``values``, and
writes GAE's per-token ``advantages`` and ``returns`` (:func:`~relax_gym.trainer.run.ppo.step_advantages`, the
colocate trainer's function). Whitening (``algorithm.whiten_advantages``) uses the whole step's tokens, so the role
then asks for the whole partition in one fetch, which the bus delivers once every row is ready (no lease is held
while the rollout runs); without whitening each group is written as it completes. ``keep`` is then just ``trainable`` (PPO has no group filter).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from relax_gym.trainer.algorithms import AlgorithmConfig, StepBatch, estimator, identical_reward_groups
from relax_gym.trainer.async_engine.bus_source import open_bus
from relax_gym.trainer.async_engine.contracts import AdvantagesAnswer
from relax_gym.trainer.async_engine.replica import announce_replica
from relax_gym.trainer.rollout.samples import as_list
from relax_gym.trainer.run.ppo import step_advantages

__all__ = ["AdvantagesRole", "gae_fields", "group_fields"]

FIELDS = ["group_id", "reward", "trainable"]
PPO_FIELDS = FIELDS + ["loss_mask", "values"]


def group_fields(group_ids: list[int], rewards: list[float], trainable: list[bool], algo: AlgorithmConfig) -> tuple[dict[str, list[Any]], dict[str, int]]:
    """``({"advantages": [...], "keep": [...]}, counts)`` for rows holding whole groups (any order). The advantages
    are the registered estimator's; under one that needs a critic only the counts matter (:func:`gae_fields`
    writes its advantages), and they stay 0 here."""
    est = estimator(algo.advantage_estimator)
    n = len(group_ids)
    adv, keep = [0.0] * n, [False] * n
    valid = [i for i in range(n) if trainable[i]]
    counts = {"groups": len(set(group_ids)), "zero_adv_groups": 0, "valid_groups": 0, "kept": 0, "masked": n - len(valid)}
    if valid:
        r = torch.tensor([rewards[i] for i in valid], dtype=torch.float32)
        g = torch.tensor([group_ids[i] for i in valid], dtype=torch.long)
        a = (torch.zeros(len(valid)) if est.needs_critic
             else est.estimate(StepBatch([rewards[i] for i in valid], [group_ids[i] for i in valid]), algo).advantages)
        same = identical_reward_groups(r, g)
        kept = ~same if algo.dynamic_sampling else torch.ones(len(valid), dtype=torch.bool)
        for j, i in enumerate(valid):
            adv[i], keep[i] = float(a[j]), bool(kept[j])
        by_group: dict[int, bool] = defaultdict(bool)
        for j, i in enumerate(valid):
            by_group[group_ids[i]] = bool(same[j])
        counts["valid_groups"] = len(by_group)
        counts["zero_adv_groups"] = sum(by_group.values())
        counts["kept"] = sum(keep)
    return {"advantages": adv, "keep": keep}, counts


def gae_fields(loss_masks: list[Any], values: list[Any], rewards: list[float], trainable: list[bool],
               algo: AlgorithmConfig) -> dict[str, list[Any]]:
    """``{"advantages": rows, "returns": rows, "keep": [...]}`` (PPO) for rows of one step: GAE over the trainable
    rows together (whitened over all their tokens when the algorithm says so); masked rows get empty rows."""
    n = len(rewards)
    adv: list[list[float]] = [[] for _ in range(n)]
    ret: list[list[float]] = [[] for _ in range(n)]
    valid = [i for i in range(n) if trainable[i]]
    if valid:
        rows = [torch.tensor(as_list(values[i]), dtype=torch.float32) for i in valid]
        a, r = step_advantages([as_list(loss_masks[i]) for i in valid], rows, [rewards[i] for i in valid], algo)
        for j, i in enumerate(valid):
            adv[i], ret[i] = a[j].tolist(), r[j].tolist()
    return {"advantages": adv, "returns": ret, "keep": [bool(x) for x in trainable]}


class AdvantagesRole:
    """``algorithm``: the run's algorithm config (a dict); ``bus``: a BusLink or a bus object."""

    TASK = "advantages"

    def __init__(self, algorithm: dict[str, Any], bus: Any, *, registry: Any = None) -> None:
        self.algo = AlgorithmConfig.model_validate(algorithm)
        self._bus_source = bus
        self._bus: Any = None
        announce_replica(registry, "advantages")

    def check_health(self) -> None:
        """Serve's health check: the role is stateless, so answering at all (a responsive event loop) is the check."""

    def _ready(self) -> Any:
        if self._bus is None:
            source = self._bus_source
            self._bus = open_bus(source)
        return self._bus

    async def process(self, partition: int, n_rows: int, group_size: int) -> AdvantagesAnswer:
        """Write advantages for the ``n_rows`` rows of ``partition`` as their groups complete; answer counts
        (groups, groups with identical rewards, kept samples, masked samples) for the step's metrics."""
        bus = self._ready()
        totals = AdvantagesAnswer(groups=0, zero_adv_groups=0, valid_groups=0, kept=0, masked=0, rows=0)
        ppo = estimator(self.algo.advantage_estimator).needs_critic  # ppo's gae: the critic's values, the whole step
        held: list[Any] = []  # PPO with whitening: the step's batches, written together once all have arrived
        while totals["rows"] < n_rows:
            size = group_size
            if ppo and self.algo.whiten_advantages:  # one lease of every row left, delivered once all are ready
                size = max(group_size, (n_rows - totals["rows"]) // group_size * group_size)
            batch = await bus.fetch(partition, self.TASK, PPO_FIELDS if ppo else FIELDS, size, whole_groups=True)
            if batch is None:  # the partition was dropped (the run stopped early)
                break
            # the group counts of the step's metrics (under ppo only the counts: its advantages are GAE's)
            fields, counts = group_fields([int(x) for x in batch.fields["group_id"]], [float(x) for x in batch.fields["reward"]],
                                          [bool(x) for x in batch.fields["trainable"]], self.algo)
            for key, value in counts.items():
                totals[key] += value
            totals["rows"] += len(batch.sample_ids)
            if ppo:
                held.append(batch)
                if self.algo.whiten_advantages and totals["rows"] < n_rows:
                    continue
                await self._write_gae(held)
                held = []
                continue
            await bus.put_fields(partition, list(batch.sample_ids), fields)
            await bus.ack(batch)
        return totals

    async def _write_gae(self, batches: list[Any]) -> None:
        """GAE over the rows of ``batches`` together; their columns written, then the batches acknowledged."""
        if not batches:
            return
        bus = self._ready()
        ids = [sid for b in batches for sid in b.sample_ids]

        def column(name: str) -> list[Any]:
            return [v for b in batches for v in b.fields[name]]

        fields = gae_fields(column("loss_mask"), column("values"), [float(x) for x in column("reward")],
                            [bool(x) for x in column("trainable")], self.algo)
        await bus.put_fields(batches[0].partition, ids, fields)
        for b in batches:
            await bus.ack(b)
