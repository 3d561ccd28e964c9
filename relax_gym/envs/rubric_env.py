"""Putting a manifest's rubric (``[[reward.parts]]``) on any env, code envs included.

A manifest with a rubric registers :func:`make_with_rubric` as gymnasium's entry point, with the env's own entry
point and the rubric in its kwargs. It builds the env as usual and hands it the rubric
(:meth:`~relax_gym.envs.core.AgentEnv.use_rubric`), so the env *itself* scores its terminal steps with it: the
rubric holds through ``env.unwrapped`` (``check_env``, the env server, the trainer's warm-up), which a gymnasium
wrapper would not. In Python, :func:`with_rubric` does the same to an env you made.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from gymnasium.envs.registration import load_env_creator

from relax_gym.envs.core import AgentEnv
from relax_gym.envs.rubric import Rubric, RubricError, resolve_rule


def with_rubric(env: gymnasium.Env, rubric: Rubric | dict[str, Any], *, source: str = "") -> gymnasium.Env:
    """Score ``env``'s terminal steps with ``rubric`` from now on; returns ``env``. Rules given as
    ``"module:function"`` are imported here, so a bad one fails now rather than at the first answer."""
    base = env.unwrapped
    where = source or type(base).__name__
    if not isinstance(base, AgentEnv):
        raise RubricError(f"{where}: a rubric needs a relax_gym AgentEnv, not {type(base).__name__}")
    if getattr(base, "agent_program", False):
        raise RubricError(f"{where}: a rubric cannot score an agent-program env (its trainer path, run_program, "
                          "scores the program's output itself)")
    rubric = rubric if isinstance(rubric, Rubric) else Rubric.model_validate(rubric)
    for part in rubric.parts:
        if part.kind == "rule":
            try:
                resolve_rule(part.rule or "")
            except RubricError as exc:
                raise RubricError(f"{where} [reward]: part {part.name!r}: {exc}") from None
    base.use_rubric(rubric, source=source)
    return env


def make_with_rubric(*, relax_env: str, relax_rubric: dict[str, Any], relax_rubric_source: str = "", **kwargs: Any) -> gymnasium.Env:
    """gymnasium's entry point for a manifest with a rubric: ``relax_env`` (``module:Class``) built with ``kwargs``,
    scored by ``relax_rubric``."""
    env = load_env_creator(relax_env)(**kwargs)
    try:
        return with_rubric(env, relax_rubric, source=relax_rubric_source)
    except Exception:
        env.close()
        raise
