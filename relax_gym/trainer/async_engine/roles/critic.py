"""The critic role (``algorithm.name: ppo``): PPO's value model in the async engine, one replica.

Two calls per rollout step k, both on the step's partition of the data bus:

- :meth:`CriticRole.values` (a streaming call sent when the rollout of step k starts, like the reference role's):
  micro-batches of rows as they arrive, a forward pass, a new ``values`` column (one float per next-token position,
  0 off the loss mask; masked episodes get an empty row). The advantages role waits for it to run GAE.
- :meth:`CriticRole.train` (sent by the controller together with the actor's train step for k): once the
  advantages role has written ``returns`` for every row, the critic's update on the whole partition (the clipped
  value loss against the ``values`` it wrote before). It answers the step's critic metrics.

The critic starts from the warmed-up policy (the actor saves it after the warm-up, :meth:`start`), or from the
``critic/`` folder of the checkpoint the run resumes from; the controller has it write that folder at every
checkpoint (:meth:`save`, staged for the actor's checkpoint to move in). Its weights and optimizer are training
state the data bus cannot rebuild, so like the actor it is not restarted in place: a replacement replica refuses
work (:class:`~relax_gym.trainer.async_engine.recovery.ReplacedActorError`) and the controller restarts the whole
run from its last checkpoint (``critic`` is one of the stateful roles of
:mod:`~relax_gym.trainer.async_engine.recovery`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import torch

from relax_gym.trainer.actors.critic import Critic
from relax_gym.trainer.actors.factory import build_critic
from relax_gym.trainer.async_engine.bus_source import open_bus
from relax_gym.trainer.async_engine.contracts import CriticStartAnswer, StreamAnswer
from relax_gym.trainer.async_engine.recovery import ReplacedActorError
from relax_gym.trainer.async_engine.replica import announce_replica, setup_replica
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.rollout.media import MediaResolver
from relax_gym.trainer.rollout.samples import TrainItem, as_list
from relax_gym.trainer.run.checkpoint import CRITIC_DIR, part_stage

__all__ = ["CriticRole"]

VALUE_FIELDS = ["tokens", "loss_mask", "mm_inputs", "trainable"]
TRAIN_FIELDS = VALUE_FIELDS + ["values", "returns"]


def _items(sample_ids: list[str], fields: dict[str, list[Any]], rows: list[int]) -> list[TrainItem]:
    """Bus rows as the items the critic's forward takes (tokens, loss mask, media)."""
    return [TrainItem(sample_id=sample_ids[i], group_id=0, input_ids=[int(x) for x in as_list(fields["tokens"][i])],
                      loss_mask=[int(x) for x in as_list(fields["loss_mask"][i])], rollout_logprobs=[],
                      mm=dict(fields["mm_inputs"][i] or {}), advantage=0.0, keep=True, trainable=True, policy_versions=[])
            for i in rows]


class CriticRole:
    """``cfg``: the run's config (a dict); ``bus``: a BusLink or a bus object; ``resume_from``: the checkpoint the
    run continues from (the critic loads its ``critic/`` folder in :meth:`start`)."""

    TASK = "critic"  # the values stream (the controller gives a dead call's leases back under the role's name)
    TRAIN_TASK = "critic_train"

    def __init__(self, cfg: dict[str, Any], bus: Any, *, torch_threads: int | None = None, registry: Any = None,
                 resume_from: str | None = None) -> None:
        setup_replica(torch_threads)
        self.cfg = RelaxConfig.model_validate(cfg)
        self._bus_source = bus
        self._bus: Any = None
        self._resume_from = resume_from
        self.critic: Critic | None = None
        self.trained = 0  # partitions trained on (from the checkpoint's step on a resumed run)
        self._lock = asyncio.Lock()  # one forward / update / save at a time
        self._media = MediaResolver()  # the rows' shared media tensors, read by key (and cached)
        self._replacement = announce_replica(registry, "critic") > 1

    def check_health(self) -> None:
        """Serve's health check: answering at all (a responsive event loop) is the check; a replaced replica is
        detected by the controller's restart watch, not here."""

    def _ready(self) -> Any:
        if self._bus is None:
            self._bus = open_bus(self._bus_source)
        return self._bus

    def _refuse_if_replacement(self) -> None:
        if self._replacement:
            raise ReplacedActorError("this critic replica replaced a dead one; its weights and optimizer are not the "
                                     "run's (the controller restarts the run from its last checkpoint)")

    def _critic(self) -> Critic:
        self._refuse_if_replacement()
        if self.critic is None:
            raise RuntimeError("the critic role was not started (the controller calls start() after the warm-up)")
        return self.critic

    # -- start -------------------------------------------------------------------------------------------------------

    async def start(self, init_path: str | None = None, first_step: int = 0) -> CriticStartAnswer:
        """Build the critic: from the checkpoint the run resumes from, else from the warmed-up policy saved at
        ``init_path``. ``first_step``: the steps already trained (0 unless resumed)."""
        self._refuse_if_replacement()
        async with self._lock:
            if self._resume_from is not None:
                folder = Path(self._resume_from) / CRITIC_DIR
                if not folder.is_dir():
                    raise FileNotFoundError(f"{self._resume_from}: no {CRITIC_DIR}/ folder; a run with "
                                            "algorithm.name=ppo cannot resume without its critic")
                self.critic = await asyncio.to_thread(self._build, folder)
                await asyncio.to_thread(self.critic.load, folder)
            elif init_path is not None:
                self.critic = await asyncio.to_thread(self._build, Path(init_path))
            else:
                raise ValueError("the critic starts from a checkpoint (resume_from) or the warmed-up policy (init_path)")
            self.trained = int(first_step)
        return CriticStartAnswer({"trained": self.trained, "from": str(self._resume_from or init_path)})

    def _build(self, path: Path) -> Critic:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no policy checkpoint at {path} for the critic to start from")
        model, processor = build_policy(self.cfg.model.model_copy(update={"path": str(path), "base": None}))
        return build_critic(self.cfg, model, processor)

    # -- per step ----------------------------------------------------------------------------------------------------

    async def values(self, partition: int, n_rows: int) -> StreamAnswer:
        """Write ``values`` for the ``n_rows`` rows of ``partition`` as they arrive."""
        critic = self._critic()
        bus = self._ready()
        done = forwarded = 0
        while done < n_rows:
            batch = await bus.fetch(partition, self.TASK, VALUE_FIELDS, critic.micro_batch_size)
            if batch is None:  # the partition was dropped (the run is stopping)
                break
            f = batch.fields
            rows: list[list[float]] = [[] for _ in batch.sample_ids]
            live = [i for i, ok in enumerate(f["trainable"]) if ok]
            if live:
                f["mm_inputs"] = await self._media.resolve(f["mm_inputs"], functools.partial(bus.get_media, partition))
                async with self._lock:
                    values = await asyncio.to_thread(critic.values, _items(list(batch.sample_ids), f, live))
                for i, row in zip(live, values):
                    rows[i] = row.tolist()
                forwarded += len(live)
            await bus.put_fields(partition, list(batch.sample_ids), {"values": rows})
            await bus.ack(batch)
            done += len(batch.sample_ids)
        return StreamAnswer(rows=done, forwarded=forwarded)

    async def train(self, partition: int, n_rows: int) -> dict[str, float]:
        """Once every row of ``partition`` has its ``returns``: the critic's update on them (``critic.epochs``
        optimiser steps over the whole partition). Answers the critic's metrics and ``critic_step_s``."""
        critic = self._critic()
        bus = self._ready()
        batches = []
        got = 0
        while got < n_rows:  # normally one fetch: the advantages role writes a step's returns together
            batch = await bus.fetch(partition, self.TRAIN_TASK, TRAIN_FIELDS, n_rows - got)
            if batch is None:
                break
            batches.append(batch)
            got += len(batch.sample_ids)
        items, returns, old = [], [], []
        for b in batches:
            b.fields["mm_inputs"] = await self._media.resolve(b.fields["mm_inputs"],
                                                              functools.partial(bus.get_media, partition))
            live = [i for i, ok in enumerate(b.fields["trainable"]) if ok]
            items += _items(list(b.sample_ids), b.fields, live)
            returns += [_floats(b.fields["returns"][i]) for i in live]
            old += [_floats(b.fields["values"][i]) for i in live]
        t0 = time.perf_counter()
        async with self._lock:
            metrics = await asyncio.to_thread(critic.train_step, items, returns, old, clip=self.cfg.algorithm.value_clip)
        for b in batches:
            await bus.ack(b)
        self.trained += 1
        return {**metrics, "critic_step_s": time.perf_counter() - t0}

    # -- checkpoints -------------------------------------------------------------------------------------------------

    async def save(self, step: int, run_dir: str) -> str:
        """Write the critic (after ``step`` trained partitions) to its staging folder next to checkpoint ``step``;
        the actor's checkpoint moves it in. Answers the folder."""
        critic = self._critic()
        if self.trained != step:
            raise RuntimeError(f"checkpoint {step}: the critic has trained on {self.trained} step(s), not {step}")
        stage = part_stage(Path(run_dir), step, CRITIC_DIR)
        async with self._lock:
            await asyncio.to_thread(critic.save, stage)
        return str(stage)


def _floats(value: Any) -> torch.Tensor:
    return torch.tensor(as_list(value), dtype=torch.float32)
