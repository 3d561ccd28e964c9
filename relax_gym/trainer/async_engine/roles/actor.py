"""The actor role: the policy's trainer in the async engine (``actor.backend``: hf or megatron), one replica.

Per rollout step it streams the step's partition from the data bus in micro-batches of whole GRPO groups, as soon
as the advantages role has finished them (and the reference role, when a KL term is on), and accumulates each
micro-batch's gradient right away, so training overlaps the tail of the rollout. When every row of the step has
arrived it takes exactly one optimiser step (:meth:`~relax_gym.trainer.actors.hf.HFActor.end_stream` normalises
the accumulated gradients so the step equals the colocate trainer's on the same batch), pushes the weights to the
inference engines and only then reports the new version, so "v trained" always means "the engines serve v".

Stale samples (made by an older policy version, up to ``max_staleness`` behind) are corrected with truncated
importance sampling against their rollout log-probs; the cap is ``algorithm.tis_cap`` or, when that is unset and
S ≥ 1, ``trainer.off_policy_tis_cap``. Masked episodes and groups dropped by the dynamic-sampling filter are
consumed (acknowledged) but never forwarded. The answer of a step names every sample id it consumed, the
staleness of each, and how long the actor waited for data.

Under PPO the rows' ``advantages`` are per-token rows (GAE, from the advantages role) and the actor trains on them
as they are; the critic is a role of its own (:mod:`.critic`'s), trained on the same partition beside the actor.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import Counter
from pathlib import Path
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actors.factory import build_actor
from relax_gym.trainer.run.checkpoint import CheckpointWriteError, TrainerState, load_checkpoint, restore_rng, save_checkpoint, trainer_state
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.run.warmup import run_warmup
from relax_gym.trainer.run.seeds import seed_everything
from relax_gym.trainer.run.lr_schedule import step_lr
from relax_gym.trainer.policy import build_policy, save_policy
from relax_gym.trainer.async_engine.recovery import ReplacedActorError
from relax_gym.trainer.async_engine.bus_source import open_bus
from relax_gym.trainer.async_engine.contracts import ActorStepAnswer, CheckpointAnswer, WarmupAnswer
from relax_gym.trainer.async_engine.replica import announce_replica, setup_replica
from relax_gym.trainer.policy.config import routing_dims
from relax_gym.trainer.rollout.media import MediaResolver
from relax_gym.trainer.rollout.samples import ROUTING_FIELD, TRAIN_FIELDS, TrainItem, train_items
from relax_gym.trainer.async_engine.staleness import off_policy_tis_cap, staleness, staleness_stats

__all__ = ["ActorRole"]

log = logging.getLogger(__name__)


def _restart_on_group_failure(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """A call that fails because a rank of the actor's group failed ends in a level-2 restart (see
    :meth:`ActorRole._refuse_if_group_failed`); any other error passes unchanged."""

    @functools.wraps(method)
    async def guarded(self: ActorRole, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except Exception as exc:
            self._refuse_if_group_failed(exc)
            raise

    return guarded


class ActorRole:
    """``cfg``: the run's config (a dict); ``bus``: a BusLink or a bus object; ``weights``: where new weights
    go — the run's DCS coordinator (its Ray actor handle, or a coordinator object), or any object with
    ``async push(state_dict, version)``."""

    TASK = "actor"

    def __init__(self, cfg: dict[str, Any], bus: Any, coordinator: Any = None, *, pusher: Any = None,
                 torch_threads: int | None = None, registry: Any = None, resume_from: str | None = None,
                 group_name: str | None = None) -> None:
        """``coordinator``: the run's DCS coordinator actor, through which the weights are pushed (a
        :class:`~relax_gym.trainer.dcs.push.DCSPush`); ``pusher``: an awaitable ``push(state, version)`` to use
        instead (tests); ``registry``: the run's replica registry (restart counts); ``resume_from``: a checkpoint
        folder to continue from (model, optimizer, version; random states and clock are restored by :meth:`warmup`);
        ``group_name``: the name of the Ray actors of a megatron rank group (``actor.parallel``), ``<name>-rank<r>``."""
        if (coordinator is None) == (pusher is None):
            raise ValueError("ActorRole pushes weights through a DCS coordinator or a given pusher: pass exactly one")
        setup_replica(torch_threads)
        self.cfg = RelaxConfig.model_validate(cfg)
        seed = self.cfg.trainer.seed
        seed_everything(seed)
        self.model, self.processor = build_policy(self.cfg.model)
        self.model.train()
        # actor.backend: hf or megatron (a rank group when actor.parallel asks for more than this process)
        self.actor = build_actor(self.cfg, self.model, self.processor, group_name=group_name)
        self.rng = np.random.default_rng(seed)
        self.version = 0
        self._bus_source = bus
        self._bus: Any = None
        self._media = MediaResolver()  # the rows' shared media tensors, read by key (and cached) as batches arrive
        if pusher is not None:
            self.weights = pusher
        else:
            from relax_gym.trainer.dcs.names import checkpoint_names
            from relax_gym.trainer.dcs.push import in_thread, make_pusher

            self.weights = in_thread(make_pusher(self.cfg.inference, coordinator=coordinator,
                                                 names=checkpoint_names(self.actor.hf_template)))
        self._push_lock = asyncio.Lock()  # a catch-up push never overlaps a step's push
        self._last_push: tuple[dict[str, torch.Tensor], int] | None = None  # what the engines serve
        self._fatal: str | None = None
        self.resumed: TrainerState | None = None
        self._run_start = time.perf_counter()  # the learning-rate schedule's clock (set again by warmup)
        if resume_from is not None:
            self.resumed = load_checkpoint(Path(resume_from), self.actor)
            self.version = self.resumed.version
        self._replacement = announce_replica(registry, "actor") > 1  # Serve restarted the actor in place

    def _ready(self) -> Any:
        if self._bus is None:
            source = self._bus_source
            self._bus = open_bus(source)
        return self._bus

    # -- before the RL loop ------------------------------------------------------------------------------------

    @_restart_on_group_failure
    async def warmup(self) -> WarmupAnswer:
        """The SFT warm-up on format demonstrations (as the colocate trainer runs it), then the first weight push.
        Answers the per-step SFT metrics and the policy version the engines now serve."""
        self._refuse_if_replacement()
        t = self.cfg.trainer
        self._run_start = time.perf_counter()  # the learning-rate schedule's clock (see lr_schedule.progress)
        rows: list[dict[str, float]] = []
        if self.resumed is not None:  # no warm-up: the checkpoint's weights go to the engines under its version
            restore_rng(self.resumed.rng, self.rng)
            self._run_start -= self.resumed.elapsed_s
            await self._push(bump=False)
        elif t.sft_warmup_steps > 0:
            rows = await asyncio.to_thread(self._sft)
            await self._push()
        return {"rows": rows, "version": self.version}

    def _sft(self) -> list[dict[str, float]]:
        cfg = self.cfg
        env = relax_gym.make(cfg.env.id, **cfg.env.kwargs)
        try:
            return run_warmup(self.actor, env, self.processor, self.rng, cfg.trainer, lr=cfg.actor.lr)
        finally:
            env.close()

    @_restart_on_group_failure
    async def save_reference(self, directory: str) -> str:
        """Save the current (warmed-up) policy: the frozen reference of the KL term, and under PPO the critic's
        starting weights."""
        self._refuse_if_replacement()
        frozen = self.actor.hf_model()
        await asyncio.to_thread(save_policy, frozen, self.processor, directory)
        return directory

    async def _push(self, *, bump: bool = True) -> float:
        t0 = time.perf_counter()
        async with self._push_lock:
            version = self.version + 1 if bump else self.version
            # the previous push's copy goes before this one's is made (catch_up reads it under this lock only): one
            # copy of the policy beside the actor's weights and optimizer, not two (a copy is 1.6 GB at
            # Qwen2.5-Omni-3B's width). A failed push sets _fatal and the replica is replaced: nothing needs it then.
            self._last_push = None
            state = {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()}  # HF names
            try:
                await self.weights.push(state, version)
            except Exception as exc:
                self._fatal = f"the push of weight version {version} failed: {type(exc).__name__}: {exc}"
                raise
            self.version = version
            self._last_push = (state, version)
        return time.perf_counter() - t0

    def _refuse_if_replacement(self) -> None:
        if self._replacement:
            raise ReplacedActorError("this actor replica replaced a dead one; its weights and optimizer are not the "
                                     "run's (the controller restarts the run from its last checkpoint)")

    async def catch_up(self, url: str) -> int:
        """A replaced inference replica (engine at ``url``) asks for the weights the others serve: the last push
        is sent again, to every engine and so to the new one, unless it holds that version already. Answers the
        version it serves now."""
        self._refuse_if_replacement()
        async with self._push_lock:
            if self._last_push is None:
                return self.version  # nothing pushed yet: the first push reaches the new engine
            state, version = self._last_push
            if await asyncio.to_thread(_engine_version, url) == str(version):
                return version
            log.warning("engine %s joined behind weight version %d; pushing it again", url, version)
            await self.weights.push(state, version)
            return version

    def check_health(self) -> None:
        """Serve's health check: a failed weight push leaves engines paused or behind, a dead rank leaves a rank
        group without its shard; the replica is then replaced (and the controller restarts the run from its last
        checkpoint)."""
        if self._fatal is not None:
            raise RuntimeError(f"actor replica: {self._fatal}")
        group_health = getattr(self.actor, "check_health", None)
        if group_health is not None:
            try:
                group_health()
            except Exception as exc:
                self._fatal = f"its rank group failed: {exc}"
                raise RuntimeError(f"actor replica: {self._fatal}") from exc

    def _refuse_if_group_failed(self, exc: BaseException) -> None:
        """A rank of the actor's group died or failed: its training state is gone, so the run restarts from its
        last checkpoint (the controller's level-2 restart), as when the whole replica dies."""
        from relax_gym.trainer.actors.megatron.group import RankGroupError

        if isinstance(exc, RankGroupError):
            self._fatal = f"its rank group failed: {exc}"
            raise ReplacedActorError(f"the actor's rank group failed: {exc}") from exc

    def __del__(self) -> None:
        try:  # Serve drops the replica: release the backend (megatron's process group)
            self.actor.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- one RL step ---------------------------------------------------------------------------------------------

    @_restart_on_group_failure
    async def train_step(self, partition: int, n_rows: int, group_size: int, *, max_staleness: int = 0,
                         with_reference: bool = False, lr_decay_from: float | None = 0.0) -> ActorStepAnswer:
        """Train on the ``n_rows`` rows of ``partition`` as they become ready; one optimiser step; push weights.
        ``lr_decay_from``: the run's progress at which the lr decay started (None: not yet, the lr holds at its
        peak; the controller's :class:`~relax_gym.trainer.run.lr_schedule.DecayGate` decides)."""
        self._refuse_if_replacement()
        bus = self._ready()
        algo, a, t = self.cfg.algorithm, self.cfg.actor, self.cfg.trainer
        self.actor.set_lr(step_lr(a, t, partition, time.perf_counter() - self._run_start, lr_decay_from))
        tis_cap = off_policy_tis_cap(self.cfg.algorithm, self.cfg.trainer, max_staleness)
        fields = list(TRAIN_FIELDS) + (["ref_logprobs"] if with_reference else [])
        fields += [ROUTING_FIELD] if routing_dims(self.cfg.model) is not None else []
        trained_version = self.version  # the policy these gradients are taken at
        batch_size = max(1, self.cfg.actor.micro_batch_size // group_size) * group_size  # whole groups per micro-batch
        t_start = time.perf_counter()
        wait = compute = 0.0
        consumed: list[str] = []
        stale: list[int] = []
        versions: list[int] = []
        partial_groups = trained = 0
        replay: list[tuple[list[TrainItem], torch.Tensor, list[torch.Tensor] | None, list[torch.Tensor]]] = []

        def fetch() -> asyncio.Task:
            return asyncio.ensure_future(bus.fetch(partition, self.TASK, fields, batch_size, whole_groups=True))

        self.actor.begin_stream()
        pending = fetch()
        while pending is not None:
            t0 = time.perf_counter()
            batch = await pending
            wait += time.perf_counter() - t0
            if batch is None:  # dropped partition: the run is stopping
                break
            batch.fields["mm_inputs"] = await self._media.resolve(batch.fields["mm_inputs"],
                                                                  functools.partial(bus.get_media, partition))
            items = train_items(list(batch.sample_ids), batch.fields)
            got = len(consumed) + len(items)
            pending = fetch() if got < n_rows else None  # the next micro-batch arrives while this one trains
            sizes = Counter(it.group_id for it in items)
            short = sum(1 for n in sizes.values() if n != group_size)
            if short:  # only possible when a producer sealed a partition with a group left short
                log.warning("step partition %d: %d group(s) arrived incomplete", partition, short)
            partial_groups += short
            for it in items:
                if it.policy_versions:
                    stale.append(staleness(trained_version, it.policy_versions))
                    versions.extend(it.policy_versions)
            live = [it for it in items if it.trained]
            if live:
                adv = _advantages(live)
                refs = [it.ref_logprobs for it in live] if with_reference else None
                t1 = time.perf_counter()
                lps = await asyncio.to_thread(self.actor.stream_micro_batch, live, adv, algo, ref_logprobs=refs, tis_cap=tis_cap)
                compute += time.perf_counter() - t1
                trained += len(live)
                if self.cfg.actor.epochs_per_step > 1:
                    replay.append((live, adv, refs, lps))
            await bus.ack(batch)
            consumed.extend(batch.sample_ids)
        t1 = time.perf_counter()
        metrics = await asyncio.to_thread(self._finish, replay, tis_cap)
        compute += time.perf_counter() - t1
        sync_s = await self._push()
        wall = time.perf_counter() - t_start
        return ActorStepAnswer(**{
            "metrics": metrics, "version": self.version, "trained_version": trained_version, "sample_ids": consumed,
            "episodes_trained": trained, "partial_groups": partial_groups, **staleness_stats(stale),
            "rollout_version_min": min(versions) if versions else -1, "rollout_version_max": max(versions) if versions else -1,
            "data_wait_s": wait, "time_train_s": compute, "time_sync_s": sync_s, "actor_step_s": wall,
            "tis_cap": tis_cap,
        })

    def _finish(self, replay: list, tis_cap: float | None) -> dict[str, float]:
        metrics = self.actor.end_stream()
        algo = self.cfg.algorithm
        for _ in range(self.cfg.actor.epochs_per_step - 1):  # further epochs over the kept micro-batches
            self.actor.begin_stream()
            for items, adv, refs, old in replay:
                self.actor.stream_micro_batch(items, adv, algo, ref_logprobs=refs, old_logprobs=old, tis_cap=tis_cap)
            metrics = self.actor.end_stream()
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------------------------

    @_restart_on_group_failure
    async def checkpoint(self, step: int, run_dir: str, extra: dict[str, Any] | None = None,
                         parts: dict[str, str] | None = None) -> CheckpointAnswer:
        """The colocate trainer's layout (:mod:`~relax_gym.trainer.run.checkpoint`): ``checkpoints/step_NNNNNN/`` with
        the model, the optimizer and the trainer state; ``extra``: what the controller adds (its ledger, the bus
        cursor); ``parts``: folders other roles staged for this checkpoint (the critic's), moved in by name.
        Returns ``{"path", "error"}``: a write that failed (disk full) is an ``error`` for the controller to report,
        not a failure of this role (the previous checkpoint is intact)."""
        self._refuse_if_replacement()
        state = trainer_state(self.cfg.trainer, step=step, version=self.version, rng=self.rng,
                              elapsed_s=time.perf_counter() - self._run_start, extra=extra)
        staged = {name: Path(folder) for name, folder in (parts or {}).items()}
        try:
            out = await asyncio.to_thread(save_checkpoint, Path(run_dir), self.actor, state, staged)
        except CheckpointWriteError as exc:
            return {"path": None, "error": str(exc)}
        return {"path": str(out), "error": None}

    async def current_version(self) -> int:
        return self.version


def _advantages(items: list[TrainItem]) -> torch.Tensor | list[torch.Tensor]:
    """The items' advantages as the actor's step takes them: one number each, or (PPO) one per-token row each."""
    if items and items[0].token_advantages is not None:
        return [it.token_advantages for it in items]
    return torch.tensor([it.advantage for it in items], dtype=torch.float32)


def _engine_version(url: str) -> str | None:
    from relax_gym.trainer.engines.client import EngineClient

    with EngineClient(url, timeout=10.0, retries=2) as client:
        return client.get_weight_version()
