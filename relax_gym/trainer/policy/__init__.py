"""The policy model: an in-code tokenizer, a torchvision-free Qwen2.5-Omni processor and a (tiny or loaded)
Qwen2.5-Omni thinker. Conversations are turned into model inputs by ``relax_gym.omni.render``.

    from relax_gym.trainer.policy import PolicyConfig, build_policy
    from relax_gym.omni.render import render
    model, processor = build_policy(PolicyConfig())
    batch = processor.collate([render(obs, processor)], padding_side="left")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it, imported on first use: a submodule (routing, checkpoint_files, ...) is imported
# without the model (transformers' modelling code, ~2.5 s), which the env workers and advantages replicas never need
_HOME = {"PolicyConfig": "config", "build_policy": "model", "save_policy": "model", "MediaEncoding": "processor",
         "OmniProcessor": "processor", "build_tokenizer": "tokenizer"}

__all__ = sorted(_HOME)

if TYPE_CHECKING:
    from relax_gym.trainer.policy.config import PolicyConfig
    from relax_gym.trainer.policy.model import build_policy, save_policy
    from relax_gym.trainer.policy.processor import MediaEncoding, OmniProcessor
    from relax_gym.trainer.policy.tokenizer import build_tokenizer


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
