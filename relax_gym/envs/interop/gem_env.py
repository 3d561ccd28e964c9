"""GEM envs (``pip install gem-llm``) as relax-gym envs: ``relax_gym.make("gem:game:GuessTheNumber-v0-easy")``.

Runs inside the GEM venv (:mod:`relax_gym.envs.interop.venvs`); the trainer's process holds a
:class:`~relax_gym.envs.remote.client.RemoteEnv` of it. What maps to what:

- ``gem.make(id, **env_kwargs)`` makes the env once; each reset calls its ``reset(seed)`` with a seed drawn from
  this env's seeded generator (GEM seeds Python's, numpy's and torch's global generators with it), so the same
  relax-gym seed gives the same episode;
- the observation string of a reset or a step becomes one user message; GEM's terminal placeholder
  (``TERMINAL_STATE``) becomes no message; ``info`` goes through as ``gem_info``;
- each step's reward is GEM's own (a multi-turn game pays per step; the trainer sums an episode's steps);
  ``terminated`` / ``truncated`` are GEM's (a truncation ends the episode);
- the gold action comes from ``gold``, a ``str.format`` template over the GEM env's attributes (``"\\boxed{{{game_number}}}"``
  for Guess The Number, the default for the games listed in :data:`GOLD`); without one the gold is "" and
  ``check_env`` reports it;
- reward bounds: ``reward_bounds``, else GEM's own constants for its games (a format error -0.1 .. success 1.0),
  else [0, 1].

Lost: GEM's vectorised and async wrappers (the trainer runs many env instances itself), its tool wrappers' own
parsing (the observation is the text GEM gives), and media (GEM's observations are text).
"""

from __future__ import annotations

from typing import Any

from relax_gym.envs.core import Opening, Outcome
from relax_gym.envs.interop.adapter import ForeignAgentEnv, fill_gold
from relax_gym.envs.remote.wire import encode_value
from relax_gym.omni import Message, TextPart

# GEM env class -> the gold action's template over its attributes (after reset)
GOLD = {"GuessTheNumberEnv": "\\boxed{{{game_number}}}"}


class GemEnv(ForeignAgentEnv):
    framework_title = "GEM"
    media_kinds = ()

    def __init__(self, env_id: str, *, env_kwargs: dict[str, Any] | None = None, gold: str | None = None,
                 reward_bounds: tuple[float, float] | None = None, max_turns: int | None = None,
                 call_timeout_s: float = 300.0, **kwargs: Any) -> None:
        import gem

        self.env_kwargs = dict(env_kwargs or {})
        super().__init__(env_id, call_timeout_s=call_timeout_s, max_turns=max_turns or 1, **kwargs)
        self._gem = gem
        self._env = self._make()
        self.max_turns = int(max_turns or getattr(self._env, "max_turns", None) or 1)
        self.gold_template = gold if gold is not None else GOLD.get(type(self._env).__name__)
        self.reward_range_ = tuple(reward_bounds) if reward_bounds is not None else _default_bounds(self._env)

    def _make(self) -> Any:
        return self._call("gem.make", lambda: self._gem.make(self.env_id, **self.env_kwargs))

    def _reset(self, options: dict[str, Any]) -> Opening:
        if self._stuck:  # a call timed out: that env may be mid-call for ever
            self._env, self._stuck = self._make(), False
        seed = int(self.np_random.integers(2**31 - 1))
        answer = self._call("reset", lambda: self._env.reset(seed=seed))
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise self._malformed("reset", f"{type(answer).__name__}, not (observation, info)")
        observation, info = answer
        messages = self._messages("reset", observation)
        if not messages:
            raise self._malformed("reset", "no observation")
        gold = fill_gold(self.gold_template, vars(self._env), where=self._where("gold"))
        return Opening(messages, gold, {"gem_info": encode_value(info), "gem_seed": seed})

    def _step(self, action: str) -> Outcome:
        answer = self._call("step", lambda: self._env.step(action))
        if not (isinstance(answer, tuple) and len(answer) == 5):
            raise self._malformed("step", f"{type(answer).__name__}, not (observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = answer
        reward = self._reward("step", reward)
        done = bool(terminated) or bool(truncated)
        gold = None if done else fill_gold(self.gold_template, vars(self._env), where=self._where("gold"))
        return Outcome(self._messages("step", observation), reward, done, {"gem": reward}, gold=gold,
                       info={"gem_info": encode_value(info), "gem_truncated": bool(truncated)})

    def _messages(self, call: str, observation: Any) -> list[Message]:
        if not isinstance(observation, str):
            raise self._malformed(call, f"an observation of type {type(observation).__name__}, not text")
        if observation == _terminal_state() or not observation.strip():
            return []
        return [Message("user", (TextPart(observation),))]

    def close(self) -> None:
        close = getattr(getattr(self, "_env", None), "close", None)
        if callable(close) and not self._stuck:
            close()
        super().close()


def _terminal_state() -> str | None:
    try:
        from gem.utils.constants import TERMINAL_STATE
    except ImportError:
        return None
    return TERMINAL_STATE


def _default_bounds(env: Any) -> tuple[float, float]:
    """GEM's reward constants for its games (``LanguageGameReward``, ``TextArenaGameReward`` in older releases: a
    format error is the least a step earns), else [0, 1]."""
    if type(env).__module__.startswith("gem.envs.game_env"):
        from gem.utils import constants

        rewards = getattr(constants, "LanguageGameReward", None) or getattr(constants, "TextArenaGameReward", None)
        if rewards is not None:
            low = min(rewards.format_error_reward, rewards.invalid_action_reward, rewards.fail_reward)
            return (low, rewards.success_reward)
    return (0.0, 1.0)

