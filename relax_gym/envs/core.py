"""The agent environment contract.

``AgentEnv`` is a ``gymnasium.Env`` whose observation is a conversation and whose action is the assistant's
text for the turn. Invariants every subclass gets for free:

- ``reset`` returns the opening messages; each ``step`` returns only the *new* messages (append-only), so a
  trainer never re-renders earlier turns. ``history`` holds the whole conversation, the actions included.
- ``info`` always carries ``episode_id`` (reproducible for a given seed), ``turn``, ``status`` (see :class:`Status`), ``gold`` (an action
  that earns the maximum reward, for oracle policies and checks) and, after a step, ``reward_breakdown``. The
  terminal step of an env that reports a reward context (``Outcome.reward_context``: the gold answer, the options,
  ... as a JSON-able dict) also carries it as ``reward_context``.
- An env with a :class:`~relax_gym.envs.rubric.Rubric` (``rubric`` on the class, or :meth:`AgentEnv.use_rubric`,
  which a manifest's ``[[reward.parts]]`` calls) has its terminal reward replaced by the rubric's score of the final
  action against that reward context; pending judge parts land in ``info["judge_requests"]`` and
  ``info["reward_weights"]`` (docs/rubrics.md). A rubric that needs a field the context lacks raises
  :class:`~relax_gym.envs.rubric.RubricError`: a configuration error, not an episode's failure.
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

from relax_gym.envs.rubric import Rubric, RubricError
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
    reward_context: dict[str, Any] | None = None  # terminal steps: what a rubric scores against (JSON-able)


class AgentEnv(gymnasium.Env[list, str]):
    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    media_kinds: tuple[str, ...] = ("image", "video", "audio")
    reward_range_: tuple[float, float] = (0.0, 1.0)
    rubric: Rubric | None = None  # when set, scores the terminal step (see the module doc)
    rubric_source: str = ""  # where the rubric came from (a manifest), for its errors

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

    def use_rubric(self, rubric: Rubric | dict[str, Any] | None, *, source: str = "") -> None:
        """Score this env's terminal steps with ``rubric`` (None: the env's own reward again). ``source`` names where
        it came from in errors (a manifest's path)."""
        self.rubric = rubric if rubric is None or isinstance(rubric, Rubric) else Rubric.model_validate(rubric)
        self.rubric_source = source

    @property
    def reward_bounds(self) -> tuple[float, float]:
        """(minimum, maximum) reward of one step; ``check_env`` verifies gold reaches the max."""
        return self.reward_range_

    # -- gymnasium API ------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[list[Message], dict[str, Any]]:
        super().reset(seed=seed)
        opening = self._reset(dict(options or {}))
        problem = self._observation_problem(opening.messages)
        if problem is not None:
            raise ValueError(f"{type(self).__name__}.reset: {problem}")
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
        problem = self._observation_problem(out.messages)
        if problem is not None:  # the env's bug, not the agent's: masked like any env failure, named here
            log.warning("env %s gave an observation outside its space in step %d: %s", type(self).__name__, self._turn, problem)
            return self._finish(Status.ENV_ERROR, self.reward_bounds[0], f"{type(self).__name__}.step: {problem}", action)
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
        reward = float(out.reward)
        if out.terminated and out.reward_context is not None:
            info["reward_context"] = dict(out.reward_context)
        if out.terminated and self.rubric is not None:
            reward = self._score_rubric(action, out.reward_context or {}, info)
        return list(out.messages), reward, bool(out.terminated), truncated, info

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"{m.role}: " + " ".join(p.summary() if p.kind != "text" else p.text for p in m.content) for m in self.history)

    # -- helpers ------------------------------------------------------------------------------------------

    def _score_rubric(self, action: str, context: dict[str, Any], info: dict[str, Any]) -> float:
        """Replace the step's reward, breakdown and judge requests by the rubric's score of ``action``."""
        assert self.rubric is not None
        try:
            score = self.rubric.score(action, context)
        except RubricError as exc:
            where = f"{self.rubric_source} [reward]: " if self.rubric_source else f"{type(self).__name__} rubric: "
            raise RubricError(where + str(exc)) from None
        info.pop("judge_requests", None)
        info.pop("reward_weights", None)
        info["reward_breakdown"] = dict(score.breakdown)
        info.update(score.judge_info())
        return score.total

    def _action_problem(self, action: Any) -> str | None:
        if not isinstance(action, str):
            return f"action must be a str, got {type(action).__name__}"
        if not action.strip():
            return "empty action"
        if len(action) > self.action_space.max_length:
            return f"action has {len(action)} characters, more than max_action_chars={self.action_space.max_length}"
        return None

    def _observation_problem(self, messages: Any) -> str | None:
        """Why an observation is outside the env's observation space, naming the part (None when it is inside)."""
        space = self.observation_space
        explain = getattr(space, "problem", None)
        if explain is not None:
            return explain(list(messages))
        return None if space.contains(list(messages)) else f"the observation is not within {space!r}"

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
