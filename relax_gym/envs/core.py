"""The agent environment contract.

``AgentEnv`` is a ``gymnasium.Env`` whose observation is a conversation and whose action is the assistant's
text for the turn. Invariants every subclass gets for free:

- ``reset`` returns the opening messages; each ``step`` returns only the *new* messages (append-only), so a
  trainer never re-renders earlier turns. ``history`` holds the whole conversation, the actions included.
- ``info`` always carries ``episode_id`` (reproducible for a given seed), ``turn``, ``status`` (see :class:`Status`), ``gold`` (an action
  that earns the maximum reward, for oracle policies and checks) and, after a step, ``reward_breakdown``.
- A bad action (not a string, empty, too long) ends the episode with the minimum reward and
  ``status="invalid_action"``; an exception inside the subclass's ``_step`` ends it with
  ``status="env_error"`` and the error text in ``info["error"]``. Neither propagates to the episode loop.

Subclasses implement ``_reset(options) -> Opening`` and ``_step(action) -> Outcome``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import gymnasium

from relax_gym.envs.spaces import AssistantText, Conversation
from relax_gym.omni import Message
from relax_gym.omni.parts import TextPart

log = logging.getLogger(__name__)


class Status(StrEnum):
    OK = "ok"
    TRUNCATED = "truncated"  # ran out of turns
    INVALID_ACTION = "invalid_action"  # empty, oversize or non-text action: minimum reward, episode over
    ENV_ERROR = "env_error"  # the environment itself failed: the trainer masks this episode


@dataclass
class Opening:
    """What ``_reset`` returns: the first messages, a gold action, and any extra info."""

    messages: list[Message]
    gold: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What ``_step`` returns for one action."""

    messages: list[Message]
    reward: float
    terminated: bool
    reward_breakdown: dict[str, float]
    gold: str | None = None  # the next gold action, for multi-turn envs
    info: dict[str, Any] = field(default_factory=dict)


class AgentEnv(gymnasium.Env[list, str]):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    media_kinds: tuple[str, ...] = ("image", "video", "audio")
    reward_range_: tuple[float, float] = (0.0, 1.0)

    def __init__(self, *, max_turns: int = 1, max_action_chars: int = 32_768, render_mode: str | None = None) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.render_mode = render_mode
        self.max_turns = max_turns
        self.action_space = AssistantText(max_length=max_action_chars)
        self.observation_space = Conversation(self.media_kinds)
        self.history: list[Message] = []
        self._turn = 0
        self._done = True
        self._episode_id = ""
        self._gold = ""

    # -- subclass hooks -----------------------------------------------------------------------------------

    def _reset(self, options: dict[str, Any]) -> Opening:
        raise NotImplementedError

    def _step(self, action: str) -> Outcome:
        raise NotImplementedError

    @property
    def reward_bounds(self) -> tuple[float, float]:
        """(minimum, maximum) reward of one step; ``check_env`` verifies gold reaches the max."""
        return self.reward_range_

    # -- gymnasium API ------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        opening = self._reset(dict(options or {}))
        self._turn = 0
        self._done = False
        # Drawn from the env's RNG: unique across unseeded resets, reproducible for a given seed.
        self._episode_id = f"{int(self.np_random.integers(2**63)):016x}"
        self._gold = opening.gold
        self.history = list(opening.messages)
        info = {**opening.info, "episode_id": self._episode_id, "turn": 0, "status": Status.OK.value, "gold": opening.gold}
        return list(opening.messages), info

    def step(self, action: str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError("step() called on a finished episode: call reset() first")
        self._turn += 1
        problem = self._action_problem(action)
        if problem is not None:
            return self._finish(Status.INVALID_ACTION, self.reward_bounds[0], problem, action)
        self.history.append(Message(role="assistant", content=(TextPart(action),)))
        try:
            out = self._step(action)
        except Exception as exc:  # the env failed, not the agent: mask the episode, keep the loop alive
            log.warning("env %s failed in step %d: %r", type(self).__name__, self._turn, exc, exc_info=True)
            return self._finish(Status.ENV_ERROR, self.reward_bounds[0], f"{type(exc).__name__}: {exc}", action)
        self.history.extend(out.messages)
        truncated = not out.terminated and self._turn >= self.max_turns
        self._done = out.terminated or truncated
        if out.gold is not None:
            self._gold = out.gold
        status = Status.TRUNCATED if truncated else Status.OK
        info = {
            **out.info,
            "episode_id": self._episode_id,
            "turn": self._turn,
            "status": status.value,
            "gold": self._gold,
            "reward_breakdown": dict(out.reward_breakdown),
        }
        return list(out.messages), float(out.reward), bool(out.terminated), truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"{m.role}: " + " ".join(p.summary() if p.kind != "text" else p.text for p in m.content) for m in self.history)

    # -- helpers ------------------------------------------------------------------------------------------

    def _action_problem(self, action: Any) -> str | None:
        if not isinstance(action, str):
            return f"action must be a str, got {type(action).__name__}"
        if not action.strip():
            return "empty action"
        if len(action) > self.action_space.max_length:
            return f"action has {len(action)} characters, more than max_action_chars={self.action_space.max_length}"
        return None

    def _finish(self, status: Status, reward: float, why: str, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        self._done = True
        info = {
            "episode_id": self._episode_id,
            "turn": self._turn,
            "status": status.value,
            "gold": self._gold,
            "reward_breakdown": {},
            "error" if status is Status.ENV_ERROR else "status_detail": why,
        }
        return [], float(reward), True, False, info
