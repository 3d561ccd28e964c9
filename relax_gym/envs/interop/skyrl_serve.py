"""Our envs as skyrl-gym envs: ``skyrl_gym.make("relax-gym", env_config={"url": URL}, extras={"relax_env": ID,
"seed": 3})`` after :func:`register` (importing this module registers it), so SkyRL's generator and trainer play
any registered env.

Runs in a venv with skyrl-gym (the one ``relax-gym envs prepare skyrl-gym`` makes, or the user's), with this
checkout on the path. ``env_config["url"]``: our env server (``relax-gym envs serve ID`` prints it), reached with our
client, so the env's own packages, media and sandboxes stay on the server's side; without it the env is made
in-process (``env_config["kwargs"]``: its constructor kwargs). What maps to what:

- one skyrl-gym env per episode, as SkyRL makes them: ``extras["relax_env"]`` names our env and
  ``extras["seed"]`` its episode (:func:`dataset_rows` writes such rows, in SkyRL's dataset layout);
- ``init(prompt)`` resets our env and returns its opening instead of the row's prompt (the row's is the same
  opening, written when the dataset was made), as OpenAI chat messages with media inline (``image_url`` /
  ``video_url`` data URLs, ``input_audio``), and ``{"gold": ...}`` as metadata;
- ``step(action)`` is our step: the new messages are ``observations``, our reward and ``done`` (terminated or
  truncated) SkyRL's, ``metadata`` the next gold action, the status and the reward breakdown.

Lost: SkyRL's tool groups (our tools are called through the action text, as the policy writes them); its
``postprocessed_action``.
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput
from skyrl_gym.envs.registration import register as skyrl_register
from skyrl_gym.envs.registration import registry as skyrl_registry

import relax_gym
from relax_gym.envs.remote.wire import encode_messages

ENV_CLASS = "relax-gym"


class RelaxTextEnv(BaseTextEnv):
    """One episode of one of our envs, as a skyrl-gym ``BaseTextEnv``."""

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        config, extras = dict(env_config or {}), dict(extras or {})
        env_id = extras.get("relax_env") or config.get("relax_env")
        if not env_id:
            raise ValueError("a relax-gym skyrl env needs extras['relax_env'] (or env_config['relax_env']): the env's id")
        url = config.get("url")
        target = f"remote:{str(url).rstrip('/')}/{env_id}" if url else env_id
        self.env = relax_gym.make(target, **dict(config.get("kwargs") or {}))
        self.seed = extras.get("seed")
        self.max_turns = int(config.get("max_turns", 16))

    def init(self, prompt: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        messages, info = self.env.reset(seed=None if self.seed is None else int(self.seed))
        return encode_messages(messages, "inline"), {"gold": info["gold"]}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        messages, reward, terminated, truncated, info = self.env.step(action)
        metadata = {"gold": info.get("gold"), "status": info.get("status"),
                    "reward_breakdown": dict(info.get("reward_breakdown") or {})}
        return BaseTextEnvStepOutput(observations=encode_messages(messages, "inline"), reward=float(reward),
                                     done=bool(terminated or truncated), metadata=metadata)

    def close(self) -> None:
        self.env.close()


def register() -> None:
    """Register :class:`RelaxTextEnv` with skyrl-gym as ``relax-gym`` (once)."""
    if ENV_CLASS not in skyrl_registry:
        skyrl_register(id=ENV_CLASS, entry_point=RelaxTextEnv)


def dataset_rows(env_id: str, *, episodes: int, seed: int = 0, url: str | None = None) -> list[dict[str, Any]]:
    """Rows in SkyRL's dataset layout for ``episodes`` episodes of ``env_id`` (seeds ``seed``...): the opening as
    ``prompt``, ``env_class`` ``relax-gym``, the gold action as ``reward_spec["ground_truth"]``."""
    target = f"remote:{url.rstrip('/')}/{env_id}" if url else env_id
    env, rows = relax_gym.make(target), []
    try:
        for k in range(episodes):
            messages, info = env.reset(seed=seed + k)
            rows.append({"data_source": f"relax-gym/{env_id}", "prompt": encode_messages(messages, "inline"),
                         "env_class": ENV_CLASS, "reward_spec": {"method": "env", "ground_truth": info["gold"]},
                         "extra_info": {"relax_env": env_id, "seed": seed + k}, "relax_env": env_id, "seed": seed + k})
    finally:
        env.close()
    return rows


register()
