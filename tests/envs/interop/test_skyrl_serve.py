"""Our envs as skyrl-gym envs: in the skyrl-gym venv, ``skyrl_gym.make("relax-gym", env_config={"url": URL},
extras=row)`` on rows ``dataset_rows`` wrote in SkyRL's layout plays whole episodes of ``nextqa-video`` and
``echo-ink-agent`` served by our env server, with the gold actions; asserted on what SkyRL's side received: the
media decode there and every episode earns the env's maximum."""

from __future__ import annotations

import pytest

from .media_probe import DECODE, EPISODES, assert_media, run_against_our_server

# runs in the skyrl-gym venv (this checkout appended to its path)
PLAY = DECODE + r'''
import json, sys
sys.path.append(sys.argv[3])
import skyrl_gym
from omegaconf import OmegaConf
from relax_gym.envs.interop.skyrl_serve import dataset_rows

url, env_id = sys.argv[1], sys.argv[2]
config = OmegaConf.create({"url": url})
received, returns = [], []
for row in dataset_rows(env_id, episodes=2, url=url):
    env = skyrl_gym.make(row["env_class"], env_config=config, extras=row)
    prompt, meta = env.init(row["prompt"])
    assert prompt == row["prompt"], "the reset gives the row's opening again"
    received += media(prompt)
    total, done = 0.0, False
    while not done:
        out = env.step(meta["gold"])
        received += media(out["observations"])
        total, done, meta = total + out["reward"], out["done"], out["metadata"]
    env.close()
    returns.append(total)
print(json.dumps({"returns": returns, "received": received}))
'''


@pytest.mark.parametrize("env_id, kinds", EPISODES)
def test_skyrl_gym_plays_our_episodes_with_their_media(env_id, kinds):
    got = run_against_our_server("skyrl-gym", PLAY, env_id)
    assert got["returns"] == [1.0, 1.0], got
    assert_media(got["received"], kinds)
