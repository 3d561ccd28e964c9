"""Both trainers' second move: the recipe's ``env.id`` becomes the exact id of the env that runs
(``nextqa-video`` -> ``nextqa-video-v1``, its latest version), so the run's config.json, its records and its
summary name the version a result belongs to (docs/catalog.md). An id the registry here does not know (an env
only the env workers know, a served or foreign env) is left as written."""

from __future__ import annotations

from relax_gym.envs import UnknownEnvError
from relax_gym.envs.registry import resolve_id
from relax_gym.trainer.config import RelaxConfig

__all__ = ["resolve_env_id"]


def resolve_env_id(cfg: RelaxConfig) -> RelaxConfig:
    """``cfg`` with ``env.id`` exact (unchanged when it already is, or when the id is not in this registry)."""
    try:
        exact = resolve_id(cfg.env.id)
    except UnknownEnvError:
        return cfg
    if exact == cfg.env.id:
        return cfg
    return cfg.model_copy(update={"env": cfg.env.model_copy(update={"id": exact})})
