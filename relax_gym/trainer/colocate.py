"""The colocate training loop (synchronous baseline, ``trainer.mode: colocate``, S = 0), single process:

    [SFT warm-up on format demonstrations] → repeat: generate (engine over HTTP) → reward → advantages →
    train (micro-batches, grad accumulation, AdamW, grad clip) → push weights into the engine → [eval, checkpoint]

The embedded engine runs in this process behind its HTTP server on loopback; the rollout client speaks only
SGLang's protocol to it. Failed episodes are masked and counted in the metrics, never a crash of the step.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

import relax_gym
from relax_gym.trainer.actors.critic import Critic
from relax_gym.trainer.actors.factory import build_actor
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.algorithms import identical_reward_groups, zero_advantage_share
from relax_gym.trainer.config import RelaxConfig
from relax_gym.trainer.dcs.names import checkpoint_names
from relax_gym.trainer.dcs.push import make_pusher
from relax_gym.trainer.engines.coalesce import CoalescingClient
from relax_gym.trainer.engines.factory import start_engine
from relax_gym.trainer.faults.hooks import LocalFaults
from relax_gym.trainer.faults.schedule import FaultSchedule
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.policy.config import routing_dims
from relax_gym.trainer.rewards.judge import judge_trajectory
from relax_gym.trainer.rewards.judge_host import LocalJudge, resolve_judge
from relax_gym.trainer.rollout.episode import Trajectory, run_episode
from relax_gym.trainer.rollout.media import share_media
from relax_gym.trainer.rollout.program_episode import ProgramEpisodes, is_agent_program
from relax_gym.trainer.rollout.samples import summary_dict
from relax_gym.trainer.run.base_model import resolve_base
from relax_gym.trainer.run.env_version import resolve_env_id
from relax_gym.trainer.run.checkpoint import (
    CRITIC_DIR,
    CheckpointWriteError,
    TrainerState,
    load_checkpoint,
    part_stage,
    reference_model,
    restore_rng,
    resume_point,
    save_checkpoint,
    trainer_state,
)
from relax_gym.trainer.run.driver import RunDriver
from relax_gym.trainer.run.ppo import colocate_update, start_critic
from relax_gym.trainer.run.rollout_records import RolloutRecorder
from relax_gym.trainer.run.seeds import eval_seeds, seed_everything, train_seeds
from relax_gym.trainer.run.step_row import episodes_masked, eval_row, rollout_row
from relax_gym.trainer.run.warmup import run_warmup

log = logging.getLogger(__name__)


class ColocateTrainer:
    def __init__(self, cfg: RelaxConfig, run_dir: Path, *, progress=None, resume: bool = False) -> None:
        """``resume``: continue ``run_dir`` from its latest checkpoint (``relax-gym train --resume``)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.resume = resume_point(self.run_dir, cfg.trainer) if resume else None  # rewinds metrics.jsonl
        cfg = resolve_base(cfg, self.run_dir, progress)  # model.base: the checkpoint the run starts from
        cfg = resolve_env_id(cfg)  # env.id: the exact (versioned) id of the env that runs
        self.cfg = cfg
        (self.run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
        self.progress = progress or (lambda event, data: None)
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
        self.records = RolloutRecorder(self.run_dir, per_step=cfg.metrics.rollouts_per_step,  # for relax-gym view
                                       media_mb=cfg.metrics.rollout_media_mb, env=cfg.env.id)
        self.version = 0
        self.rng = np.random.default_rng(cfg.trainer.seed)
        self.faults = LocalFaults(FaultSchedule(cfg.faults, self.run_dir), getattr(self.engine_host, "engine", None))
        self.resumed: TrainerState | None = None
        if self.resume is not None and self.resume.path is not None:
            self.resumed = load_checkpoint(self.resume.path, self.actor)
            self.version = self.resumed.version
            self.pusher.push(self.actor.state_dict(), self.version)
        # the metrics file, schedule, lr gate and step tail both modes share (run/driver.py)
        self.driver = RunDriver(cfg, self.run_dir, mode=self, progress=self.progress,
                                purge_step=self.resume.step + 1 if self.resume else None)
        self.driver.restore_lr_gate(self.resumed.extra.get("lr_gate") if self.resumed is not None else None)
        self.train_envs: asyncio.Queue | None = None
        self.eval_envs: asyncio.Queue | None = None

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
                   on_row=self.driver.warmup_row)
        self._sync_weights()

    def _sync_weights(self) -> None:
        self.version += 1
        self.pusher.push(self.actor.state_dict(), self.version)

    async def evaluate(self, step: int = 0) -> dict[str, float]:
        n = self.cfg.trainer.eval_episodes
        trajs = await self._episodes(self.eval_envs, [(s, i) for i, s in enumerate(eval_seeds(n))], self._sampling(greedy=True))
        await asyncio.to_thread(self.records.write, step, "eval", trajs)
        episodes = [summary_dict(t) for t in trajs]
        return {**eval_row(episodes, self.driver.components.observe(episodes)), "eval_policy_version": self.version}

    def rl_step(self, trajs: list[Trajectory]) -> dict[str, float]:
        cfg = self.cfg
        valid = [t for t in trajs if t.trainable]
        metrics: dict[str, float] = {}
        if not valid:
            return metrics
        rewards = torch.tensor([t.reward for t in valid], dtype=torch.float32)
        groups = torch.tensor([t.group_id for t in valid], dtype=torch.long)
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
        # the algorithm's registered estimator (ppo's gae takes the critic's values and trains the critic too)
        metrics.update(colocate_update(self.actor, self.critic, items, cfg.algorithm, ref_logprobs=ref,
                                       epochs=cfg.actor.epochs_per_step))
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
        """The run: set-up, then per step roll out, train, push, and the tail the driver shares with async mode."""
        driver, resumed, t = self.driver, self.resumed, self.cfg.trainer
        driver.start(resumed.elapsed_s if resumed is not None else 0.0)
        await self._prepare()
        await driver.open(resumed=resumed is not None)
        if resumed is not None:  # continue where the checkpoint left off: its random states, its next step
            restore_rng(resumed.rng, self.rng)
        step = resumed.step if resumed else 0
        for step in range(step + 1, t.steps + 1):
            row, episodes = await self._step(step)
            if await driver.after_step(step, row, episodes):
                break
        summary = driver.finish(step)
        self._close_envs()
        return summary

    async def _prepare(self) -> None:
        """Before the first step: the SFT warm-up (not when resuming), the frozen reference (KL), the critic (PPO),
        the env pools."""
        cfg, t, resumed = self.cfg, self.cfg.trainer, self.resumed
        if resumed is None:
            demo_env = relax_gym.make(cfg.env.id, **cfg.env.kwargs)
            await asyncio.to_thread(self.sft_warmup, demo_env)
            demo_env.close()
        if cfg.algorithm.kl_coef > 0:
            ref_model = reference_model(self.run_dir, self.actor, self.processor, cfg.model, resumed=resumed is not None)
            self.ref_actor = HFActor(ref_model, self.processor, lr=1.0, micro_batch_size=cfg.actor.micro_batch_size)
        if cfg.algorithm.needs_critic:  # ppo: from the warmed-up policy, or the checkpoint's critic
            self.critic = start_critic(cfg, self.actor, self.processor, self.resume.path if resumed is not None else None)
        self.train_envs = self._envs(min(t.concurrency, t.prompts_per_step * t.group_size), cfg.env.kwargs)
        self.eval_envs = self._envs(min(t.concurrency, t.eval_episodes), {**cfg.env.kwargs, **cfg.env.eval_kwargs})

    async def _step(self, step: int) -> tuple[dict[str, Any], int]:
        """One RL step: generate the step's groups, train on them, push the weights; its metrics row (before the
        driver's eval) and how many episodes it played."""
        t, clock = self.cfg.trainer, self.driver.schedule.clock
        self.faults.start_step(step)
        t0 = clock()
        lr = self.driver.learning_rate(step)
        self.actor.set_lr(lr)
        trajs = await self._episodes(self.train_envs, train_seeds(t.seed, step, t.prompts_per_step, t.group_size),
                                     self._sampling(), self.routing)
        if t.dedupe_media:  # a group's samples hold one media tensor object, not a copy each
            share_media([x.mm for x in trajs])
        t1 = clock()
        if step < t.steps:  # the next step's clips decode while this one trains
            self._prefetch(self.train_envs, train_seeds(t.seed, step + 1, t.prompts_per_step, t.group_size))
        m = await asyncio.to_thread(self.rl_step, trajs)
        t2 = clock()
        await asyncio.to_thread(self._sync_weights)
        t3 = clock()
        episodes = [summary_dict(x) for x in trajs]
        await asyncio.to_thread(self.records.write, step, "train", trajs, trained_version=self.version - 1)
        return {
            "episodes_masked": episodes_masked(episodes), **m,
            **rollout_row(episodes, t1 - t0, self.driver.components.observe(episodes)),
            "policy_version": self.version, "lr": lr,
            "time_rollout_s": t1 - t0, "time_train_s": t2 - t1, "time_sync_s": t3 - t2, "time_step_s": t3 - t0,
            "elapsed_s": self.driver.schedule.elapsed(),
        }, len(episodes)

    async def save_checkpoint(self, step: int) -> str | None:
        """The driver's checkpoint call: the error of a failed write (the previous checkpoint stays the resume point)."""
        try:
            self.checkpoint(step)
        except CheckpointWriteError as exc:  # disk full
            return str(exc)
        return None

    def _close_envs(self) -> None:
        for queue in (self.train_envs, self.eval_envs):
            while queue is not None and not queue.empty():
                queue.get_nowait().close()

    def checkpoint(self, step: int) -> Path:
        """``checkpoints/step_NNNNNN/``: the actor's model and optimizer (hf: save_pretrained; megatron:
        dist_checkpointing), the critic's folder under ppo, and the trainer state (:mod:`~relax_gym.trainer.run.checkpoint`)."""
        state = trainer_state(self.cfg.trainer, step=step, version=self.version, rng=self.rng,
                              elapsed_s=self.driver.schedule.elapsed(), extra=self.driver.trainer_extra())
        parts = {CRITIC_DIR: self.critic.save(part_stage(self.run_dir, step, CRITIC_DIR))} if self.critic is not None else {}
        return save_checkpoint(self.run_dir, self.actor, state, parts=parts)

    def close(self) -> None:
        try:
            self.driver.metrics.close()
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
