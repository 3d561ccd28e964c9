"""The async engine's controller (``trainer.mode: async``): builds the topology, deploys the roles with Ray Serve,
and drives the run through deployment handles.

    trainer = AsyncTrainer(cfg, run_dir)
    summary = trainer.run()          # same metrics.jsonl / TensorBoard / checkpoints / eval as ColocateTrainer
    trainer.close()

Topology (``roles:`` in the config): env workers, inference, advantages, actor (one replica), a reference
role when ``algorithm.kl_coef > 0``, and a critic (one replica) when ``algorithm.name`` is ppo; each is a Serve
application of one deployment, HTTP proxy off; roles that mostly wait reserve no CPU. Next to them the run starts
small Ray actors: the DCS coordinator (the inference replicas register their engines there; the actor pushes weights
through it) and, for ``roles.bus: inprocess``, the bus host (for ``transferqueue``, TransferQueue's own actors).

The drive, per step k (counted from 0; metrics rows use k + 1 like the colocate trainer):

1. the launcher waits on the :class:`~relax_gym.trainer.async_engine.staleness.StalenessGate` until ``k - v_trained <= S``,
   opens partition k on the bus and sends one ``run_group`` call per prompt group to the env workers (the seeds
   are the colocate trainer's, so both modes see the same prompts), plus one ``process`` call per streaming
   role (advantages, reference, critic) for that partition, and hands them to the loop as one
   :class:`~relax_gym.trainer.async_engine.launches.LaunchedStep`;
2. the trainer loop calls ``actor.train_step(k)``, which trains on micro-batches as they become ready and
   returns once the step's weights are in the engines (under PPO ``critic.train(k)`` runs beside it on the same
   partition, whose ``values`` the critic's streaming call of step 1 wrote for the advantages role's GAE); then the
   gate advances, which may start a rollout;
3. the step's metrics are gathered from the answers (rewards and statuses from the env workers, group counts from
   the advantages role, losses, staleness and data wait from the actor: typed in
   :mod:`~relax_gym.trainer.async_engine.contracts`), and the step tail both modes share
   (:class:`~relax_gym.trainer.run.driver.RunDriver`: eval, metrics row, checkpoint, stop) runs in step order.

Every call is awaited; nothing polls. The controller keeps a ledger of sample ids: produced (answered by env
workers) and consumed (named by the actor), reported in the summary (``samples_produced``,
``samples_consumed``, ``samples_duplicated``, ``samples_unconsumed``, ``samples_lost``).

Recovery (:mod:`~relax_gym.trainer.async_engine.recovery`; docs/architecture.md, "Recovery"). Level 1: Serve health-checks and
replaces a failed replica in place; the controller re-sends the calls it lost (a group to the env workers, a
streaming call to the advantages / reference role after giving the dead call's bus leases of that partition back),
an inference replica fetches the current weights through the actor before serving, env workers resend engine
calls. Level 2: when the actor (or PPO's critic: training state too) dies, or a role is replaced more than
``roles.restart_budget`` times, the whole topology is torn down and started again from the last checkpoint
(weights, optimizer, random states, data cursor, the sample ledger; metrics.jsonl rewound to it);
``relax-gym train --resume RUN_DIR`` does the same by hand.
Faults (``faults:``) are fired when a step's rollout starts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax_gym.trainer.async_engine.carry import CarryFeeder, claim_slot
from relax_gym.trainer.async_engine.deploy import RoleSpec, Topology, ensure_ray, plan_roles, start_serve
from relax_gym.trainer.async_engine.launches import LaunchedStep, Launches
from relax_gym.trainer.async_engine.ledger import SampleLedger
from relax_gym.trainer.rewards.judge_host import resolve_judge
from relax_gym.trainer.run.base_model import resolve_base
from relax_gym.trainer.run.env_version import resolve_env_id
from relax_gym.trainer.run.checkpoint import CRITIC_DIR, REFERENCE_DIR, CheckpointError, ResumePoint, resume_point
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.dcs.push import weight_transport
from relax_gym.trainer.faults.schedule import FaultSchedule
from relax_gym.trainer.run.driver import RunDriver
from relax_gym.trainer.run.seeds import eval_seeds, prompt_seed
from relax_gym.trainer.run.step_row import episodes_masked, eval_row, rollout_row
from relax_gym.trainer.policy.config import routing_dims
from relax_gym.trainer.async_engine.recovery import GlobalRestart, RecoveryError, is_replica_failure, kill_rank, kill_replica
from relax_gym.trainer.rollout.samples import masked_row, masked_summary, sample_id
from relax_gym.trainer.async_engine.staleness import StalenessGate
from relax_gym.trainer.dcs.service import start_coordinator

__all__ = ["AsyncTrainer", "RoleSpec", "ensure_ray", "plan_roles"]

log = logging.getLogger(__name__)

CRITIC_INIT_DIR = "critic-init"  # ppo without a reference policy: the warmed-up policy the critic starts from
GROUP_ATTEMPTS = 3  # a group whose env worker fails is re-sent (to any replica) this many times in all
EVAL_CHUNK = 8  # eval episodes per env-worker call


@dataclass
class _Pace:
    """The training loop's clock readings: when it started, when the last step ended, each step's data wait."""

    start: float
    previous: float
    steps_done: int
    waits: list[tuple[float, float]] = field(default_factory=list)  # (actor's data wait, step's wall time)


class AsyncTrainer:
    """The async-mode counterpart of :class:`~relax_gym.trainer.colocate.ColocateTrainer` (same constructor, same
    ``run`` / ``close``, same run-directory layout). Deployment: :mod:`~relax_gym.trainer.async_engine.deploy`; the
    sample ledger: :mod:`~relax_gym.trainer.async_engine.ledger`; what both modes share: :mod:`relax_gym.trainer.run`."""

    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, progress=None, resume: bool = False,
                 clock: Callable[[], float] = time.perf_counter, gate: Callable[..., StalenessGate] = StalenessGate,
                 topology: Any = None) -> None:
        """``resume``: continue ``run_dir`` from its latest checkpoint (``relax-gym train --resume``). ``clock``
        (the run's, its steps' and its rollouts' timings), ``gate`` (makes the staleness gate: ``gate(S, trained=)``)
        and ``topology`` (what :class:`~relax_gym.trainer.async_engine.deploy.Topology` gives) are the planner's
        to replace: it drives this controller on a virtual clock over simulated roles (trainer/plan/real_drive.py)."""
        if cfg.trainer.mode != "async":
            raise ValueError(f"AsyncTrainer needs trainer.mode=async (got {cfg.trainer.mode!r}); use ColocateTrainer")
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resume: ResumePoint | None = resume_point(self.run_dir, cfg.trainer) if resume else None  # rewinds metrics
        cfg = resolve_base(cfg, self.run_dir, progress)  # model.base: the checkpoint the run starts from
        cfg = resolve_env_id(cfg)  # env.id: the exact (versioned) id of the env that runs
        if cfg.judge is not None:  # a named judge is built here once; the genrm replicas load its checkpoint
            cfg = cfg.model_copy(update={"judge": resolve_judge(cfg.judge)})
        self.cfg = cfg
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        self.progress = progress or (lambda event, data: None)
        self.clock, self._make_gate = clock, gate
        # the metrics file, schedule, lr gate and step tail both modes share (run/driver.py)
        self.driver = RunDriver(cfg, self.run_dir, mode=self, progress=self.progress, clock=clock,
                                purge_step=self.resume.step + 1 if self.resume else None)
        self.faults = FaultSchedule(cfg.faults, self.run_dir)
        self.topology = topology if topology is not None else Topology(cfg, str(self.run_dir))
        self.ledger = SampleLedger(cfg.trainer)
        self.level1: Counter[str] = Counter()  # replicas replaced in topologies already torn down, by role
        self.level2 = 0  # global restarts
        self.restarted_from: list[int] = []  # the checkpoint step each global restart resumed from
        self._side_tasks: list[asyncio.Task] = []  # fault injections in flight
        self._failure: asyncio.Future | None = None  # the first failure of a background task (see _spawn)
        self.version = 0
        self.base_version = 0
        self.reference_path: str | None = None
        self.feeder: CarryFeeder | None = None
        self._restore_ledger()
        self._started_ray = False
        self._closed = False

    # the running topology, as the drive uses it
    handles = property(lambda self: self.topology.handles)
    bus = property(lambda self: self.topology.bus)
    supervisor = property(lambda self: self.topology.supervisor)
    prefix = property(lambda self: self.topology.prefix)

    def _start(self) -> None:
        start_serve()
        coordinator = start_coordinator(f"{self.topology.prefix}-dcs", transport=weight_transport(self.cfg.inference))
        resume_from = str(self.resume.path) if self.resume is not None and self.resume.path is not None else None
        self.topology.start(coordinator, resume_from=resume_from, first_step=self.resume.step if self.resume is not None else 0)

    # -- the run -------------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._started_ray = ensure_ray(self.cfg)  # in the main thread: Ray installs its signal handlers there
        return asyncio.run(self._run())

    async def _run(self) -> dict[str, Any]:
        try:
            while True:
                try:
                    await asyncio.to_thread(self._start)
                    return await self._supervised(self._loop())
                except GlobalRestart as exc:
                    await self._global_restart(exc)
        finally:
            await self.topology.close_bus()

    async def _loop(self) -> dict[str, Any]:
        """The run: set-up, then the launcher runs rollouts ahead (as far as the staleness gate allows) while this
        loop trains each step and hands its row to the tail the driver shares with colocate mode."""
        first = await self._prepare()
        gate, launches = self._make_gate(self.cfg.trainer.max_staleness, trained=first), Launches()
        launcher, feeder = self._start_launching(gate, launches, first)
        pace = _Pace(start=self.clock(), previous=self.clock(), steps_done=first)
        try:
            for k in range(first, self.cfg.trainer.steps):
                row, episodes = await self._step(await launches.take(k), gate, pace)
                pace.steps_done = k + 1
                if await self.driver.after_step(k + 1, row, episodes):
                    break
        finally:
            await self._stop_launching(gate, launcher, feeder, launches)
        return await self._finish(first, pace)

    async def _prepare(self) -> int:
        """Before the first step: the run's clock, the actor's warm-up, the reference policy (KL), the critic (PPO),
        the first eval; the first step to train (counted from 0)."""
        resumed = self.resume.state if self.resume is not None else None  # None: from the start (warm-up, eval)
        self.driver.start(float(resumed.extra.get("elapsed_s", resumed.elapsed_s)) if resumed is not None else 0.0)
        actor = self.handles["actor"]
        warm = await self._actor(lambda: actor.warmup.remote(), "the warm-up")
        for i, row in enumerate(warm["rows"]):
            self.driver.warmup_row(i, row)
        self.version = self.base_version = int(warm["version"])
        self.reference_path = None
        if "reference" in self.handles:
            ref = self.run_dir / REFERENCE_DIR
            if resumed is None:
                self.reference_path = await self._actor(lambda: actor.save_reference.remote(str(ref)), "saving the reference")
            elif not (ref / "config.json").is_file():
                raise CheckpointError(f"{ref}: the run's reference policy is missing; it cannot resume with kl_coef > 0")
            else:
                self.reference_path = str(ref)
        if "critic" in self.handles:  # ppo: the value model starts from the warmed-up policy, or the checkpoint's critic
            await self._start_critic(resumed is None, first=resumed.step if resumed is not None else 0)
        await self.driver.open(resumed=resumed is not None)
        return resumed.step if resumed is not None else 0

    def _start_launching(self, gate: StalenessGate, launches: Launches, first: int) -> tuple[asyncio.Task, asyncio.Task | None]:
        """The launcher's task and, with straggler carry, the feeder's (which keeps groups running)."""
        t, ledger = self.cfg.trainer, self.ledger
        if t.stragglers == "carry":
            self.feeder = CarryFeeder(gate, groups_per_step=t.prompts_per_step, max_in_flight=self._groups_in_flight(),
                                      first=first, end=t.steps, cursor=max(ledger.carry_cursor, first * t.prompts_per_step),
                                      run_group=self._carried_group, seal=lambda j: self.bus.seal(j, self._rows_per_step()),
                                      placed=ledger.placed, discarded=ledger.discarded, spawn=self._spawn, clock=self.clock)
        feeder = self._spawn(self.feeder.run()) if self.feeder is not None else None
        return self._spawn(self._launch(gate, launches, first)), feeder

    async def _stop_launching(self, gate: StalenessGate, launcher: asyncio.Task, feeder: asyncio.Task | None,
                              launches: Launches) -> None:
        """The run stopped (its last step, the time budget, a failure): stop launching, abandon what is in flight."""
        await gate.close()
        launcher.cancel()
        for task in self._side_tasks + ([feeder] if feeder is not None else []):
            task.cancel()
        await asyncio.gather(launcher, *self._side_tasks, *([feeder] if feeder is not None else []), return_exceptions=True)
        if self.feeder is not None:
            await self.feeder.stop()
        await self._abandon(launches)

    async def _step(self, launched: LaunchedStep, gate: StalenessGate, pace: _Pace) -> tuple[dict[str, Any], int]:
        """Train step k (the actor streams its partition; the critic beside it under PPO), let the gate advance,
        collect the step's rollout and streams; its metrics row (before the driver's eval) and its episode count."""
        k = launched.step
        res = await self._train(k)
        self.version = int(res["version"])
        await gate.advance(k + 1)
        if self.feeder is not None:
            self.feeder.poke()
        roll = await launched.rollout_answer()
        stream_answers = await launched.stream_answers()
        await self.bus.drop_partition(k)
        now = self.clock()
        row = self._step_row(res, roll, stream_answers[0], step_s=now - pace.previous,
                             elapsed=now - self.driver.schedule.start_time)
        pace.previous = now
        pace.waits.append((row["data_wait_s"], row["time_step_s"]))
        return row, len(roll["episodes"])

    async def _train(self, k: int) -> dict[str, Any]:
        """The actor's ``train_step`` on partition k (and PPO's critic update beside it): the actor's answer, the
        critic's metrics merged into its ``metrics``."""
        t, actor = self.cfg.trainer, self.handles["actor"]
        res, critic_metrics = await _together(self._actor(lambda: actor.train_step.remote(
            k, self._rows_per_step(), t.group_size, max_staleness=t.max_staleness,
            with_reference="reference" in self.handles, lr_decay_from=self.driver.lr_gate.decay_from), f"step {k + 1}"),
            self._critic_step(k))
        res["metrics"].update(critic_metrics)
        return res

    async def _finish(self, first: int, pace: _Pace) -> dict[str, Any]:
        """The summary: the driver's, with this mode's throughput, data wait, sample ledger and recovery figures."""
        t, ledger, steps_done = self.cfg.trainer, self.ledger, pace.steps_done
        loop_s = self.clock() - pace.start
        return self.driver.finish(steps_done, {
            "mode": "async", "max_staleness": t.max_staleness,
            "steps_per_hour": 3600.0 * (steps_done - first) / loop_s if loop_s > 0 else 0.0,
            "data_wait_fraction": _share(pace.waits),  # actor waiting for data / wall time of its steps
            "data_wait_fraction_steady": _share(pace.waits[t.max_staleness + 1 :]),  # once the pipeline is full
            **ledger.figures(), "policy_version": self.version,
            "stragglers": t.stragglers, "samples_discarded_stale": len(ledger.discarded),
            **await self._recovery_figures(steps_done),
        })

    def _rows_per_step(self) -> int:
        return self.cfg.trainer.prompts_per_step * self.cfg.trainer.group_size

    async def _launch(self, gate: StalenessGate, launches: Launches, first: int = 0) -> None:
        """Start each step's rollout (and its streaming consumers) as soon as the staleness gate allows, then fire
        the faults due at that step."""
        t = self.cfg.trainer
        for k in range(first, t.steps):
            await gate.wait_for(k)
            await self.bus.open_partition(k, expected_rows=self._rows_per_step(), group_size=t.group_size)
            rollout = self._spawn(self.feeder.rollout(k) if self.feeder is not None else self._rollout(k))
            launches.publish(LaunchedStep(k, rollout, [self._spawn(c) for c in self._stream_calls(k)]))
            if self.faults.section.inject:
                self._side_tasks.append(self._spawn(self._inject(k)))

    def _stream_calls(self, k: int) -> list[Any]:
        """Step k's streaming calls: the advantages role, the reference role (KL), the critic's values (PPO: the
        advantages role's GAE waits for them)."""
        n, g = self._rows_per_step(), self.cfg.trainer.group_size
        calls = [self._stream("advantages", k, self._role_call("advantages", "process", k, n, g))]
        if "reference" in self.handles:
            calls.append(self._stream("reference", k, self._role_call("reference", "process", k, n, self.reference_path)))
        if "critic" in self.handles:
            calls.append(self._stream("critic", k, self._role_call("critic", "values", k, n)))
        return calls

    def _role_call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        """A role's call as the supervisor sends (and re-sends) it: the handle is looked up at each try."""
        return lambda: getattr(self.handles[role], method).remote(*args, **kwargs)

    async def _rollout(self, k: int) -> dict[str, Any]:
        t = self.cfg.trainer
        t0 = self.clock()
        groups = await asyncio.gather(*(self._group(k, p, prompt_seed(t.seed, k + 1, p)) for p in range(t.prompts_per_step)))
        await self.bus.seal(k, self._rows_per_step())
        episodes = [e for g in groups for e in g]
        self.ledger.produced.extend(e["sample_id"] for e in episodes)
        return {"episodes": episodes, "time_rollout_s": self.clock() - t0}

    def _groups_in_flight(self) -> int:
        """Carry: groups kept running — colocate's per-step budget of episodes (``trainer.concurrency``, at most a
        step's worth), refilled as groups end. Not S + 1 steps' worth: every running group competes for the same
        engine, and a deeper queue makes each group slower, so more of them end too stale (docs/benchmarks.md)."""
        t = self.cfg.trainer
        return max(1, min(t.concurrency, self._rows_per_step()) // t.group_size)

    async def _carried_group(self, i: int, born: int) -> list[dict[str, Any]]:
        """Launch number i of a carry run: the colocate trainer's prompt order (step i // P + 1, prompt i % P), its
        sample ids; the group claims its partition when it ends."""
        t = self.cfg.trainer
        launch_step, prompt = divmod(i, t.prompts_per_step)
        seed = prompt_seed(t.seed, launch_step + 1, prompt)
        sids = [sample_id(launch_step + 1, prompt, m) for m in range(t.group_size)]
        answers = await self._group(None, i, seed, sids=sids, born=born)
        if answers and answers[0]["partition"] is not None:
            self.ledger.produced.extend(sids)
        return answers

    async def _group(self, k: int | None, group: int, seed: int, *, sids: list[str] | None = None,
                     born: int | None = None) -> list[dict[str, Any]]:
        """One group on the env workers (re-sent on failure), its rows on partition k — or, for a carried group
        (k None), on the partition it claims when it ends."""
        t = self.cfg.trainer
        sids = sids or [sample_id(k + 1, group, m) for m in range(t.group_size)]
        what = f"step {k + 1} group {group}" if k is not None else f"group {sids[0][:-3]}"
        error: Exception | None = None
        for attempt in range(GROUP_ATTEMPTS):
            try:  # a replica dying under the call: the supervisor re-sends it once Serve has replaced the replica
                return await self.supervisor.call("env_worker", lambda: self.handles["env_worker"].run_group.remote(
                    k, group, [seed] * t.group_size, sids, born=born), what)
            except GlobalRestart:
                raise
            except Exception as exc:  # noqa: BLE001 - the call itself failed: try again, then mask the group
                error = exc
                log.warning("%s: env worker call failed (attempt %d of %d): %s", what, attempt + 1, GROUP_ATTEMPTS, exc)
        routing = routing_dims(self.cfg.model)
        if k is None:  # carried: the masked rows take the slot the group would have claimed
            k = await claim_slot(self.topology.slots, sids[0], born)
        if k is not None:
            await self.bus.put(k, [masked_row(sid, group, seed, routing) for sid in sids])  # the step completes without them
            self.ledger.given_up.extend(sids)
        return [masked_summary(sid, group, f"{type(error).__name__}: {error}", k) for sid in sids]

    async def _abandon(self, launches: Launches) -> None:
        """A stopped run (time budget, failure): cancel the steps still in flight and drop their partitions (their
        samples were produced for steps that will not be trained; the summary counts them as unconsumed)."""
        for launched in launches.unfinished():
            k, tasks = launched.step, launched.pending()
            launched.rollout, launched.streams = None, []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self.bus.drop_partition(k)
            except Exception:  # noqa: BLE001 - best effort while stopping
                log.debug("dropping partition %d failed", k, exc_info=True)

    def _step_row(self, res: dict[str, Any], roll: dict[str, Any], adv: dict[str, int], *, step_s: float,
                  elapsed: float) -> dict[str, Any]:
        """The colocate trainer's row (:mod:`~relax_gym.trainer.run.step_row`) plus what only this mode has:
        versions, staleness, data wait, partial groups."""
        episodes = roll["episodes"]
        self.ledger.consumed.extend(res["sample_ids"])
        masked = episodes_masked(episodes)
        row: dict[str, Any] = {"episodes_masked": masked}
        if masked < len(episodes):
            row["zero_adv_group_share"] = adv["zero_adv_groups"] / max(adv["valid_groups"], 1)
            row["episodes_trained"] = res["episodes_trained"]
        row.update(res["metrics"])
        row.update({
            **rollout_row(episodes, roll["time_rollout_s"], self.driver.components.observe(episodes)),
            "policy_version": res["version"], "trained_version": res["trained_version"],
            "rollout_version_min": res["rollout_version_min"], "rollout_version_max": res["rollout_version_max"],
            "staleness_avg": res["staleness_avg"], "staleness_max": res["staleness_max"],
            "data_wait_s": res["data_wait_s"], "data_wait_fraction": res["data_wait_s"] / step_s if step_s > 0 else 0.0,
            "partial_groups": res["partial_groups"], "samples_consumed": len(res["sample_ids"]),
            "time_rollout_s": roll["time_rollout_s"], "time_train_s": res["time_train_s"], "time_sync_s": res["time_sync_s"],
            "time_step_s": step_s, "elapsed_s": elapsed,
        })
        return row

    async def evaluate(self, step: int) -> dict[str, float]:
        """The colocate trainer's eval: greedy episodes on the eval split (:func:`~relax_gym.trainer.run.seeds.eval_seeds`);
        ``step``: the metrics step it belongs to (its rollout records go to that step's file)."""
        seeds = eval_seeds(self.cfg.trainer.eval_episodes)
        chunks = [seeds[i : i + EVAL_CHUNK] for i in range(0, len(seeds), EVAL_CHUNK)]
        answers = await asyncio.gather(*(self.supervisor.call("env_worker", self._role_call(
            "env_worker", "evaluate", c, step=step, first_index=i * EVAL_CHUNK), "eval") for i, c in enumerate(chunks)))
        episodes = [e for a in answers for e in a]
        return {**eval_row(episodes, self.driver.components.observe(episodes)), "eval_policy_version": self.version}

    # -- recovery ------------------------------------------------------------------------------------------------

    async def _supervised(self, main: Any) -> dict[str, Any]:
        """Run the training loop until it returns, a background task fails, or the supervisor's watch asks for a
        global restart; the loop is cancelled (its steps in flight abandoned) in the last two cases."""
        self._failure = asyncio.get_running_loop().create_future()
        loop_task = asyncio.ensure_future(main)
        assert self.supervisor is not None
        watch = asyncio.ensure_future(self.supervisor.watch())
        try:
            done, _ = await asyncio.wait({loop_task, watch, self._failure}, return_when=asyncio.FIRST_COMPLETED)
            if loop_task in done:
                return loop_task.result()
            loop_task.cancel()
            await asyncio.gather(loop_task, return_exceptions=True)
            for stopped in (self._failure, watch):
                if stopped in done:
                    stopped.result()  # raises what stopped the run
            raise RuntimeError("the supervised loop stopped without a cause")  # pragma: no cover
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    def _spawn(self, coro: Any) -> asyncio.Task:
        """A background task of the loop (a rollout, a streaming call, a fault) whose failure stops the run at once
        instead of leaving the actor waiting for data that will not come."""
        task = asyncio.ensure_future(coro)

        def report(done: asyncio.Task) -> None:
            if not done.cancelled() and done.exception() is not None and self._failure is not None and not self._failure.done():
                self._failure.set_exception(done.exception())

        task.add_done_callback(report)
        return task

    async def _actor(self, call: Any, what: str) -> Any:
        """A call to the actor; its replica dying means a global restart (its training state is gone)."""
        assert self.supervisor is not None
        return await self.supervisor.call("actor", call, what)

    async def _stream(self, role: str, k: int, call: Any) -> Any:
        """A streaming role's call for partition k. If its replica dies, the rows it had fetched and not acked are
        given back (its bus task is the role's name) and the call is sent again once Serve has replaced it: rows
        the dead call finished stay done, the others are processed once."""
        assert self.supervisor is not None

        async def once() -> Any:
            try:
                return await call()
            except Exception as exc:
                if is_replica_failure(exc) and self.bus is not None:
                    freed = await self.bus.release_task(role, k)
                    log.warning("step %d: a %s replica died; %d leased row(s) given back", k + 1, role, freed)
                raise

        return await self.supervisor.call(role, once, f"step {k + 1} {role}")

    async def _inject(self, k: int) -> None:
        """Fire the faults due when step k + 1 starts (``faults:``)."""
        for fault in self.faults.due(k + 1):
            spec = fault.spec
            if spec.kind == "kill":
                if spec.delay_s:
                    await asyncio.sleep(spec.delay_s)
                self.faults.record(fault, topology=self.prefix)  # first: a replayed step must not fire it again
                rng = random.Random(f"{self.cfg.faults.seed}:{k + 1}:{spec.role}")
                if spec.rank is not None:  # one rank of the actor's group (deploy names it <prefix>-actor)
                    name = await asyncio.to_thread(kill_rank, f"{self.prefix}-actor", spec.rank)
                else:
                    name = await asyncio.to_thread(kill_replica, f"{self.prefix}-{spec.role}", spec.role, rng)
                log.warning("fault injection: killed %s at step %d", name, k + 1)
            else:
                role = "inference" if spec.kind == "engine_error" else "env_worker"
                await self.handles[role].arm_fault.remote(spec.kind, spec.count)
                self.faults.record(fault, topology=self.prefix)

    async def save_checkpoint(self, step: int) -> str | None:
        """The actor writes the checkpoint; the controller adds its sample ledger, the bus cursor and its clock.
        Rows of partitions after ``step`` are not saved: a resumed run regenerates them from their seeds, under
        the same sample ids. The error of a write that failed (the driver records it), else None."""
        extra = {**self.ledger.checkpoint_extra(step, self.feeder.cursor if self.feeder is not None else None),
                 **self.driver.trainer_extra(), "elapsed_s": self.driver.schedule.elapsed()}
        actor = self.handles["actor"]
        parts = {}
        if "critic" in self.handles:  # staged by the critic role, moved into the checkpoint by the actor's save
            critic = self.handles["critic"]
            parts[CRITIC_DIR] = await self.supervisor.call("critic", lambda: critic.save.remote(step, str(self.run_dir)),
                                                           f"critic checkpoint {step}")
        written = await self._actor(lambda: actor.checkpoint.remote(step, str(self.run_dir), extra, parts),
                                    f"checkpoint {step}")
        return written["error"]

    async def _start_critic(self, fresh: bool, first: int) -> None:
        """Build the critic role's value model: from the warmed-up policy (``fresh``: saved by the actor, or the
        reference policy, which is the same weights) or from the checkpoint the run resumes from."""
        init = None
        if fresh:
            init = self.reference_path or await self._actor(
                lambda: self.handles["actor"].save_reference.remote(str(self.run_dir / CRITIC_INIT_DIR)),
                "saving the critic's starting policy")
        critic = self.handles["critic"]
        await self.supervisor.call("critic", lambda: critic.start.remote(init, first), "starting the critic")

    async def _critic_step(self, k: int) -> dict[str, float]:
        """PPO: the critic's update on partition k (its metrics for the step's row); nothing without a critic."""
        if "critic" not in self.handles:
            return {}
        critic = self.handles["critic"]
        return await self.supervisor.call("critic", lambda: critic.train.remote(k, self._rows_per_step()),
                                          f"step {k + 1} critic")

    def _restore_ledger(self) -> None:
        """The sample ledger and the lr gate as the checkpoint being resumed saved them (empty when starting over)."""
        state = self.resume.state if self.resume is not None else None
        self.ledger.restore(state)
        self.driver.restore_lr_gate(state.extra.get("lr_gate") if state is not None else None)

    async def _global_restart(self, cause: GlobalRestart) -> None:
        """Level 2: tear the topology down and prepare to start it again from the latest checkpoint."""
        self.level2 += 1
        limit = self.cfg.roles.max_global_restarts
        if self.level2 > limit:
            raise RecoveryError(f"{cause}; the run already restarted {limit} time(s) (roles.max_global_restarts)") from cause
        log.warning("global restart %d (of at most %d): %s", self.level2, limit, cause)
        self.progress("restart", {"level": 2, "reason": str(cause)})
        self.level1.update(await self.topology.take_restarts())
        await self.topology.teardown()  # the next start uses a new prefix
        self._side_tasks = []
        self.driver.metrics.close()
        self.resume = resume_point(self.run_dir, self.cfg.trainer)  # rewinds metrics.jsonl to the checkpoint
        self.restarted_from.append(self.resume.step)
        self.driver.reopen_metrics(purge_step=self.resume.step + 1)
        self._restore_ledger()

    async def _recovery_figures(self, steps_done: int) -> dict[str, Any]:
        """Restarts by level, faults fired, and samples lost (:meth:`~relax_gym.trainer.async_engine.ledger.SampleLedger.lost`)."""
        level1 = Counter(self.level1)
        if self.supervisor is not None:
            level1.update(await self.supervisor.restarts())
        return {"restarts_level1": {r: n for r, n in sorted(level1.items()) if n}, "restarts_level2": self.level2,
                "restarted_from_steps": list(self.restarted_from), "faults_injected": self.faults.counts(),
                "samples_lost": self.ledger.lost(steps_done), "samples_regenerated": self.ledger.regenerated}

    # -- teardown ------------------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.driver.metrics.close()
        try:
            self.topology.close(shutdown_ray=self._started_ray)
        except Exception:  # noqa: BLE001 - never mask the run's own error
            log.warning("async engine teardown failed", exc_info=True)


async def _together(*calls: Any) -> list[Any]:
    """Await ``calls`` concurrently; if one fails, the others are cancelled before the error propagates."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _share(pairs: list[tuple[float, float]]) -> float:
    total = sum(step for _, step in pairs)
    return sum(wait for wait, _ in pairs) / total if total > 0 else 0.0
