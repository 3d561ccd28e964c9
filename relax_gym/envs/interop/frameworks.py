"""The foreign env frameworks relax-gym runs, each in a virtual environment of its own.

A framework is named by the scheme of an env id (``gem:game:GuessTheNumber-v0-easy``, ``skyrl-gym:gsm8k``): what
follows the first ``:`` is the framework's own id. Its package is pinned here, installed from the package index
into a venv made for it (:mod:`relax_gym.envs.interop.venvs`), and driven there by an adapter, an ``AgentEnv`` that
imports the framework (and only runs in that venv), served to the trainer over the env-server protocol. The
trainer's venv never imports a foreign framework, so their pins never meet ours.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownFrameworkError(KeyError):
    """An env id's scheme names no framework relax-gym knows."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Framework:
    scheme: str  # the env id's prefix before the first ':'
    title: str  # how its authors write its name
    requirements: tuple[str, ...]  # pip requirement lines of the framework's venv (pinned); () runs in-process
    module: str  # the package the adapter imports: a venv where it imports is the framework's
    adapter: str | None  # "module:Class", the AgentEnv that drives the framework's env inside its venv (None: not yet)
    id_help: str  # what the part after the scheme names, for errors and `envs show`


FRAMEWORKS: dict[str, Framework] = {
    fw.scheme: fw
    for fw in (
        Framework(
            scheme="gem",
            title="GEM",
            requirements=("gem-llm==0.1.0",),
            module="gem",
            adapter="relax_gym.envs.interop.gem_env:GemEnv",
            id_help="a GEM env id, as gem.make takes it (e.g. game:GuessTheNumber-v0-easy)",
        ),
        Framework(
            scheme="skyrl-gym",
            title="SkyRL-Gym",
            requirements=("skyrl-gym==0.4.0", "pyarrow"),  # pyarrow: SkyRL writes its datasets as parquet
            module="skyrl_gym",
            adapter="relax_gym.envs.interop.skyrl_env:SkyRLGymEnv",
            id_help="a skyrl-gym env class, as skyrl_gym.make takes it (e.g. gsm8k); its tasks come from data_file",
        ),
        Framework(
            scheme="verifiers",
            title="verifiers",
            # 0.3.1: the last release with the classic vf.Environment stack (0.4 keeps only verifiers.v1)
            requirements=("verifiers==0.3.1",),
            module="verifiers",
            adapter="relax_gym.envs.interop.verifiers_env:VerifiersEnv",
            id_help="an environment id as vf.load_environment takes it (its module, e.g. vf-gsm8k or my_env)",
        ),
        Framework(
            scheme="nemo-gym",
            title="NeMo-Gym",
            # not on the package index: its resources servers' HTTP protocol, spoken from this process
            requirements=(),
            module="httpx",
            adapter="relax_gym.envs.interop.nemo_gym_env:NemoGymEnv",
            id_help="a NeMo-Gym resources server's URL (http://HOST:PORT); its tasks come from data_file",
        ),
        Framework(
            scheme="openenv",
            title="OpenEnv",
            requirements=("openenv-core==0.3.0",),
            module="openenv",
            adapter="relax_gym.envs.interop.openenv_env:OpenEnvEnv",  # and ours served: `envs serve --protocol openenv`
            id_help="an OpenEnv server's URL (http://HOST:PORT)",
        ),
    )
}


def split_foreign_id(env_id: str) -> tuple[Framework, str] | None:
    """``(framework, its own id)`` for a foreign env id; None for an id of ours (no known scheme before a ``:``)."""
    scheme, sep, rest = env_id.partition(":")
    if not sep or scheme not in FRAMEWORKS:
        return None
    if FRAMEWORKS[scheme].adapter is None:
        raise ValueError(f"env id {env_id!r}: {FRAMEWORKS[scheme].title} envs cannot be made here yet; relax-gym envs serve "
                         f"to {FRAMEWORKS[scheme].title} clients (docs/interop.md)")
    if not rest:
        raise ValueError(f"env id {env_id!r}: {FRAMEWORKS[scheme].title} needs {FRAMEWORKS[scheme].id_help} after '{scheme}:'")
    return FRAMEWORKS[scheme], rest


def framework(scheme: str) -> Framework:
    try:
        return FRAMEWORKS[scheme]
    except KeyError:
        raise UnknownFrameworkError(f"no env framework {scheme!r}; known: {', '.join(sorted(FRAMEWORKS))}") from None
