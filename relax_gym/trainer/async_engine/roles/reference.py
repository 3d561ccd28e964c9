"""The reference role: per-token log-probs of the frozen reference policy, for the KL term (``algorithm.kl_coef``).

The reference policy is the warmed-up policy, as the colocate trainer takes it: the actor saves it once after the
SFT warm-up and every replica loads it from that directory on its first call (a replica restarted in place
reloads it the same way). Each call streams one step's partition: micro-batches of rows as they arrive, a
forward pass, and a new ``ref_logprobs`` column (one float per next-token position, as the actor's loss reads
them; masked episodes get an empty row and are never forwarded).

The old log-probs of the PPO ratio need no role of their own here: the actor's first pass over a step's data runs
under the policy before that step's update, which is exactly the old policy, and it keeps those log-probs for
any further epoch.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.async_engine.bus_source import open_bus
from relax_gym.trainer.async_engine.contracts import StreamAnswer
from relax_gym.trainer.async_engine.replica import announce_replica, setup_replica
from relax_gym.trainer.rollout.media import MediaResolver
from relax_gym.trainer.rollout.samples import TrainItem, as_list

__all__ = ["ReferenceRole"]

FIELDS = ["tokens", "loss_mask", "mm_inputs", "trainable"]


class ReferenceRole:
    TASK = "reference"

    def __init__(self, cfg: dict[str, Any], bus: Any, *, torch_threads: int | None = None, registry: Any = None) -> None:
        setup_replica(torch_threads)
        self.cfg = RelaxConfig.model_validate(cfg)
        self._bus_source = bus
        self._bus: Any = None
        self._loaded: str | None = None
        self._actor: HFActor | None = None
        self._media = MediaResolver()  # the rows' shared media tensors, read by key (and cached)
        self._lock = asyncio.Lock()
        announce_replica(registry, "reference")

    def check_health(self) -> None:
        """Serve's health check: the policy is reloaded from disk by any new replica, so answering at all (a
        responsive event loop, within roles.health_check_period_s) is the check."""

    def _ready(self) -> Any:
        if self._bus is None:
            source = self._bus_source
            self._bus = open_bus(source)
        return self._bus

    def _load(self, path: str) -> None:
        if self._loaded == path:
            return
        if not Path(path).is_dir():
            raise FileNotFoundError(f"reference policy not found at {path} (the actor saves it after the warm-up)")
        model, processor = build_policy(self.cfg.model.model_copy(update={"path": path}))
        model.eval()
        self._actor = HFActor(model, processor, lr=1.0, micro_batch_size=self.cfg.actor.micro_batch_size)
        self._loaded = path

    async def process(self, partition: int, n_rows: int, reference_path: str) -> StreamAnswer:
        """Write ``ref_logprobs`` for the ``n_rows`` rows of ``partition`` (``reference_path``: the saved
        reference policy)."""
        bus = self._ready()
        async with self._lock:
            await asyncio.to_thread(self._load, reference_path)
        assert self._actor is not None
        done = forwarded = 0
        batch_size = self.cfg.actor.micro_batch_size
        temperature = self.cfg.algorithm.temperature
        while done < n_rows:
            batch = await bus.fetch(partition, self.TASK, FIELDS, batch_size)
            if batch is None:
                break
            f = batch.fields
            rows: list[list[float]] = [[] for _ in batch.sample_ids]
            live = [i for i, ok in enumerate(f["trainable"]) if ok]
            if live:
                f["mm_inputs"] = await self._media.resolve(f["mm_inputs"], functools.partial(bus.get_media, partition))
                items = [TrainItem(sample_id=batch.sample_ids[i], group_id=0, input_ids=[int(x) for x in as_list(f["tokens"][i])],
                                   loss_mask=[int(x) for x in as_list(f["loss_mask"][i])], rollout_logprobs=[], mm=dict(f["mm_inputs"][i] or {}),
                                   advantage=0.0, keep=True, trainable=True, policy_versions=[]) for i in live]
                lps = await asyncio.to_thread(self._actor.logprobs, items, temperature)
                for i, row, item in zip(live, lps, items):
                    rows[i] = row[: len(item.input_ids) - 1].tolist()
                forwarded += len(live)
            await bus.put_fields(partition, list(batch.sample_ids), {"ref_logprobs": rows})
            await bus.ack(batch)
            done += len(batch.sample_ids)
        return StreamAnswer(rows=done, forwarded=forwarded)
