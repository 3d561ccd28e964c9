"""GEM's own Guess The Number (``pip install gem-llm``, in the venv relax-gym made for it) as a relax-gym env: it
passes check_env, plays multi-turn episodes with GEM's per-step rewards, trains three colocate steps
(recipes/cpu-gem-guess.yaml, made small), and a GEM env
that raises, hangs or answers malformed output ends its episode with an ``env_error`` naming GEM, the env and the
call, never the run. The trainer's venv cannot import gem: every GEM call runs in the other venv's server."""

from __future__ import annotations

import importlib.util
import textwrap
import pytest

import relax_gym
from relax_gym.envs import check_env
from relax_gym.envs.remote import RemoteEnv

from .training import GEM_RECIPE, train_three_steps

GUESS = "gem:game:GuessTheNumber-v0-easy"  # 1..10 in at most 4 guesses


def test_guess_the_number_passes_check_env_and_plays_by_gems_rules(gem_python, servers):
    assert importlib.util.find_spec("gem") is None, "the trainer's venv must not have gem"
    env = relax_gym.make(GUESS)
    assert isinstance(env.unwrapped, RemoteEnv)
    report = check_env(env)
    assert "gold action => max reward" in report.passed and "garbage action => min reward, no exception" in report.passed
    assert env.unwrapped.reward_bounds == (-0.1, 1.0)  # GEM's format-error and success rewards

    obs, info = env.reset(seed=7)
    assert obs[0].text.startswith("You are playing Guess The Number.") and "between 1 and 10" in obs[0].text
    gold = info["gold"]
    secret = int(gold.removeprefix("\\boxed{").removesuffix("}"))
    wrong = 1 if secret != 1 else 2
    obs, reward, terminated, truncated, info = env.step(f"my guess: \\boxed{{{wrong}}}")
    hint = "lower" if wrong > secret else "higher"
    assert (reward, terminated, info["status"]) == (0.0, False, "ok")  # GEM's hint step pays nothing
    assert f"the target number is {hint} than {wrong}" in obs[0].text
    obs, reward, terminated, truncated, info = env.step(gold)
    assert (reward, terminated) == (1.0, True) and "Congratulations" in obs[0].text
    again, info2 = env.reset(seed=7)
    assert info2["gold"] == gold and again[0].text == env.reset(seed=7)[0][0].text  # the seed decides the game
    env.close()


def test_the_recipe_trains_three_colocate_steps(gem_python, servers, tmp_path):
    steps = train_three_steps(tmp_path, GEM_RECIPE)
    assert all(-0.1 * 4 <= r["reward_mean"] <= 1.0 for r in steps), steps  # four turns at most, GEM's rewards


# a GEM env of the test's own, registered in the GEM venv's process through a module on its path: each way of
# failing that a foreign env has
BROKEN = textwrap.dedent('''
    import time
    import gem
    from gem.core import Env
    from gem.envs.registration import register

    class Broken(Env):
        def __init__(self, how="raise"):
            super().__init__()
            self.how = how

        def reset(self, seed=None):
            super().reset(seed)
            return "Say anything.", {}

        def step(self, action):
            if self.how == "raise":
                raise KeyError("the board")
            if self.how == "hang":
                time.sleep(3600)
            if self.how == "shape":
                return "only", "two"
            return 42, 0.0, True, False, {}  # "obs": not text

    register("test:Broken-v0", entry_point=Broken)
''')


@pytest.mark.parametrize("how, says", [
    ("raise", "GEM test:Broken-v0: step raised KeyError: 'the board'"),
    ("hang", "GEM test:Broken-v0: step did not return within 1 s (call_timeout_s)"),
    ("shape", "GEM test:Broken-v0: step returned tuple, not (observation, reward, terminated, truncated, info)"),
    ("type", "GEM test:Broken-v0: step returned an observation of type int, not text"),
])
def test_a_failing_gem_env_ends_its_episode_as_an_env_error_naming_the_call(gem_python, servers, tmp_path, monkeypatch,
                                                                          how, says):
    (tmp_path / "broken_gem_env.py").write_text(BROKEN)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the server in the GEM venv imports the module from here
    env = relax_gym.make("gem:test:Broken-v0", env_kwargs={"how": how}, call_timeout_s=1,
                         imports=["broken_gem_env"])
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("anything")
    assert (info["status"], terminated, reward) == ("env_error", True, 0.0)  # the least of [0, 1]: not a game of GEM's
    assert says in info["error"], info["error"]
    obs, info = env.reset(seed=1)  # the env goes on (after a hang, with a new GEM env)
    assert obs[0].text == "Say anything."
    env.close()
