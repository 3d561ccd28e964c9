"""Episodes of agent-program envs: run the black-box agent against a recording gateway, train on what it sampled.

An :class:`~relax_gym.envs.agent_program.AgentProgramEnv` never hands the trainer a turn: its program talks to an
OpenAI endpoint. :class:`ProgramEpisodes` gives each episode a session on an
:class:`~relax_gym.trainer.gateway.openai_gateway.OpenAIGateway` (one per sampling setting: training and greedy
evaluation), lets the env run its program against it, then builds the :class:`Trajectory` from the recorded calls:

- **Stitching.** A call whose prompt ids start with the previous call's prompt + completion ids continues the
  same token sequence (the gateway renders a conversation that extends the previous call's with
  ``omni.render.extend``, so the sampled ids are never re-tokenised). The sequence is the last call's prompt +
  completion; the loss mask is 1 exactly on every call's completion ids, and the rollout log-probs there are the
  engine's.
- **Segments.** A call that does not extend the previous one (the agent rewrote or trimmed its history) starts a
  new segment. Only the final segment — the one whose calls led to the scored outcome — is trained; earlier
  segments are counted (``info["agent_segments"]``, ``info["agent_untrained_tokens"]``, and the step rows'
  ``agent_segments_mean`` / ``agent_untrained_tokens``), never trained, because one episode is one row and one
  advantage (training each segment as its own row would count the episode several times in its group).
- **Failures.** A program that cannot start or whose sandbox fails, or an agent that never called the model, is an
  ``env_error`` episode (masked); one whose model calls failed on the engine's side (the gateway notes them) is an
  ``engine_error`` (masked); a program that ran out of time is ``truncated`` and trained with its score.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from relax_gym.envs.agent_program import ProgramOutcome
from relax_gym.envs.agent_run import AgentEndpoint
from relax_gym.omni.parts import Message, TextPart
from relax_gym.trainer.rollout.episode import Trajectory, _in_env_thread

log = logging.getLogger(__name__)

__all__ = ["ProgramEpisodes", "is_agent_program", "program_conversation", "split_segments", "trajectory_from_calls"]


def is_agent_program(env: Any) -> bool:
    return bool(getattr(getattr(env, "unwrapped", env), "agent_program", False))


def split_segments(calls: Sequence[Any]) -> list[list[Any]]:
    """Calls grouped into token-continuous segments (see the module doc)."""
    segments: list[list[Any]] = []
    sequence: list[int] = []
    for call in calls:
        prompt = list(call.prompt_ids)
        if not segments or prompt[: len(sequence)] != sequence:
            segments.append([])
        segments[-1].append(call)
        sequence = prompt + list(call.completion_ids)
    return segments


def _why_no_call(info: dict[str, Any]) -> str:
    """What the program's run says about an episode without a model call: its time-out, exit status, last stderr."""
    if info.get("agent_timed_out"):
        why = f": it timed out after {info.get('agent_seconds', '?')} s"
    elif info.get("agent_rc") is not None:
        why = f": it exited with status {info['agent_rc']}"
    else:
        return ""
    if info.get("agent_first_http_error"):
        why += f"; its first refused request: {info['agent_first_http_error']}"
    tail = str(info.get("agent_stderr_tail") or "").strip().splitlines()[-3:]
    return why + (f"; stderr ends: {' | '.join(tail)[-300:]}" if tail else "")


STDERR_KEPT = 1_000  # characters of the agent's stderr an episode's record keeps


def trajectory_from_calls(calls: Sequence[Any], outcome: ProgramOutcome, *, seed: int, group_id: int,
                          failures: Sequence[str] = ()) -> Trajectory:
    """The training trajectory of one program episode (see the module doc). ``failures``: errors of the episode's
    calls that failed on the engine's side; any makes it an ``engine_error`` (masked), as in a turn-level episode."""
    traj = Trajectory(group_id=group_id, seed=seed)
    traj.reward, traj.reward_breakdown = float(outcome.reward), dict(outcome.reward_breakdown)
    traj.status, traj.error = outcome.status, outcome.error
    segments = split_segments(calls)
    traj.conversation = program_conversation(calls)
    traj.info = {"agent_calls": len(calls), "agent_segments": len(segments), **{k: v for k, v in outcome.info.items()
                                                                               if k in ("agent_rc", "agent_timed_out",
                                                                                        "agent_first_http_error")}}
    if outcome.info.get("agent_stderr_tail"):  # what the program said, for the rollout records and the viewer
        traj.info["agent_stderr_tail"] = str(outcome.info["agent_stderr_tail"])[-STDERR_KEPT:]
    if outcome.status == "env_error":
        traj.reward = 0.0
        return traj
    if failures:  # the agent saw an engine error, not a policy's reply: its score says nothing about the policy
        traj.status, traj.reward = "engine_error", 0.0
        traj.error = f"{len(failures)} model call(s) failed on the engine's side: {failures[0]}"
        return traj
    if not calls:
        traj.status, traj.reward = "env_error", 0.0
        traj.error = traj.error or "the agent program made no model call (nothing to train on)" + _why_no_call(outcome.info)
        return traj
    final = segments[-1]
    last = final[-1]
    ids = list(last.prompt_ids) + list(last.completion_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    for call in final:
        start = len(call.prompt_ids)
        for i, lp in enumerate(call.logprobs[: len(call.completion_ids)]):
            mask[start + i] = 1
            logprobs[start + i] = 0.0 if lp is None or not math.isfinite(lp) else float(lp)
    traj.input_ids, traj.loss_mask, traj.rollout_logprobs = ids, mask, logprobs
    traj.mm = dict(getattr(last, "mm", None) or {})
    traj.turns = len(final)
    traj.completion_tokens = sum(len(c.completion_ids) for c in final)
    traj.weight_versions = [str(c.weight_version) for c in final if c.weight_version is not None]
    traj.weight_version = traj.weight_versions[-1] if traj.weight_versions else None
    traj.info["agent_untrained_tokens"] = sum(len(c.completion_ids) for seg in segments[:-1] for c in seg)
    return traj


def program_conversation(calls: Sequence[Any]) -> list[Message]:
    """What a program episode shows of itself (rollout records): the gateway keeps each call's media and reply, not
    the program's prompts, so a user message with the media of the last call (every media part the conversation
    held), then each call's reply as an assistant message, in call order."""
    if not calls:
        return []
    note = TextPart(f"(agent program: {len(calls)} model call(s); its prompts are not recorded, the media it sent are)")
    media = tuple(getattr(calls[-1], "media", ()) or ())  # a call that kept no media (a stand-in, an old gateway)
    return [Message("user", (note, *media)), *(Message("assistant", str(getattr(c, "text", ""))) for c in calls)]


class ProgramEpisodes:
    """Runs agent-program episodes for a trainer (colocate) or an env-worker replica. Gateways are made inside the
    running event loop on first use, one per sampling setting; :meth:`close` stops them."""

    def __init__(self, processor: Any, *, max_positions: int | None = None) -> None:
        self.processor = processor
        self.max_positions = max_positions
        self._gateways: dict[tuple, Any] = {}

    def gateway(self, client: Any, sampling: Mapping[str, Any]) -> Any:
        from relax_gym.trainer.gateway.openai_gateway import OpenAIGateway

        key = (id(client), tuple(sorted((k, repr(v)) for k, v in sampling.items())))
        if key not in self._gateways:
            self._gateways[key] = OpenAIGateway(self.processor, client, asyncio.get_running_loop(), sampling=sampling,
                                                max_positions=self.max_positions)
        return self._gateways[key]

    async def run(self, env: Any, client: Any, *, seed: int, group_id: int, sampling_params: Mapping[str, Any],
                  options: dict[str, Any] | None = None) -> Trajectory:
        """One episode; never raises (a gateway that cannot start masks the episode as an ``engine_error``)."""
        try:
            gateway = self.gateway(client, sampling_params)
        except Exception as exc:  # noqa: BLE001 - this episode fails, the step goes on
            log.warning("no OpenAI gateway for agent-program episodes: %r", exc)
            return Trajectory(group_id=group_id, seed=seed, status="engine_error", error=f"{type(exc).__name__}: {exc}")
        session, key = gateway.open_session()
        endpoint = AgentEndpoint(gateway.base_url, key, gateway.model_name)
        try:
            outcome = await _in_env_thread(env.unwrapped.run_program, seed=seed, endpoint=endpoint, options=options)
        except Exception as exc:  # noqa: BLE001 - run_program reports failures itself; anything else is masked here
            log.warning("agent-program episode (seed %d) failed: %r", seed, exc)
            outcome = ProgramOutcome(0.0, {}, "env_error", f"{type(exc).__name__}: {exc}")
        finally:
            calls, failures = gateway.close_session(session)
            refused = gateway.first_error(session)
        if refused is not None:
            outcome.info["agent_first_http_error"] = refused
        return trajectory_from_calls(calls, outcome, seed=seed, group_id=group_id, failures=failures)

    def close(self) -> None:
        gateways, self._gateways = list(self._gateways.values()), {}
        for gateway in gateways:
            gateway.close()
