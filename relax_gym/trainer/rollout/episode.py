"""Episode runner: env ↔ inference engine, multi-turn, token-in-token-out → a :class:`Trajectory`.

The runner speaks to the engine only through :class:`~relax_gym.trainer.engines.client.EngineClient` (SGLang's HTTP
protocol), so the same code drives the embedded engine or a real SGLang server. Each turn sends the rendered ids
so far and every media item of the conversation; the sampled ids are appended as they are (never re-tokenised),
with their log-probs, and the env's reply is rendered after them. Anything that fails inside an episode (the env,
the engine, the renderer) ends that episode with a status, masked out of training and counted — never a crash.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from relax_gym.envs.rubric import RubricError
from relax_gym.omni.parts import Message
from relax_gym.omni.render import Rendered, extend, render
from relax_gym.trainer.engines.media_items import media_data
from relax_gym.trainer.policy.routing import decode_routed_experts, empty_routing, merge_turn

log = logging.getLogger(__name__)

# judge_error: the judge could not score a pending rubric part (relax_gym/trainer/rewards/judge.py)
MASKED_STATUSES = frozenset({"env_error", "engine_error", "judge_error"})

# env.reset / env.step run here, not in asyncio's default pool (min(32, cores + 4) threads: 6 on a 2-core machine),
# so episodes whose steps wait on a tool (a sandbox, a network call) do not queue behind one another. Threads are
# made only when needed.
_ENV_THREADS = ThreadPoolExecutor(max_workers=256, thread_name_prefix="env-step")


async def _in_env_thread(fn, /, *args, **kwargs):
    return await asyncio.get_running_loop().run_in_executor(_ENV_THREADS, functools.partial(fn, *args, **kwargs))


@dataclass
class EpisodeTiming:
    """Where an episode's wall time went, in seconds (perf counter): ``reset_s`` (the env's reset and the first
    render), one ``generate_s`` per engine call (queueing in the engine included) and one ``env_s`` per env step
    (tool calls and their sandboxes, the reward), ``wall_s`` from the start of the reset to the end. Recorded in
    the rollout records and averaged into the step row (``time_episode_*_s``); ``relax-gym plan calibrate`` fits
    its cost models from them."""

    reset_s: float = 0.0
    generate_s: list[float] = field(default_factory=list)
    env_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"reset_s": round(self.reset_s, 6), "generate_s": [round(x, 6) for x in self.generate_s],
                "env_s": [round(x, 6) for x in self.env_s], "wall_s": round(self.wall_s, 6)}


@dataclass
class Trajectory:
    group_id: int
    seed: int
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)  # aligned with input_ids; 0 where not sampled
    mm: dict[str, torch.Tensor] = field(default_factory=dict)
    reward: float = 0.0
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    status: str = "ok"
    error: str = ""
    turns: int = 0
    completion_tokens: int = 0
    weight_version: str | None = None  # the engine's weight version of the last turn
    weight_versions: list[str] = field(default_factory=list)  # one per generated turn, as the engine reported it
    info: dict[str, Any] = field(default_factory=dict)
    # MoE policies: (positions, MoE layers, top_k) int16 expert ids, positions from 0 (see trainer/policy/routing.py)
    routed_experts: torch.Tensor | None = None
    # every message of the episode, the policy's replies included, as far as it got (rollout records: run/rollout_records.py)
    conversation: list[Message] = field(default_factory=list)
    timing: EpisodeTiming = field(default_factory=EpisodeTiming)

    @property
    def trainable(self) -> bool:
        return self.status not in MASKED_STATUSES and sum(self.loss_mask) > 0


async def run_episode(env, client, processor, *, seed: int, group_id: int, sampling_params: dict[str, Any],
                      options: dict[str, Any] | None = None, max_turns: int | None = None,
                      routing: tuple[int, int] | None = None) -> Trajectory:
    """Play one episode. ``env`` is a gymnasium env (stepped in a worker thread); ``client`` an EngineClient.
    ``routing``: ``(MoE layers, top_k)`` of an MoE policy: every turn asks for the routed experts and the
    trajectory keeps them (``routed_experts``)."""
    traj = Trajectory(group_id=group_id, seed=seed)
    start = time.perf_counter()
    try:
        return await _play(traj, env, client, processor, seed=seed, sampling_params=sampling_params, options=options,
                           max_turns=max_turns, routing=routing)
    finally:
        traj.timing.wall_s = time.perf_counter() - start


async def _play(traj: Trajectory, env, client, processor, *, seed: int, sampling_params: dict[str, Any],
                options: dict[str, Any] | None, max_turns: int | None, routing: tuple[int, int] | None) -> Trajectory:
    timing = traj.timing
    if routing is not None:
        traj.routed_experts = empty_routing(*routing)
    extra = {"return_routed_experts": True} if routing is not None else {}
    t0 = time.perf_counter()
    try:
        obs, info = await _in_env_thread(env.reset, seed=seed, options=options)
    except Exception as exc:  # a broken record or media file: this episode is lost, the step goes on
        return _failed(traj, "env_error", exc)
    conversation = list(obs)
    traj.conversation = list(obs)
    try:
        rendered = render(conversation, processor)
    except Exception as exc:
        return _failed(traj, "env_error", exc)
    finally:
        timing.reset_s = time.perf_counter() - t0
    logprobs = [0.0] * len(rendered.input_ids)
    done = False
    while not done:
        t0 = time.perf_counter()
        try:
            out = await client.generate(rendered.input_ids, sampling_params=sampling_params, return_logprob=True,
                                        **extra, **media_data(conversation))
            if routing is not None:
                turn = decode_routed_experts(out.meta_info, *routing)
                forwarded = len(rendered.input_ids) + len(out.output_ids) - 1  # the prompt, all generated but the last
                if out.output_ids and turn.shape[0] != forwarded:
                    raise ValueError(f"routed_experts covers {turn.shape[0]} positions, but the request forwarded {forwarded} "
                                     f"({len(rendered.input_ids)} prompt + {len(out.output_ids)} generated - 1): the server "
                                     "counts the prompt differently (media placeholders?), so the record cannot be aligned")
                traj.routed_experts = merge_turn(traj.routed_experts, turn)
        except Exception as exc:
            return _failed(traj, "engine_error", exc, rendered, logprobs)
        finally:
            timing.generate_s.append(time.perf_counter() - t0)
        traj.turns += 1
        traj.completion_tokens += len(out.output_ids)
        traj.weight_version = out.weight_version
        if out.weight_version is not None:
            traj.weight_versions.append(str(out.weight_version))
        action = processor.decode(out.output_ids, skip_special_tokens=True)
        traj.conversation.append(Message("assistant", action))
        t0 = time.perf_counter()
        try:
            obs, reward, terminated, truncated, info = await _in_env_thread(env.step, action)
        except RubricError:  # the manifest's rubric asks for what the env never gives: a configuration error, raised
            raise
        except Exception as exc:
            return _failed(traj, "env_error", exc, rendered, logprobs)
        finally:
            timing.env_s.append(time.perf_counter() - t0)
        traj.reward += float(reward)
        if info.get("reward_breakdown"):
            traj.reward_breakdown = dict(info["reward_breakdown"])
        traj.status = info.get("status", "ok")
        done = terminated or truncated or (max_turns is not None and traj.turns >= max_turns)
        try:
            before = len(rendered.input_ids)
            rendered = extend(rendered, list(obs), assistant_token_ids=out.output_ids, add_generation_prompt=not done)
        except Exception as exc:
            return _failed(traj, "env_error", exc, rendered, logprobs)
        logprobs += _aligned_logprobs(rendered.input_ids[before:], out.output_ids, out.output_logprobs)
        traj.conversation += list(obs)
        conversation += list(obs)  # (assistant turns carry no media: media_items only needs env messages)
    traj.input_ids, traj.loss_mask, traj.mm = list(rendered.input_ids), list(rendered.loss_mask), dict(rendered.mm)
    traj.rollout_logprobs = logprobs
    # judge_requests / reward_weights: rubric parts the env left for the judge (trainer/rewards/judge.py scores them)
    traj.info = {k: v for k, v in info.items()
                 if k in ("tool_calls", "tool_errors", "tool_crashes", "sample_id", "judge_requests", "reward_weights", "reward_context")}
    return traj


def _aligned_logprobs(new_ids: list[int], sampled: list[int], sampled_logprobs: list[float]) -> list[float]:
    """Log-probs for the tokens ``extend`` appended: the sampled prefix gets the engine's values, the rest 0."""
    n = 0
    while n < len(new_ids) and n < len(sampled) and new_ids[n] == sampled[n]:
        n += 1
    return list(sampled_logprobs[:n]) + [0.0] * (len(new_ids) - n)


def _failed(traj: Trajectory, status: str, exc: Exception, rendered: Rendered | None = None, logprobs: list[float] | None = None) -> Trajectory:
    log.warning("episode (seed %d) failed: %s: %r", traj.seed, status, exc)
    traj.status, traj.error, traj.reward = status, f"{type(exc).__name__}: {exc}", 0.0
    if rendered is not None:
        traj.input_ids, traj.loss_mask, traj.mm = list(rendered.input_ids), [0] * len(rendered.input_ids), dict(rendered.mm)
        traj.rollout_logprobs = list(logprobs or [0.0] * len(rendered.input_ids))
    return traj
