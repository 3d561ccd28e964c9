"""The training config: one typed tree, loaded from a YAML recipe with dotted overrides.

    relax-gym train recipes/cpu-nextqa.yaml trainer.steps=50 algorithm.name=dapo

Sections: ``model`` (the policy), ``env`` (which env, its kwargs for training and for evaluation), ``algorithm``
(GRPO / DAPO / GSPO / SFT and their knobs), ``inference`` (engine and sampling), ``actor`` (optimiser), ``trainer``
(loop shape: steps, group sizes, evaluation, checkpoints, ``mode: colocate|async`` and ``max_staleness``), ``roles``
(the async engine's deployments: replicas and CPU share per role, which data bus), ``metrics``. Every model forbids
unknown keys, so a typo is an error naming the key. Values that name parts not built yet (``actor.backend:
megatron``, ``inference.engine: sglang``) are refused by the schema rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.config_loader import ConfigError, load_config
from relax_gym.trainer.lr_schedule import LRSchedule
from relax_gym.trainer.policy import PolicyConfig

__all__ = ["ConfigError", "RelaxConfig", "load_recipe"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvSection(_Section):
    id: str = "nextqa-video"
    kwargs: dict[str, Any] = Field(default_factory=lambda: {"split": "train"})  # training episodes
    eval_kwargs: dict[str, Any] = Field(default_factory=lambda: {"split": "val"})  # held-out evaluation episodes


class InferenceSection(_Section):
    engine: Literal["embedded"] = "embedded"
    max_new_tokens: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_batch: int = Field(default=128, ge=1)  # requests per engine batch (and per coalesced HTTP request)
    host: str = "127.0.0.1"  # the engine's HTTP server binds loopback unless told otherwise


class ActorSection(_Section):
    backend: Literal["hf"] = "hf"
    lr: float = Field(default=2e-4, gt=0)
    lr_schedule: LRSchedule = "constant"  # RL phase: decay to min_lr_ratio * lr over the run (steps or time budget)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=32, ge=1)
    epochs_per_step: int = Field(default=1, ge=1)


class TrainerSection(_Section):
    mode: Literal["colocate", "async"] = "colocate"  # colocate: one process, synchronous; async: Ray Serve roles
    max_staleness: int = Field(default=0, ge=0)  # S: a rollout for step k starts only while k - v_trained <= S
    off_policy_tis_cap: float | None = Field(default=2.0, gt=1)  # async, S >= 1, algorithm.tis_cap unset: IS cap
    steps: int = Field(default=150, ge=0)
    prompts_per_step: int = Field(default=16, ge=1)
    group_size: int = Field(default=8, ge=1)
    seed: int = 0
    concurrency: int = Field(default=64, ge=1)  # episodes in flight at once
    max_turns: int | None = Field(default=None, ge=1)  # None: the env's own limit
    eval_every: int = Field(default=10, ge=1)
    eval_episodes: int = Field(default=48, ge=1)
    checkpoint_every: int = Field(default=50, ge=1)
    time_budget_s: float | None = Field(default=None, gt=0)  # stop (after a final eval) when exceeded
    sft_warmup_steps: int = Field(default=60, ge=0)  # supervised steps on format demonstrations first
    sft_batch_size: int = Field(default=32, ge=1)
    sft_lr: float = Field(default=1e-3, gt=0)
    sft_random_answers: bool = True  # warm up the format only: demonstrations carry random letters


class RoleSection(_Section):
    """One role of the async engine (a Ray Serve deployment)."""

    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=0.0, ge=0)  # Ray logical CPUs reserved per replica (0: a role that mostly waits)
    torch_threads: int | None = Field(default=None, ge=1)  # torch intra-op threads per replica (None: torch's default)
    max_ongoing_requests: int = Field(default=1024, ge=1)  # concurrent handle calls one replica accepts


class RolesSection(_Section):
    """The async engine's topology (``trainer.mode: async``); ignored in colocate mode."""

    bus: Literal["transferqueue", "inprocess"] = "transferqueue"  # inprocess: one bus hosted in a Ray actor
    env_worker: RoleSection = Field(default_factory=RoleSection)
    inference: RoleSection = Field(default_factory=lambda: RoleSection(num_cpus=1.0, torch_threads=1))
    reference: RoleSection = Field(default_factory=lambda: RoleSection(torch_threads=1))  # deployed when kl_coef > 0
    advantages: RoleSection = Field(default_factory=RoleSection)
    actor: RoleSection = Field(default_factory=lambda: RoleSection(num_cpus=1.0, torch_threads=1))

    @model_validator(mode="after")
    def _one_actor(self) -> RolesSection:
        if self.actor.replicas != 1:
            raise ValueError(f"roles.actor.replicas must be 1: the hf actor trains in one process (got {self.actor.replicas})")
        return self


class MetricsSection(_Section):
    tensorboard: bool = True


class RelaxConfig(_Section):
    model: PolicyConfig = Field(default_factory=PolicyConfig)
    env: EnvSection = Field(default_factory=EnvSection)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    inference: InferenceSection = Field(default_factory=InferenceSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    roles: RolesSection = Field(default_factory=RolesSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)

    @model_validator(mode="after")
    def _consistent(self) -> RelaxConfig:
        if self.algorithm.name != "sft" and self.trainer.group_size < 2:
            raise ValueError("trainer.group_size must be >= 2 for group-normalised algorithms")
        if self.algorithm.temperature != self.inference.temperature:
            raise ValueError(
                f"algorithm.temperature ({self.algorithm.temperature}) must equal inference.temperature "
                f"({self.inference.temperature}): training log-probs must use the sampling distribution"
            )
        if self.trainer.mode == "colocate" and self.trainer.max_staleness != 0:
            raise ValueError(f"trainer.max_staleness={self.trainer.max_staleness} needs trainer.mode=async "
                             "(colocate is the synchronous baseline, S = 0)")
        if self.trainer.mode == "async" and self.algorithm.name == "sft":
            raise ValueError("trainer.mode=async runs RL algorithms; algorithm.name=sft has no rollouts to pipeline")
        return self


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RelaxConfig:
    return load_config(path, overrides, RelaxConfig)
