"""The package's own tests: run them after installing it (`pip install -e .` then `pytest tests`)."""

import relax_gym
from relax_gym.envs import check_env


def test_registered_through_the_entry_point():
    assert relax_gym.spec("example-lamp-panel").source.startswith("entry point example-lamp-panel")


def test_passes_check_env():
    report = check_env(relax_gym.make("example-lamp-panel"))
    assert "gold action => max reward" in report.passed


def test_look_returns_the_row_as_an_image():
    env = relax_gym.make("example-lamp-panel")
    _, info = env.reset(seed=3)
    obs, *_ = env.step(info["gold"])
    (tool_message,) = obs
    (image,) = tool_message.media()
    assert tool_message.name == "look" and image.decode().shape == (16, 128, 3)
    lit = int((image.decode()[8, 8::16, 0] > 200).sum())  # red channel at each lamp's centre: high when lit
    assert lit == info["lit"]
