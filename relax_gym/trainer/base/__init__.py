"""The base stage: what a run starts from before RL. ``model.base: tiny-omni`` names a base (spec.py); ``build.ensure_base``
builds it into the cache on first use and returns where it is (run/base_model.py turns that into ``model.path``). The base learns
to caption synthetic media (corpus.py, relax_gym/envs/synth_captions.py) and never sees a QA question or answer."""

from __future__ import annotations

from relax_gym.trainer.base.spec import BASES, BaseSpec, describe_prompt

__all__ = ["BASES", "BaseSpec", "describe_prompt"]
