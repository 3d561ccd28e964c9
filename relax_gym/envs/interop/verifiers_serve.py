"""Our envs as verifiers environments: ``vf.load_environment("relax_gym.envs.interop.verifiers_serve",
env="nextqa-video", url=...)`` gives a ``vf.MultiTurnEnv`` (the
classic stack) whose rollouts play one of our envs, so verifiers' own tools (``vf-eval``, ``env.evaluate``, a
verifiers trainer) run any registered env.

Runs in a venv with verifiers (the one ``relax-gym envs prepare verifiers`` makes, or the user's), with this
checkout on the path. ``url``: our env server (``relax-gym envs serve ID`` prints it), reached with our client, so
the env's own packages, media and sandboxes stay on the server's side; without it the env is made in-process.
What maps to what:

- the dataset: one row per seed (``seed``, ``seed + 1``, ...: ``episodes`` rows): ``prompt`` is the opening as
  OpenAI chat messages with media inline (an ``image_url`` data URL, audio as ``input_audio`` or an ``audio_url``
  data URL, video as a ``video_url`` data URL of the clip, with its ``sampling`` spec), ``answer`` the gold action,
  ``info["seed"]``;
- each rollout makes its own env (``setup_state``), resets it with the row's seed, and each ``env_response`` steps it
  with the model's last reply; the step's new messages are the env's response, the episode's end is verifiers'
  ``final_env_response``, and ``state["relax_gold"]`` holds the next gold action (for an oracle client);
- the reward is the episode's return (``relax_return``, the rubric's one function); ``state["relax_breakdown"]``
  the last step's ``reward_breakdown``.

Lost: our per-step rewards are summed into the one rollout reward verifiers keeps; tool calls stay text (as the
policy writes them: ``<tool_call>`` blocks), so a tool result's ``tool_call_id`` is made up (``<tool name>-<n>``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import verifiers.legacy as vf
from datasets import Dataset

import relax_gym
from relax_gym.envs.remote.wire import encode_messages


def load_environment(env: str = "nextqa-video", url: str | None = None, episodes: int = 8, seed: int = 0,
                     max_turns: int = 16, **env_kwargs: Any) -> vf.MultiTurnEnv:
    """A verifiers environment of our env ``env`` (served at ``url``, or made here with ``env_kwargs``)."""
    target = f"remote:{url.rstrip('/')}/{env}" if url else env

    def make() -> Any:
        return relax_gym.make(target, **env_kwargs)

    probe, rows = make(), []
    try:
        for k in range(episodes):
            messages, info = probe.reset(seed=seed + k)
            rows.append({"prompt": encode_messages(messages, "inline"), "answer": info["gold"], "info": {"seed": seed + k}})
    finally:
        probe.close()
    return RelaxEpisodes(make, dataset=Dataset.from_list(rows), rubric=vf.Rubric(funcs=[relax_return]), max_turns=max_turns)


def relax_return(state: Any, **kwargs: Any) -> float:
    """The episode's return: the sum of the env's step rewards."""
    return float(state.get("relax_return", 0.0))


class RelaxEpisodes(vf.MultiTurnEnv):
    """A verifiers ``MultiTurnEnv`` whose every rollout is one episode of one of our envs."""

    def __init__(self, make: Callable[[], Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._make = make

    async def setup_state(self, state: Any) -> Any:
        env = await asyncio.to_thread(self._make)
        _, info = await asyncio.to_thread(env.reset, seed=int(state["info"]["seed"]))
        state.update(relax_env=env, relax_gold=info["gold"], relax_return=0.0, relax_breakdown={})
        return state

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> list[dict[str, Any]]:
        last = messages[-1]
        content = last.get("content") if isinstance(last, dict) else getattr(last, "content", "")
        action = content if isinstance(content, str) else "".join(
            (p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "")) for p in content or [])
        observation, reward, terminated, truncated, info = await asyncio.to_thread(state["relax_env"].step, action)
        state["relax_return"] += float(reward)
        state["relax_gold"], state["relax_breakdown"] = info.get("gold"), dict(info.get("reward_breakdown") or {})
        response = _with_tool_call_ids(encode_messages(observation, "inline"), state)
        if terminated or truncated:
            state["final_env_response"] = response
        return response

    @vf.cleanup
    async def close_relax_env(self, state: Any) -> None:
        env = state.pop("relax_env", None)
        if env is not None:
            await asyncio.to_thread(env.close)


def _with_tool_call_ids(messages: list[dict[str, Any]], state: Any) -> list[dict[str, Any]]:
    """Tool results as verifiers' tool messages, which need a ``tool_call_id``: our tool calls are text in the
    assistant's reply (``<tool_call>`` blocks), so a result gets an id of its own (``<tool name>-<n>``)."""
    for message in messages:
        if message.get("role") == "tool" and not message.get("tool_call_id"):
            state["relax_tool_results"] = n = state.get("relax_tool_results", 0) + 1
            message["tool_call_id"] = f"{message.get('name') or 'tool'}-{n}"
    return messages
