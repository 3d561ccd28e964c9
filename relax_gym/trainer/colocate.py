"""The colocate training loop (synchronous baseline, ``trainer.mode: colocate``, S = 0), single process:

    [SFT warm-up on format demonstrations] → repeat: generate (engine over HTTP) → reward → advantages →
    train (micro-batches, grad accumulation, AdamW, grad clip) → push weights into the engine → [eval, checkpoint]

The embedded engine runs in this process behind its HTTP server on loopback; the rollout client speaks only
SGLang's protocol to it. Failed episodes are masked and counted in the metrics, never a crash of the step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actors.critic import Critic
from relax_gym.trainer.actors.factory import build_actor
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import (
    group_advantages,
    identical_reward_groups,
    zero_advantage_share,
)
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.dcs.names import checkpoint_names
from relax_gym.trainer.dcs.push import make_pusher
from relax_gym.trainer.engines.coalesce import CoalescingClient
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.faults.hooks import LocalFaults
from relax_gym.trainer.faults.schedule import FaultSchedule
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.policy.moe import routing_dims
from relax_gym.trainer.rewards.judge import judge_trajectory
from relax_gym.trainer.rewards.judge_host import LocalJudge, resolve_judge
from relax_gym.trainer.rollout.episode import Trajectory, run_episode
from relax_gym.trainer.rollout.media import share_media
from relax_gym.trainer.rollout.program_episode import ProgramEpisodes, is_agent_program
from relax_gym.trainer.rollout.samples import summary_dict
from relax_gym.trainer.run.base_model import resolve_base
from relax_gym.trainer.run.checkpoint import (
    CRITIC_DIR,
    CheckpointFailures,
    CheckpointWriteError,
    TrainerState,
    eval_history,
    load_checkpoint,
    part_stage,
    reference_model,
    restore_rng,
    resume_point,
    save_checkpoint,
    trainer_state,
)
from relax_gym.trainer.run.lr_schedule import (
    DecayGate,
    decayed_fraction,
    lr_at,
    progress,
)
from relax_gym.trainer.run.metrics import MetricsWriter
from relax_gym.trainer.run.ppo import colocate_ppo_step, start_critic
from relax_gym.trainer.run.rollout_records import RolloutRecorder
from relax_gym.trainer.run.schedule import Schedule
from relax_gym.trainer.run.seeds import eval_seeds, seed_everything, train_seeds
from relax_gym.trainer.run.step_row import (
    RewardComponents,
    episodes_masked,
    eval_row,
    rollout_row,
    summary_end,
    summary_start,
    warn_on_tool_crashes,
)
from relax_gym.trainer.run.warmup import report_warmup_row, run_warmup

log = logging.getLogger(__name__)


class ColocateTrainer:
    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, progress=None, resume: bool = False) -> None:
        """``resume``: continue ``run_dir`` from its latest checkpoint (``relax-gym train --resume``)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resume = resume_point(self.run_dir, cfg.trainer) if resume else None  # rewinds metrics.jsonl
        cfg = resolve_base(cfg, self.run_dir, progress)  # model.base: the checkpoint the run starts from
        self.cfg = cfg
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        self.progress = progress or (lambda event, data: None)
        self.checkpoint_failures = CheckpointFailures()
        seed_everything(cfg.trainer.seed)
        self.model, self.processor = build_policy(cfg.model)
        self.model.train()
        self.actor = build_actor(cfg, self.model, self.processor)  # actor.backend (megatron converts self.model)
        self.routing = routing_dims(cfg.model)  # MoE: training episodes record their routed experts
        # inference.engine: the embedded engine on a copy of the policy, or a launched SGLang server
        self.engine_host = start_engine(cfg.inference, cfg.model, log_dir=self.run_dir,
                                        build=lambda: (self.actor.hf_model(), self.processor))
        # every push goes through the DCS's one interface: in-process tensors for the embedded engine, NCCL/disk for SGLang
        self.pusher = make_pusher(cfg.inference, names=checkpoint_names(self.actor.hf_template),
                                  engine=getattr(self.engine_host, "engine", None), urls=[self.engine_host.url])
        self.client: CoalescingClient | None = None  # rollouts, made inside the running event loop
        # judge: (an env's judge rubric parts) the judge model's engine in this process, frozen
        self.judge = LocalJudge(resolve_judge(cfg.judge), log_dir=self.run_dir) if cfg.judge is not None else None
        # agent-program envs: their programs call an OpenAI gateway over self.client (made inside the loop too)
        self.programs = ProgramEpisodes(self.processor, max_positions=getattr(getattr(self.engine_host, "engine", None),
                                                                               "max_positions", None))
        self.ref_actor: HFActor | None = None  # frozen copy of the warmed-up policy, for the KL term
        self.critic: Critic | None = None  # algorithm.name=ppo: the value model (built when RL starts)
        self.metrics = MetricsWriter(self.run_dir, tensorboard=cfg.metrics.tensorboard,
                                     purge_step=self.resume.step + 1 if self.resume else None)
        self.records = RolloutRecorder(self.run_dir, per_step=cfg.metrics.rollouts_per_step,  # for relax-gym view
                                       media_mb=cfg.metrics.rollout_media_mb)
        self.version = 0
        self.rng = np.random.default_rng(cfg.trainer.seed)
        self.lr_gate = DecayGate(cfg.actor.lr_hold_until_reward, cfg.actor.lr_hold_window)  # when the lr decay starts
        self.schedule = Schedule(cfg.trainer)  # eval / checkpoint / stop after each step, and the run's clock
        self.components = RewardComponents()  # the reward components seen in the run: every row keeps them
        self.faults = LocalFaults(FaultSchedule(cfg.faults, self.run_dir), getattr(self.engine_host, "engine", None))
        self.resumed: TrainerState | None = None
        if self.resume is not None and self.resume.path is not None:
            self.resumed = load_checkpoint(self.resume.path, self.actor)
            self.version = self.resumed.version
            self.pusher.push(self.actor.state_dict(), self.version)

    # -- environment pools ----------------------------------------------------------------------------------

    def _envs(self, n: int, kwargs: dict[str, Any]) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        for _ in range(n):
            queue.put_nowait(relax_gym.make(self.cfg.env.id, **kwargs))
        return queue

    @staticmethod
    def _prefetch(envs: asyncio.Queue, seeds: list[tuple[int, int]]) -> None:
        """Start decoding the media of ``seeds``' prompts in the background (envs that offer ``prefetch``: the
        multiple-choice family), so that those resets find their clips in the decode cache. Called with the next
        step's seeds while this step trains; one prompt per group is enough (a group shares its prompt)."""
        try:
            env = envs.get_nowait()  # any idle env of the pool (they share the decode cache), borrowed and put back
        except asyncio.QueueEmpty:
            return
        try:
            prefetch = getattr(env.unwrapped, "prefetch", None)
            if prefetch is not None:
                prefetch(sorted({seed for seed, _ in seeds}))
        finally:
            envs.put_nowait(env)

    async def _episodes(self, envs: asyncio.Queue, seeds: list[tuple[int, int]], sampling: dict[str, Any],
                        routing: tuple[int, int] | None = None) -> list[Trajectory]:
        async def one(seed: int, group: int) -> Trajectory:
            env = await envs.get()
            try:
                if is_agent_program(env):
                    return await self.programs.run(env, self.client, seed=seed, group_id=group, sampling_params=sampling)
                traj = await run_episode(env, self.client, self.processor, seed=seed, group_id=group,
                                         sampling_params=sampling, max_turns=self.cfg.trainer.max_turns, routing=routing)
            finally:
                envs.put_nowait(env)
            # judged as soon as it ends, while the step's other episodes still generate
            return await judge_trajectory(traj, self.judge.judge() if self.judge is not None else None)

        return await asyncio.gather(*(one(s, g) for s, g in seeds))

    def _sampling(self, *, greedy: bool = False) -> dict[str, Any]:
        inf = self.cfg.inference
        return {"max_new_tokens": inf.max_new_tokens, "temperature": 0.0 if greedy else inf.temperature, "top_p": 1.0 if greedy else inf.top_p}

    # -- phases -------------------------------------------------------------------------------------------

    def sft_warmup(self, env) -> None:
        t = self.cfg.trainer
        if t.sft_warmup_steps == 0:
            return
        run_warmup(self.actor, env, self.processor, self.rng, t, lr=self.cfg.actor.lr,
                   on_row=lambda i, row: report_warmup_row(self.metrics, self.progress, t, i, row))
        self._sync_weights()

    def _sync_weights(self) -> None:
        self.version += 1
        self.pusher.push(self.actor.state_dict(), self.version)

    async def evaluate(self, envs: asyncio.Queue, step: int = 0) -> dict[str, float]:
        n = self.cfg.trainer.eval_episodes
        trajs = await self._episodes(envs, [(s, i) for i, s in enumerate(eval_seeds(n))], self._sampling(greedy=True))
        await asyncio.to_thread(self.records.write, step, "eval", trajs)
        episodes = [summary_dict(t) for t in trajs]
        return {**eval_row(episodes, self.components.observe(episodes)), "eval_policy_version": self.version}

    def rl_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        cfg = self.cfg
        valid = [t for t in trajs if t.trainable]
        metrics: dict[str, float] = {}
        if not valid:
            return metrics
        rewards = torch.tensor([t.reward for t in valid], dtype=torch.float32)
        groups = torch.tensor([t.group_id for t in valid], dtype=torch.long)
        adv = group_advantages(rewards, groups, scale=cfg.algorithm.advantage_scale,
                               negative_scale=cfg.algorithm.negative_advantage_scale)
        metrics["zero_adv_group_share"] = zero_advantage_share(rewards, groups)
        keep = torch.ones(len(valid), dtype=torch.bool)
        if cfg.algorithm.dynamic_sampling:
            keep = ~identical_reward_groups(rewards, groups)
        items = [t for t, k in zip(valid, keep.tolist()) if k]
        metrics["episodes_trained"] = len(items)
        if not items:
            return metrics
        ref = None
        if self.ref_actor is not None:
            ref = self.ref_actor.logprobs(items, cfg.algorithm.temperature)
        if self.critic is not None:  # ppo: per-token GAE advantages from the critic's values, then the critic's step
            metrics.update(colocate_ppo_step(self.actor, self.critic, items, cfg.algorithm, ref_logprobs=ref,
                                             epochs=cfg.actor.epochs_per_step))
        else:
            metrics.update(self.actor.rl_step(items, adv[keep], cfg.algorithm, ref_logprobs=ref, epochs=cfg.actor.epochs_per_step))
        return metrics

    # -- the loop -----------------------------------------------------------------------------------------

    def run(self) -> dict[str, float]:
        return asyncio.run(self._run())

    async def _run(self) -> dict[str, float]:
        raw = self.engine_host.async_client()
        # the episodes of a step call at once: one batch request instead of hundreds of single ones
        self.client = CoalescingClient(raw, max_batch=self.cfg.inference.max_batch)
        try:
            return await self._loop()
        finally:
            self.programs.close()
            await raw.aclose()
            if self.judge is not None:
                await self.judge.aclose()

    async def _loop(self) -> dict[str, float]:
        cfg, t = self.cfg, self.cfg.trainer
        resumed = self.resumed
        start = self.schedule.start(resumed.elapsed_s if resumed is not None else 0.0)
        if resumed is None:
            demo_env = relax_gym.make(cfg.env.id, **cfg.env.kwargs)
            await asyncio.to_thread(self.sft_warmup, demo_env)
            demo_env.close()
        if cfg.algorithm.kl_coef > 0:
            ref_model = reference_model(self.run_dir, self.actor, self.processor, cfg.model, resumed=resumed is not None)
            self.ref_actor = HFActor(ref_model, self.processor, lr=1.0, micro_batch_size=cfg.actor.micro_batch_size)
        if cfg.algorithm.name == "ppo":  # from the warmed-up policy, or the checkpoint's critic
            self.critic = start_critic(cfg, self.actor, self.processor, self.resume.path if resumed is not None else None)
        train_envs = self._envs(min(t.concurrency, t.prompts_per_step * t.group_size), cfg.env.kwargs)
        eval_envs = self._envs(min(t.concurrency, t.eval_episodes), {**cfg.env.kwargs, **cfg.env.eval_kwargs})
        if resumed is None:
            last_eval = first_eval = await self.evaluate(eval_envs)
            self.metrics.write(0, {**last_eval, "policy_version": self.version})
            self.progress("eval", {"step": 0, **last_eval})
        else:  # continue where the checkpoint left off: its clock, its random states, its next step
            last_eval, first_eval = eval_history(self.run_dir)
            restore_rng(resumed.rng, self.rng)
        summary = summary_start(first_eval)
        step = resumed.step if resumed else 0
        a = cfg.actor
        if resumed:
            self.lr_gate = DecayGate.from_state(resumed.extra.get("lr_gate"), a.lr_hold_until_reward, a.lr_hold_window)
        for step in range(step + 1, t.steps + 1):
            self.faults.start_step(step)
            t0 = time.perf_counter()
            fraction = progress(step - 1, t.steps, t0 - start, t.time_budget_s)
            lr = lr_at(a.lr, a.lr_schedule, decayed_fraction(fraction, self.lr_gate.decay_from), a.min_lr_ratio)
            self.actor.set_lr(lr)
            seeds = train_seeds(t.seed, step, t.prompts_per_step, t.group_size)
            trajs = await self._episodes(train_envs, seeds, self._sampling(), self.routing)
            if t.dedupe_media:  # a group's samples hold one media tensor object, not a copy each
                share_media([x.mm for x in trajs])
            t1 = time.perf_counter()
            if step < t.steps:  # the next step's clips decode while this one trains
                self._prefetch(train_envs, train_seeds(t.seed, step + 1, t.prompts_per_step, t.group_size))
            m = await asyncio.to_thread(self.rl_step, trajs)
            t2 = time.perf_counter()
            await asyncio.to_thread(self._sync_weights)
            t3 = time.perf_counter()
            episodes = [summary_dict(x) for x in trajs]
            await asyncio.to_thread(self.records.write, step, "train", trajs, trained_version=self.version - 1)
            row = {
                "episodes_masked": episodes_masked(episodes), **m, **rollout_row(episodes, t1 - t0, self.components.observe(episodes)),
                "policy_version": self.version, "lr": lr,
                "time_rollout_s": t1 - t0, "time_train_s": t2 - t1, "time_sync_s": t3 - t2, "time_step_s": t3 - t0,
                "elapsed_s": self.schedule.elapsed(),
            }
            warn_on_tool_crashes(row, len(episodes), step)
            self.lr_gate.observe(row["reward_mean"], progress(step, t.steps, self.schedule.elapsed(), t.time_budget_s))
            plan = self.schedule.after(step)
            if plan.eval:
                last_eval = await self.evaluate(eval_envs, step)
                row.update(last_eval)
            self.metrics.write(step, row)
            self.progress("step", {"step": step, "of": t.steps, **row, "eval_reward": last_eval["eval_reward"]})
            if plan.checkpoint:
                try:
                    self.checkpoint(step)
                except CheckpointWriteError as exc:  # disk full: the previous checkpoint stays the resume point
                    self.checkpoint_failures.record(step, str(exc))
                    self.progress("checkpoint_failed", {"step": step, "error": str(exc)})
            if plan.stop:
                break
        summary.update({**summary_end(last_eval, first_eval), "steps": step, "elapsed_s": self.schedule.elapsed(),
                        **self.checkpoint_failures.figures()})
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        for queue in (train_envs, eval_envs):
            while not queue.empty():
                queue.get_nowait().close()
        return summary

    def checkpoint(self, step: int) -> Path:
        """``checkpoints/step_NNNNNN/``: the actor's model and optimizer (hf: save_pretrained; megatron:
        dist_checkpointing), the critic's folder under ppo, and the trainer state (:mod:`~relax_gym.trainer.run.checkpoint`)."""
        state = trainer_state(self.cfg.trainer, step=step, version=self.version, rng=self.rng,
                              elapsed_s=self.schedule.elapsed(), extra={"lr_gate": self.lr_gate.state()})
        parts = {CRITIC_DIR: self.critic.save(part_stage(self.run_dir, step, CRITIC_DIR))} if self.critic is not None else {}
        return save_checkpoint(self.run_dir, self.actor, state, parts=parts)

    def close(self) -> None:
        try:
            self.metrics.close()
        finally:
            try:
                self.actor.close()
            finally:
                try:
                    self.pusher.close()
                finally:
                    try:
                        self.engine_host.close()  # a launched SGLang server must go even if the others fail
                    finally:
                        try:
                            if self.judge is not None:
                                self.judge.close()
                        finally:  # the run's sandboxes: none of ours outlives the run in a process that goes on
                            from relax_gym.envs.episode_sandbox import close_shared_pools

                            close_shared_pools()
