"""The base stage: what a run starts from before RL. ``model.base: tiny-omni`` names a base (spec.py); ``with_base``
builds it into the cache on first use (build.py) and hands back the policy config that loads it. The base learns
to caption synthetic media (corpus.py, relax_gym/envs/synth_captions.py) and never sees a QA question or answer."""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.base.spec import BASES, BaseSpec, describe_prompt

__all__ = ["BASES", "BaseSpec", "describe_prompt", "with_base"]


def with_base(policy: Any, progress: Any = None) -> Any:
    """``policy`` (a PolicyConfig) unchanged when it names no base; otherwise a copy whose ``path`` is the built base
    (and ``base`` None), building it first when the cache lacks it."""
    if policy.base is None:
        return policy
    from relax_gym.trainer.base.build import (
        ensure_base,  # torch, transformers and the media stack
    )

    info = ensure_base(policy.base, policy, progress=progress)
    return policy.model_copy(update={"path": str(info.path), "base": None})
