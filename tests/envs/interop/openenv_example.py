"""The example env of OpenEnv's docs (an ``Environment`` with typed Action / Observation / State): say a secret
word back. Its sources, as text for the OpenEnv venv: one script with an ad-hoc server
(tests/envs/interop/test_openenv_env.py) and ``openenv init``'s layout in an image (openenv_image_build.py).

Besides the word, three actions show the server's side of things: ``break the board`` raises in ``step``,
``show the interfaces`` answers the network interfaces the server sees, ``eat N`` takes N MiB and holds it."""

MODELS = '''
from openenv.core.env_server.types import Action, Observation, State


class SecretWordAction(Action):
    message: str


class SecretWordObservation(Observation):
    prompt: str = ""


class SecretWordState(State):
    secret: str = ""
'''

# how the generated server/NAME_environment.py imports the models (in the package, or from /app/env as a path)
IMPORT_MODELS = '''
try:
    from ..models import SecretWordAction, SecretWordObservation, SecretWordState
except ImportError:
    from models import SecretWordAction, SecretWordObservation, SecretWordState
'''

ENVIRONMENT = '''
import os
import random

from openenv.core.env_server.interfaces import Environment

WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "glade", "heron"]


class SecretWordEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = SecretWordState(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        secret = random.Random(seed).choice(WORDS)
        self._state = SecretWordState(episode_id=episode_id, step_count=0, secret=secret)
        return SecretWordObservation(prompt=f"Say the word {secret} back, and nothing else.", done=False, reward=None)

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        if action.message == "break the board":
            raise RuntimeError("the board broke")
        if action.message == "show the interfaces":  # what the sandbox's network is, seen from inside
            names = sorted(os.listdir("/sys/class/net"))
            return SecretWordObservation(prompt=" ".join(names), done=True, reward=0.0)
        if action.message.startswith("eat "):  # takes N MiB and holds it: the memory limit, seen from inside
            hold = bytearray(int(action.message.split()[1]) << 20)
            for i in range(0, len(hold), 4096):
                hold[i] = 1
            return SecretWordObservation(prompt=f"ate {len(hold) >> 20}", done=True, reward=0.0)
        right = action.message.strip().lower() == self._state.secret
        return SecretWordObservation(prompt="Right." if right else "Wrong.", done=True, reward=1.0 if right else 0.0)

    @property
    def state(self):
        return self._state
'''
