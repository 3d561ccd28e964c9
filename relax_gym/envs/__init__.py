"""Environments: the AgentEnv contract, the registry, dataset loaders, rewards and the built-in envs.
Imports omni (and sandbox); never the trainer."""

from relax_gym.envs.check import CheckReport, EnvCheckError, check_env
from relax_gym.envs.core import AgentEnv, Opening, Outcome, Status
from relax_gym.envs.datasets import DatasetError
from relax_gym.envs.manifest import EnvManifest, ManifestError, load_manifest
from relax_gym.envs.registry import EnvSpec, UnknownEnvError, discover, discovery_errors, list_envs, make, register, spec

__all__ = [
    "AgentEnv", "CheckReport", "DatasetError", "EnvCheckError", "EnvManifest", "EnvSpec", "ManifestError", "Opening",
    "Outcome", "Status", "UnknownEnvError", "check_env", "discover", "discovery_errors", "list_envs", "load_manifest",
    "make", "register", "spec",
]
