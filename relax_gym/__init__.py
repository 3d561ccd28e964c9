"""relax-gym: omni-modal agentic RL environments with an asynchronous RL trainer.

    import relax_gym
    env = relax_gym.make("nextqa-video")
    obs, info = env.reset(seed=0)

Importing the package loads no environment, no sandbox and reads no manifest: the registry's functions are
imported on first use (PEP 562), and the first ``make`` / ``list_envs`` / ``spec`` discovers the manifests and
entry points. ``gymnasium.make("relax/<id>")`` finds our ids once discovery has run (any of those calls, or
``relax_gym.discover()``).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it (imported when the name is first looked up)
_LAZY = {name: "relax_gym.envs.registry" for name in ("discover", "list_envs", "make", "register", "spec")}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
