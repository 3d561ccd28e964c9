"""An example third-party package of relax-gym environments.

Installing it is all it takes: its ``pyproject.toml`` declares the entry point ``example-lamp-panel`` in the group
``relax_gym.envs``, so ``relax_gym.make("example-lamp-panel")`` finds the env without any import or register call.
"""

from relax_gym_example_env.lamp_panel import LampPanelEnv

__all__ = ["LampPanelEnv"]
