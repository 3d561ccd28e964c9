"""OpenEnv envs (a server built with ``openenv-core``) as relax-gym envs: ``relax_gym.make("openenv:http://HOST:PORT",
action_field="message")``.

Runs inside the OpenEnv venv (:mod:`relax_gym.envs.interop.venvs`) and talks to the env's server with OpenEnv's own
client (``GenericEnvClient(base_url).sync()``, its WebSocket session): one session per relax-gym env instance. What
maps to what:

- reset is the server's ``reset(seed=...)`` (the seed drawn from this env's seeded generator);
- the observation dict becomes one user message: its ``observation_field`` when given, else the dict as sorted
  JSON; the step's ``reward`` (None: 0) and ``done`` are OpenEnv's; ``info["openenv_observation"]`` holds the whole
  dict;
- the action text goes as ``{action_field: text}`` (the env's Action model validates it: ``/schema`` names its
  fields);
- the gold action comes from ``gold``, a ``str.format`` template over the observation's fields and the session's
  ``state`` (``GET /state``'s fields, e.g. a hidden answer an env keeps there); without one the gold is "".

Lost: OpenEnv's MCP tools (an env's tools are called through its own action fields), typed Action / Observation
classes (dicts both ways), media (an OpenEnv observation has no defined media field: what it sends is text here).
"""

from __future__ import annotations

import json
from typing import Any

from relax_gym.envs.core import Opening, Outcome
from relax_gym.envs.interop.adapter import ForeignAgentEnv, fill_gold
from relax_gym.envs.remote.wire import encode_value
from relax_gym.omni import Message, TextPart


class OpenEnvEnv(ForeignAgentEnv):
    framework_title = "OpenEnv"
    media_kinds = ()

    def __init__(self, env_id: str, *, action_field: str = "message", observation_field: str | None = None,
                 gold: str | None = None, reward_bounds: tuple[float, float] = (0.0, 1.0), max_turns: int = 16,
                 call_timeout_s: float = 300.0, image: str | None = None, **kwargs: Any) -> None:
        """``image``: the Docker image whose server ``env_id`` reaches (named in errors; set by ``make``)."""
        from openenv.core.generic_client import GenericEnvClient

        super().__init__(env_id, call_timeout_s=call_timeout_s, max_turns=max_turns, **kwargs)
        self.image = image
        self.action_field, self.observation_field, self.gold_template = action_field, observation_field, gold
        self.reward_range_ = tuple(reward_bounds)
        self._client_cls = GenericEnvClient
        self._client: Any = None

    def _where(self, call: str) -> str:
        return f"OpenEnv {self.image} at {self.env_id}: {call}" if self.image else super()._where(call)

    def _connect(self) -> Any:
        if self._client is None or self._stuck:
            self._client = self._call("connect", lambda: self._client_cls(base_url=self.env_id).sync().connect())
            self._stuck = False
        return self._client

    def _reset(self, options: dict[str, Any]) -> Opening:
        client = self._connect()
        seed = int(self.np_random.integers(2**31 - 1))
        result = self._call("reset", lambda: client.reset(seed=seed))
        observation = self._observation("reset", result)
        state = self._call("state", client.state) if self.gold_template else {}
        fields = {**(state if isinstance(state, dict) else {}), **observation}
        gold = fill_gold(self.gold_template, fields, where=self._where("gold"))
        return Opening(self._messages(observation), gold, {"openenv_observation": encode_value(observation)})

    def _step(self, action: str) -> Outcome:
        client = self._connect()
        result = self._call("step", lambda: client.step({self.action_field: action}))
        observation = self._observation("step", result)
        reward = 0.0 if result.reward is None else self._reward("step", result.reward)
        return Outcome(self._messages(observation), reward, bool(result.done), {"openenv": reward},
                       info={"openenv_observation": encode_value(observation)})

    def _observation(self, call: str, result: Any) -> dict[str, Any]:
        observation = getattr(result, "observation", None)
        if not isinstance(observation, dict):
            raise self._malformed(call, f"an observation of type {type(observation).__name__}, not an object")
        if self.observation_field is not None and not isinstance(observation.get(self.observation_field), str):
            raise self._malformed(call, f"an observation without text in {self.observation_field!r} (observation_field): "
                                        f"fields {sorted(observation)}")
        return observation

    def _messages(self, observation: dict[str, Any]) -> list[Message]:
        text = (observation[self.observation_field] if self.observation_field is not None
                else json.dumps(encode_value(observation), sort_keys=True))
        return [Message("user", (TextPart(text),))] if text.strip() else []

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and not self._stuck:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the session ends with the server anyway
                pass
        super().close()
