"""Environments: the AgentEnv contract, the registry, dataset loaders, rewards and the built-in envs.
Imports omni (and sandbox); never the trainer."""

from relax_gym.envs.check import CheckReport, EnvCheckError, check_env
from relax_gym.envs.core import AgentEnv, Opening, Outcome, Status
from relax_gym.envs.datasets import DatasetError
from relax_gym.envs.manifest import EnvManifest, ManifestError, load_manifest
from relax_gym.envs.registry import EnvSpec, UnknownEnvError, discover, discovery_errors, list_envs, make, register, spec
from relax_gym.envs.rubric import RULES, JudgeRequest, Rubric, RubricError, RubricPart, RubricScore, combine, register_rule
from relax_gym.envs.rubric_env import with_rubric

__all__ = [
    "RULES", "AgentEnv", "CheckReport", "DatasetError", "EnvCheckError", "EnvManifest", "EnvSpec", "JudgeRequest",
    "ManifestError", "Opening", "Outcome", "Rubric", "RubricError", "RubricPart", "RubricScore", "Status",
    "UnknownEnvError", "check_env", "combine", "discover", "discovery_errors", "list_envs", "load_manifest", "make",
    "register", "register_rule", "spec", "with_rubric",
]
