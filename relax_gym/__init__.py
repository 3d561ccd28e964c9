"""relax-gym: omni-modal agentic RL environments with an asynchronous RL trainer.

    import relax_gym
    env = relax_gym.make("nextqa-video")
    obs, info = env.reset(seed=0)
"""

from relax_gym.envs.registry import discover as _discover
from relax_gym.envs.registry import list_envs, make, register, spec

__version__ = "0.1.0"
__all__ = ["list_envs", "make", "register", "spec", "__version__"]

# Fill gymnasium's registry so that gymnasium.make("relax/<id>") works right after `import relax_gym`.
_discover()
