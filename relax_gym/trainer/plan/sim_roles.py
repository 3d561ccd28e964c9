"""Simulated roles of the async engine: they keep the real roles' call signatures and their traffic on the data
bus, and spend virtual time from the cost models (:mod:`.costs`) where the real ones compute.

- :class:`Engine` / :class:`EnginePool`: inference replicas. An engine decodes its running sequences together
  (processor sharing: each gets ``throughput(n) / n`` tokens/s, :meth:`~.costs.GenerationCost.throughput`), at
  most ``max_batch`` at once, the rest queued in arrival order; it stops while weights load (``pause``) and
  answers each turn with the weight version it serves when the turn ends, as the engines do. The pool sends each
  turn to the least-loaded replica (ties: the lowest index), where Serve picks the shorter of two random queues.
- :class:`SimEnvWorker`: ``run_group(partition, group, seeds, sample_ids, born=)`` as
  :class:`~relax_gym.trainer.async_engine.roles.env_worker.EnvWorkerRole` has it: plays the group's episodes
  (env reset, then turns on the engines with tool waits between them), claims a carry slot through the real
  :func:`~relax_gym.trainer.async_engine.carry.claim_slot` when it has no partition, and puts the group's rows on
  the real bus with one ``put``. Rows carry what the consumers read (``group_id``, ``reward``, ``trainable``,
  ``policy_versions``) and ``tokens`` as a ``range`` of their count (the real rows and the controller's masked rows hold a list).
- :class:`SimReference`: the reference role's streaming loop (micro-batches as rows arrive, a forward of
  ``ref_s_per_token`` per token, a ``ref_logprobs`` column written back, ack).
- :class:`SimActor`: :meth:`~relax_gym.trainer.async_engine.roles.actor.ActorRole.train_step`'s loop: whole-group
  micro-batches fetched from the bus as they are ready (the next fetch is in flight while one trains), the wait
  for each counted as data wait, a forward + backward per micro-batch that forwards anything (zero-advantage and
  masked rows are not forwarded), one optimiser step, then the weight push (:class:`SimWeights`); staleness per
  sample from the real :func:`~relax_gym.trainer.async_engine.staleness.staleness` (kept in ``staleness`` for the
  planner's histogram, not in the answer).

Every simulated role answers the real role's contract (:mod:`~relax_gym.trainer.async_engine.contracts`): the same
keys, so the controller reads a simulated run exactly as a real one (tests/trainer/async_engine/roles/test_role_contracts.py).

The advantages role is not simulated: the schedule runs the real
:class:`~relax_gym.trainer.async_engine.roles.advantages.AdvantagesRole` on the same bus (its compute is
negligible and costs no virtual time).

:class:`EventLog` records what happened and when (virtual seconds); two runs of the same schedule give identical
logs (:meth:`EventLog.digest`).
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from relax_gym.trainer.async_engine.carry import claim_slot
from relax_gym.trainer.async_engine.contracts import ActorStepAnswer, EpisodeAnswer, StreamAnswer
from relax_gym.trainer.async_engine.staleness import off_policy_tis_cap, staleness, staleness_stats
from relax_gym.trainer.config import AlgorithmConfig, TrainerSection
from relax_gym.trainer.rollout.samples import EpisodeSummary
from relax_gym.trainer.plan.costs import (
    Costs,
    EpisodeDraw,
    GenerationCost,
    episode_rng,
    group_rng,
)

__all__ = ["Engine", "EnginePool", "EventLog", "SimActor", "SimEnvWorker", "SimReference", "SimWeights", "episode_answer",
           "parse_sample_id"]


def _now() -> float:
    return asyncio.get_running_loop().time()


def parse_sample_id(sid: str) -> tuple[int, int, int]:
    """``"s000003-g0002-01"`` -> (3, 2, 1): launch step (from 1), prompt, member
    (:func:`~relax_gym.trainer.rollout.samples.sample_id`)."""
    step, group, member = sid.split("-")
    return int(step[1:]), int(group[1:]), int(member)


def episode_answer(sid: str, group: int, reward: float, completion_tokens: int, versions: list[int],
                   **placed: Any) -> EpisodeAnswer:
    """A simulated episode's answer in the env worker's contract (``placed``: ``partition=`` for a training group)."""
    return EpisodeAnswer(**asdict(EpisodeSummary(sample_id=sid, group_id=int(group), reward=float(reward), status="ok",
                                                 trainable=True, completion_tokens=int(completion_tokens),
                                                 policy_versions=list(versions))), **placed)


class EventLog:
    """Timestamped events of one simulated run: ``(virtual seconds, kind, fields)``."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, str, dict[str, Any]]] = []

    def add(self, kind: str, **fields: Any) -> None:
        self.rows.append((_now(), kind, fields))

    def lines(self) -> list[str]:
        return [json.dumps({"t": t, "event": kind, **fields}, sort_keys=True) for t, kind, fields in self.rows]

    def digest(self) -> str:
        h = hashlib.sha256()
        for line in self.lines():
            h.update(line.encode() + b"\n")
        return h.hexdigest()

    def write(self, path: str | Path) -> None:
        Path(path).write_text("\n".join(self.lines()) + "\n")

    def kinds(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, f) for t, k, f in self.rows if k == kind]


class Engine:
    """One inference replica on the virtual clock (see the module docstring). Processor sharing is kept with one
    number, the work each running sequence has received so far (``_level``): a sequence of ``work`` tokens that
    starts at level L ends when the level reaches L + work, so an arrival or an end costs O(log n)."""

    def __init__(self, index: int, cost: GenerationCost) -> None:
        self.index, self.cost = index, cost
        self.version = 0
        self.busy_s = 0.0  # time with sequences running (not paused)
        self.tokens = 0.0  # decode-token work served
        self._level = 0.0
        self._at = 0.0
        self._running: list[tuple[float, int, asyncio.Future]] = []  # (end level, arrival number, answer)
        self._queue: deque[tuple[float, int, asyncio.Future]] = deque()  # (work, arrival number, answer)
        self._paused = 0
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer fires
        self._arrivals = 0

    def load(self) -> int:
        return len(self._running) + len(self._queue)

    def _per_sequence(self) -> float:
        n = len(self._running)
        return self.cost.throughput(n) / n if n and not self._paused else 0.0

    def _update(self) -> None:
        now = _now()
        dt = now - self._at
        if dt > 0:
            rate = self._per_sequence()
            if rate > 0:
                self._level += rate * dt
                self.busy_s += dt
                self.tokens += rate * dt * len(self._running)
        self._at = now

    def _schedule(self) -> None:
        """Set the timer for the head's end, unless one already set fires no later (it then finds the head not due
        yet and sets the timer again): arrivals only delay the head, so most events set no timer."""
        rate = self._per_sequence()
        if rate <= 0:
            return  # paused or idle: a pending timer fires, finds nothing due, and sets none
        due = self._at + max(0.0, (self._running[0][0] - self._level) / rate)
        if self._timer is not None:
            if self._due <= due:
                return
            self._timer.cancel()
        self._due = due
        self._timer = asyncio.get_running_loop().call_at(due, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._update()
        eps = 1e-9 * max(1.0, self._level)
        ended = 0
        while self._running and self._running[0][0] <= self._level + eps:
            _, _, answer = heapq.heappop(self._running)
            ended += 1
            if not answer.done():
                answer.set_result(self.version)
        rate = self._per_sequence()
        if not ended and rate > 0 and (self._running[0][0] - self._level) / rate < 1e-9:  # rounding: it is due
            _, _, answer = heapq.heappop(self._running)
            if not answer.done():
                answer.set_result(self.version)
        self._admit()
        self._schedule()

    def _admit(self) -> None:
        while self._queue and len(self._running) < self.cost.max_batch:
            work, n, answer = self._queue.popleft()
            heapq.heappush(self._running, (self._level + work, n, answer))

    async def generate(self, work: float) -> int:
        """Decode ``work`` tokens (prefill included, in decode tokens); answers the weight version at the end."""
        self._update()
        answer = asyncio.get_running_loop().create_future()
        self._arrivals += 1
        self._queue.append((max(work, 1e-9), self._arrivals, answer))
        self._admit()
        self._schedule()
        try:
            return await answer
        except asyncio.CancelledError:  # a cancelled episode frees its place at once
            self._update()
            self._running = [e for e in self._running if e[2] is not answer]
            heapq.heapify(self._running)
            self._queue = deque(e for e in self._queue if e[2] is not answer)
            self._admit()
            self._schedule()
            raise

    def pause(self) -> None:
        self._update()
        self._paused += 1
        self._schedule()

    def resume(self) -> None:
        self._update()
        self._paused -= 1
        self._schedule()


class EnginePool:
    """The inference replicas of a run; each turn goes to the least-loaded one."""

    def __init__(self, replicas: int, cost: GenerationCost) -> None:
        self.cost = cost
        self.engines = [Engine(i, cost) for i in range(replicas)]

    async def generate(self, prompt_tokens: int, completion_tokens: int) -> int:
        engine = min(self.engines, key=lambda e: (e.load(), e.index))
        return await engine.generate(completion_tokens + self.cost.prefill_cost * prompt_tokens)

    def pause(self) -> None:
        for e in self.engines:
            e.pause()

    def resume(self, version: int | None = None) -> None:
        for e in self.engines:
            if version is not None:
                e.version = version
            e.resume()

    def set_version(self, version: int) -> None:
        for e in self.engines:
            e.version = version

    def busy_s(self) -> float:
        for e in self.engines:
            e._update()
        return sum(e.busy_s for e in self.engines)


class SimWeights:
    """The weight push: ``push_seconds`` in all, the engines stopped for its last ``pause_seconds``; they serve
    ``version`` once it ends."""

    def __init__(self, pool: EnginePool, costs: Costs, log: EventLog) -> None:
        self.pool, self.sync, self.log = pool, costs.sync, log

    async def push(self, version: int) -> float:
        t0 = _now()
        self.log.add("push_start", version=version)
        total, pause = self.sync.push_seconds(), self.sync.pause_seconds()
        await asyncio.sleep(total - pause)  # buckets on the wire while the engines generate
        self.pool.pause()
        try:
            await asyncio.sleep(pause)
        finally:
            self.pool.resume(version)
        self.log.add("push_end", version=version)
        return _now() - t0


class SimEnvWorker:
    """Plays groups (see the module docstring). ``slots``: the run's CarrySlots (carry) or None; ``episodes``: a
    semaphore of episodes in play at once (the env workers' pools)."""

    def __init__(self, costs: Costs, seed: int, pool: EnginePool, log: EventLog, *, episodes: asyncio.Semaphore,
                 bus: Any = None, slots: Any = None) -> None:
        self.costs, self.seed, self.pool, self.log = costs, seed, pool, log
        self.bus, self.slots, self.episodes = bus, slots, episodes
        self.spans: dict[int, list[float]] = {}  # partition -> [first start, last end] of the groups it holds

    def draw(self, sid: str) -> EpisodeDraw:
        step, prompt, member = parse_sample_id(sid)
        return self.costs.episode.draw(episode_rng(self.seed, step, prompt, member))

    def rewards(self, sids: list[str]) -> list[float]:
        """The group's rewards: all equal with probability ``zero_adv_group_share``, else 0/1 not all equal."""
        step, prompt, _ = parse_sample_id(sids[0])
        rng = group_rng(self.seed, step, prompt)
        if rng.random() < self.costs.episode.zero_adv_group_share or len(sids) == 1:
            return [0.0] * len(sids)
        r = [float(rng.randrange(2)) for _ in sids]
        if len(set(r)) == 1:
            r[0] = 1.0 - r[0]
        return r

    async def episode(self, draw: EpisodeDraw) -> list[int]:
        """One episode: wait for a place in the pools, reset, then turns and tool waits; the versions per turn."""
        async with self.episodes:
            if draw.reset_s > 0:
                await asyncio.sleep(draw.reset_s)
            versions = []
            for turn in draw.turns:
                versions.append(await self.pool.generate(turn.prompt_tokens, turn.completion_tokens))
                if turn.tool_s > 0:
                    await asyncio.sleep(turn.tool_s)
            return versions

    async def play(self, sids: list[str]) -> tuple[list[EpisodeDraw], list[list[int]], list[float]]:
        draws = [self.draw(s) for s in sids]
        versions = await asyncio.gather(*(self.episode(d) for d in draws))
        return draws, list(versions), self.rewards(sids)

    async def run_group(self, partition: int | None, group: int, seeds: list[int], sample_ids: list[str], *,
                        born: int | None = None) -> list[EpisodeAnswer]:
        """The env-worker role's call (``seeds`` are not used: an episode's draws come from its sample id)."""
        self.log.add("group_start", group=group, partition=partition, first=sample_ids[0], born=born)
        started = _now()
        draws, versions, rewards = await self.play(sample_ids)
        if partition is None:
            partition = await claim_slot(self.slots, sample_ids[0], born)
        if partition is not None:
            span = self.spans.setdefault(partition, [started, started])
            span[0], span[1] = min(span[0], started), max(span[1], _now())
        rows = [{"sample_id": sid, "group_id": group, "reward": r, "trainable": True, "status": "ok",
                 "tokens": range(d.tokens), "policy_versions": v}
                for sid, d, v, r in zip(sample_ids, draws, versions, rewards, strict=True)]
        if partition is not None:
            await self.bus.put(partition, rows)
        self.log.add("group_end", group=group, partition=partition, first=sample_ids[0],
                     version_min=min(min(v) for v in versions))
        return [episode_answer(sid, group, r, d.completion_tokens, v, partition=partition)
                for sid, d, v, r in zip(sample_ids, draws, versions, rewards, strict=True)]


class SimReference:
    """The reference role's streaming call, its forward timed by ``ref_s_per_token``."""

    TASK = "reference"

    def __init__(self, costs: Costs, bus: Any, actor_gpus: int) -> None:
        self.costs, self.bus = costs, bus
        self.factor = costs.train.factor(actor_gpus)

    async def process(self, partition: int, n_rows: int, reference_path: str | None = None) -> StreamAnswer:
        done = forwarded = 0
        while done < n_rows:
            batch = await self.bus.fetch(partition, self.TASK, ["tokens", "trainable"], self.costs.train.micro_batch_size)
            if batch is None:
                break
            live = [len(n) for n, ok in zip(batch.fields["tokens"], batch.fields["trainable"]) if ok]
            if live:
                await asyncio.sleep(sum(live) * self.costs.train.ref_s_per_token * self.factor)
                forwarded += len(live)
            await self.bus.put_fields(partition, list(batch.sample_ids), {"ref_logprobs": [[] for _ in batch.sample_ids]})
            await self.bus.ack(batch)
            done += len(batch.sample_ids)
        return StreamAnswer(rows=done, forwarded=forwarded)


class SimActor:
    """The actor role's ``train_step`` (see the module docstring); ``weights``: a :class:`SimWeights`;
    ``algorithm`` / ``trainer``: the run's sections (the truncated-IS cap the answer names). ``staleness``: every
    consumed sample's, in order."""

    TASK = "actor"
    FIELDS: ClassVar[list[str]] = ["group_id", "trainable", "keep", "advantages", "tokens", "policy_versions"]

    def __init__(self, costs: Costs, bus: Any, weights: SimWeights, actor_gpus: int, log: EventLog, *,
                 algorithm: AlgorithmConfig | None = None, trainer: TrainerSection | None = None) -> None:
        self.costs, self.bus, self.weights, self.log = costs, bus, weights, log
        self.algorithm, self.trainer = algorithm or AlgorithmConfig(), trainer or TrainerSection()
        self.factor = costs.train.factor(actor_gpus)
        self.version = 0
        self.staleness: list[int] = []

    def compute_s(self, tokens: int) -> float:
        """One micro-batch that forwards ``tokens`` tokens (0: nothing forwarded, nothing spent)."""
        t = self.costs.train
        return (t.s_per_micro_batch + tokens * t.s_per_token) * self.factor if tokens > 0 else 0.0

    async def train_step(self, partition: int, n_rows: int, group_size: int, *, max_staleness: int = 0,
                         with_reference: bool = False, lr_decay_from: float | None = 0.0) -> ActorStepAnswer:
        bus = self.bus
        fields = self.FIELDS + (["ref_logprobs"] if with_reference else [])
        trained_version = self.version
        batch_size = max(1, self.costs.train.micro_batch_size // group_size) * group_size
        t_start = _now()
        wait = compute = 0.0
        consumed: list[str] = []
        stale: list[int] = []
        versions: list[int] = []
        trained = 0

        def fetch() -> asyncio.Task:
            return asyncio.ensure_future(bus.fetch(partition, self.TASK, fields, batch_size, whole_groups=True))

        pending: asyncio.Task | None = fetch()
        try:
            while pending is not None:
                t0 = _now()
                batch = await pending
                waited = _now() - t0
                wait += waited
                if batch is None:  # dropped partition: the run is stopping
                    break
                got = len(consumed) + len(batch.sample_ids)
                pending = fetch() if got < n_rows else None
                f = batch.fields
                tokens = live = 0
                for i in range(len(batch.sample_ids)):
                    vs = f["policy_versions"][i]
                    if vs:
                        stale.append(staleness(trained_version, vs))
                        versions.extend(vs)
                    if f["trainable"][i] and f["keep"][i] and f["advantages"][i] != 0:
                        tokens += len(f["tokens"][i])
                        live += 1
                spent = self.compute_s(tokens)
                self.log.add("micro_batch", step=partition, rows=len(batch.sample_ids), live=live, wait=waited)
                if spent > 0:
                    await asyncio.sleep(spent)
                compute += spent
                trained += live
                await bus.ack(batch)
                consumed.extend(batch.sample_ids)
        finally:
            if pending is not None and not pending.done():
                pending.cancel()
        overhead = self.costs.train.step_overhead_s * self.factor
        await asyncio.sleep(overhead)
        compute += overhead
        self.log.add("train_end", step=partition, consumed=len(consumed), trained=trained)
        sync_s = await self.weights.push(self.version + 1)
        self.version += 1
        self.staleness.extend(stale)
        return ActorStepAnswer(**{
            "metrics": {}, "version": self.version, "trained_version": trained_version, "sample_ids": consumed,
            "episodes_trained": trained, "partial_groups": 0, **staleness_stats(stale),
            "rollout_version_min": min(versions) if versions else -1, "rollout_version_max": max(versions) if versions else -1,
            "data_wait_s": wait, "time_train_s": compute, "time_sync_s": sync_s, "actor_step_s": _now() - t_start,
            "tis_cap": off_policy_tis_cap(self.algorithm, self.trainer, max_staleness),
        })
