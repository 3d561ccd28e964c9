"""The env-worker role: plays episodes (env ↔ inference) and writes each finished group to the data bus.

The controller sends one call per prompt group (:meth:`EnvWorkerRole.run_group`), so Serve spreads groups over the
replicas. The group's episodes run concurrently on envs from the replica's pool, through the same episode runner
as the colocate trainer (:func:`~relax_gym.trainer.rollout.episode.run_episode`); the engine is the inference deployment,
reached with SGLang's protocol over deployment-handle calls. Every engine answer carries the weight version that
produced it, and the row keeps them all (``policy_versions``, one per turn; ``policy_version`` is the oldest).

With ``trainer.stragglers: carry`` the controller sends groups without a partition: the worker plays the group,
then asks the run's :class:`~relax_gym.trainer.async_engine.carry.CarrySlots` which partition it joins (the lowest with room,
if the group is fresh enough) and puts it there; a group too stale for any is not put, and its answer says so
(``partition`` None).

Media are stored once per group (``trainer.dedupe_media``, on by default): the rows of a group render the same
prompt, so each distinct media tensor goes on the bus once, by content key, and the rows carry references to it
(:mod:`~relax_gym.trainer.rollout.media`); each summary reports its row's ``bus_bytes`` and ``media_bytes_saved``.

The group is written with one ``put`` once all its episodes have ended: the advantages role needs whole groups,
and a group re-sent after a replica failure then never leaves half a group (or a duplicate) on the bus. A failed
episode (env or engine error, or anything unexpected around it) is written masked (``trainable`` False, loss
mask all 0) and reported in the call's answer; it never fails the call.

Recovery: engine calls that hit a dying inference replica are resent (the client's retries cover
``roles.replica_wait_s`` while Serve replaces it); a group re-sent by the controller after this replica died finds
its rows on the bus when the first attempt's put had landed, and keeps them. An env that failed outside the episode
runner is replaced by a fresh one; a replica that cannot make one is reported unhealthy (Serve replaces it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

import relax_gym
from relax_gym.trainer.async_engine.bus_source import open_bus
from relax_gym.trainer.async_engine.carry import claim_slot
from relax_gym.trainer.async_engine.contracts import EpisodeAnswer
from relax_gym.trainer.async_engine.replica import (
    announce_replica,
    build_processor_only,
    retries_within,
    setup_replica,
)
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.databus.media import payload_bytes
from relax_gym.trainer.databus.protocol import DuplicateRowError
from relax_gym.trainer.engines.serve_client import HandleEngineClient
from relax_gym.trainer.faults.hooks import SandboxHangs
from relax_gym.trainer.policy.config import routing_dims
from relax_gym.trainer.rewards.judge import Judge, judge_trajectory
from relax_gym.trainer.rewards.judge_host import judge_processor
from relax_gym.trainer.rollout.episode import Trajectory, run_episode
from relax_gym.trainer.rollout.media import split_media
from relax_gym.trainer.rollout.program_episode import ProgramEpisodes, is_agent_program
from relax_gym.trainer.rollout.samples import (
    parse_version,
    summary_dict,
    trajectory_row,
)
from relax_gym.trainer.run.rollout_records import RolloutRecorder

__all__ = ["EnvWorkerRole", "group_rows"]

log = logging.getLogger(__name__)


class EnvWorkerRole:
    """``cfg``: the run's config (a dict); ``bus``: a :class:`~relax_gym.trainer.databus.link.BusLink` (or a bus
    object, for in-process use); ``engine``: the inference deployment's app name, or an engine client."""

    def __init__(self, cfg: dict[str, Any], bus: Any, engine: Any, *, pool_size: int = 32, eval_pool_size: int = 16,
                 torch_threads: int | None = None, registry: Any = None, slots: Any = None, judge_app: Any = None,
                 run_dir: str | None = None) -> None:
        """``slots``: the run's :class:`~relax_gym.trainer.async_engine.carry.CarrySlots` (its Ray actor handle, or the object
        itself) when stragglers are carried; None otherwise. ``judge_app``: the genrm role's app name (or an engine
        client serving the judge), when the run has a ``judge:``. ``run_dir``: the run directory, on this machine;
        the replica writes the rollout records of the episodes it plays there (relax-gym view: it holds their media,
        which then never travel to the controller); None writes none."""
        setup_replica(torch_threads)
        self._slots = slots
        self.cfg = RelaxConfig.model_validate(cfg)
        m = self.cfg.metrics
        self._records = (RolloutRecorder(run_dir, per_step=m.rollouts_per_step, media_mb=m.rollout_media_mb,
                                         env=self.cfg.env.id) if run_dir is not None else None)
        self.processor = build_processor_only(self.cfg.model)
        self.routing = routing_dims(self.cfg.model)  # MoE: record the routed experts of training episodes
        self._bus_source, self._engine_source = bus, engine
        self._judge_source = judge_app
        self._judge: Judge | None = None
        self._bus: Any = None
        self._client: Any = None
        env = self.cfg.env
        self._train_envs = [relax_gym.make(env.id, **env.kwargs) for _ in range(pool_size)]
        self._eval_envs = [relax_gym.make(env.id, **{**env.kwargs, **env.eval_kwargs}) for _ in range(eval_pool_size)]
        # agent-program envs: an OpenAI gateway over the engine client (a prompt longer than the model's positions is
        # refused by the engine: that call fails and the episode is masked)
        self._programs = ProgramEpisodes(self.processor)
        self._train_pool: asyncio.Queue | None = None
        self._eval_pool: asyncio.Queue | None = None
        self._fatal: str | None = None
        announce_replica(registry, "env_worker")

    # -- set-up inside the replica's event loop ------------------------------------------------------------

    def _ready(self) -> None:
        if self._train_pool is not None:
            return
        self._train_pool, self._eval_pool = asyncio.Queue(), asyncio.Queue()
        for env in self._train_envs:
            self._train_pool.put_nowait(env)
        for env in self._eval_envs:
            self._eval_pool.put_nowait(env)
        source = self._bus_source
        self._bus = open_bus(source)
        if isinstance(self._engine_source, str):
            from ray import serve

            handle = serve.get_app_handle(self._engine_source)
            # three hops: this client (coalescing) → InferenceRole.generate (a handle call) → the engine
            self._client = HandleEngineClient(handle, retries=retries_within(self.cfg.roles.replica_wait_s),
                                              max_batch=self.cfg.inference.max_batch)
        else:
            self._client = self._engine_source
        if self._judge_source is not None:  # the judge's code runs here; its engine is the genrm role
            j = self.cfg.judge
            if j is None:
                raise ValueError("a judge engine was given but the run's config has no judge: section")
            client = self._judge_source
            if isinstance(client, str):
                from ray import serve

                client = HandleEngineClient(serve.get_app_handle(client), retries=retries_within(self.cfg.roles.replica_wait_s),
                                            max_batch=j.max_batch)
            # a call may first wait for a replaced genrm replica (the client resends it for roles.replica_wait_s):
            # that wait does not count against the judge's own time limit
            self._judge = Judge(client, judge_processor(j), max_new_tokens=j.max_new_tokens,
                                timeout_s=j.timeout_s + self.cfg.roles.replica_wait_s)

    def _sampling(self, greedy: bool) -> dict[str, Any]:
        inf = self.cfg.inference
        return {"max_new_tokens": inf.max_new_tokens, "temperature": 0.0 if greedy else inf.temperature,
                "top_p": 1.0 if greedy else inf.top_p}

    # -- episodes --------------------------------------------------------------------------------------------

    async def _episode(self, pool: asyncio.Queue, seed: int, group: int, greedy: bool) -> tuple[Trajectory, list[int]]:
        env = await pool.get()
        try:
            if is_agent_program(env):
                traj = await self._programs.run(env, self._client, seed=seed, group_id=group, sampling_params=self._sampling(greedy))
            else:
                traj = await run_episode(env, self._client, self.processor, seed=seed, group_id=group, sampling_params=self._sampling(greedy),
                                         max_turns=self.cfg.trainer.max_turns, routing=None if greedy else self.routing)
        except Exception as exc:  # noqa: BLE001 - the runner masks env / engine errors; anything else is masked here
            log.exception("episode seed %d failed outside the runner", seed)
            traj = Trajectory(group_id=group, seed=seed, status="env_error", error=f"{type(exc).__name__}: {exc}")
            env = self._fresh_env(env, greedy)
        finally:
            pool.put_nowait(env)
        traj = await judge_trajectory(traj, self._judge)  # pending judge parts: scored now, as each episode ends
        versions = [v for v in (parse_version(w) for w in traj.weight_versions) if v is not None]
        return traj, versions

    def _fresh_env(self, broken: Any, greedy: bool) -> Any:
        """A new env in place of one whose episode failed outside the runner (it may be in any state)."""
        e = self.cfg.env
        try:
            fresh = relax_gym.make(e.id, **({**e.kwargs, **e.eval_kwargs} if greedy else e.kwargs))
        except Exception as exc:  # noqa: BLE001 - reported through the health check
            self._fatal = f"cannot make a new {e.id!r} env: {type(exc).__name__}: {exc}"
            return broken
        envs = self._eval_envs if greedy else self._train_envs
        envs[envs.index(broken)] = fresh
        try:
            broken.close()
        except Exception:  # noqa: BLE001 - it is being thrown away
            pass
        return fresh

    def check_health(self) -> None:
        """Serve's health check (the call itself is the heartbeat): unhealthy once an env could not be replaced."""
        if self._fatal is not None:
            raise RuntimeError(f"env worker replica: {self._fatal}")

    async def arm_fault(self, kind: str, count: int) -> None:
        """Fault injection (``faults:``): ``sandbox_hang`` makes this replica's next ``count`` sandbox commands hang
        until their timeout."""
        if kind != "sandbox_hang":
            raise ValueError(f"the env worker injects sandbox_hang faults, not {kind!r}")
        SandboxHangs.arm(count)

    async def run_group(self, partition: int | None, group: int, seeds: list[int], sample_ids: list[str], *,
                        born: int | None = None) -> list[EpisodeAnswer]:
        """Play one prompt group (``seeds`` repeat the prompt's seed), put its rows on ``partition``, and answer
        each episode's summary (reward, status, versions, and the partition it went to) for the controller.
        ``partition`` None: carried stragglers — the group claims its partition once it has finished (``born``:
        the steps trained when it was launched)."""
        if len(seeds) != len(sample_ids):
            raise ValueError(f"run_group: {len(seeds)} seeds for {len(sample_ids)} sample ids")
        if partition is None and (self._slots is None or born is None):
            raise ValueError("run_group without a partition needs the run's carry slots and the group's born step "
                             "(trainer.stragglers=carry)")
        self._ready()
        partition_given = partition  # None: a carried group (``group`` is its launch number, not its place in a step)
        played = await asyncio.gather(*(self._episode(self._train_pool, s, group, False) for s in seeds))
        rows, media, sizes = group_rows([trajectory_row(traj, sid, versions)
                                         for (traj, versions), sid in zip(played, sample_ids)],
                                        dedupe=self.cfg.trainer.dedupe_media)
        if partition is None:
            partition = await claim_slot(self._slots, sample_ids[0], born)
        if partition is not None:
            try:
                await self._bus.put(partition, rows, media=media)
            except DuplicateRowError:  # a re-sent group whose first put landed before its replica died: those rows stay
                log.warning("step partition %d group %d: already on the bus from an earlier attempt; keeping those rows",
                            partition, group)
        if self._records is not None:  # filed under the step that trains the group (a carried one: where it landed)
            step = partition + 1 if partition is not None else _launch_step(sample_ids[0])
            await asyncio.to_thread(self._records.write, step, "train", [traj for traj, _ in played],
                                    first_index=group * len(seeds), arrival=partition_given is None)
        return [{**summary_dict(traj, sid, versions), **(size if partition is not None else {}), "partition": partition}
                for (traj, versions), sid, size in zip(played, sample_ids, sizes)]

    async def evaluate(self, seeds: list[int], *, step: int | None = None, first_index: int = 0) -> list[EpisodeAnswer]:
        """Greedy episodes on the eval split (nothing goes to the bus); one summary per seed. ``step`` (the metrics
        row's) and ``first_index`` (this chunk's place among the step's eval seeds): where the rollout records go;
        without ``step`` none are written."""
        self._ready()
        played = await asyncio.gather(*(self._episode(self._eval_pool, s, i, True) for i, s in enumerate(seeds)))
        if self._records is not None and step is not None:
            await asyncio.to_thread(self._records.write, step, "eval", [traj for traj, _ in played], first_index=first_index)
        return [summary_dict(traj, f"eval-{s}", versions) for (traj, versions), s in zip(played, seeds)]

    def __del__(self) -> None:
        """Serve calls this when the replica is stopped (graceful shutdown, within the deployment's
        ``graceful_shutdown_timeout_s``): the envs close, then this process's sandbox pools, so the replica's
        containers are removed before it exits. A replica killed outright leaves them to the next pool start's
        reaping (their owner is dead) or to ``relax-gym sandbox gc``."""
        programs = getattr(self, "_programs", None)
        if programs is not None:
            programs.close()
        for env in getattr(self, "_train_envs", []) + getattr(self, "_eval_envs", []):
            try:
                env.close()
            except Exception:  # noqa: BLE001 - best effort at shutdown
                log.debug("closing an env failed", exc_info=True)
        try:
            from relax_gym.envs.episode_sandbox import close_shared_pools

            close_shared_pools()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            log.warning("closing the replica's sandbox pools failed", exc_info=True)



def _launch_step(sid: str) -> int:
    """The step a sample id was launched for (``"s000003-g0002-01"`` -> 3)."""
    return int(sid.split("-")[0][1:])


def group_rows(rows: list[dict[str, Any]], *, dedupe: bool = True) -> tuple[list[dict[str, Any]],
                                                                         dict[str, torch.Tensor], list[dict[str, int]]]:
    """A group's bus rows as one put takes them: with ``dedupe``, each distinct media tensor once by content key and
    references in the rows (:func:`~relax_gym.trainer.rollout.media.split_media`); without, the rows as they are.
    Also each row's ``bus_bytes`` (its payload plus the media it is the first to reference) and
    ``media_bytes_saved`` (what it would have carried inline, less that), which the step row sums."""
    inline = [payload_bytes(r) for r in rows]
    if not dedupe:
        return rows, {}, [{"bus_bytes": n, "media_bytes_saved": 0} for n in inline]
    shared, media, stored = split_media(rows)
    sizes = [payload_bytes(r) + s for r, s in zip(shared, stored)]
    return shared, media, [{"bus_bytes": n, "media_bytes_saved": full - n} for n, full in zip(sizes, inline)]
