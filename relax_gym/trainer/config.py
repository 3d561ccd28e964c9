"""The training config: one typed tree, loaded from a YAML recipe with dotted overrides.

    relax-gym train recipes/cpu-nextqa.yaml trainer.steps=50 algorithm.name=dapo

Sections: ``model`` (the policy), ``env`` (which env, its kwargs for training and for evaluation), ``algorithm``
(GRPO / DAPO / GSPO / SFT and their knobs), ``inference`` (engine and sampling), ``actor`` (optimiser), ``trainer``
(loop shape: steps, group sizes, evaluation, checkpoints), ``metrics``. Every model forbids unknown keys, so a typo
is an error naming the key. Values that name parts not built yet (``trainer.mode: async``, ``actor.backend:
megatron``, ``inference.engine: sglang``) are refused by the schema rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.config_loader import ConfigError, load_config
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
    max_batch: int = Field(default=64, ge=1)
    host: str = "127.0.0.1"  # the engine's HTTP server binds loopback unless told otherwise


class ActorSection(_Section):
    backend: Literal["hf"] = "hf"
    lr: float = Field(default=2e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=32, ge=1)
    epochs_per_step: int = Field(default=1, ge=1)


class TrainerSection(_Section):
    mode: Literal["colocate"] = "colocate"
    max_staleness: int = Field(default=0, ge=0, le=0)  # async modes come with the async engine
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


class MetricsSection(_Section):
    tensorboard: bool = True


class RelaxConfig(_Section):
    model: PolicyConfig = Field(default_factory=PolicyConfig)
    env: EnvSection = Field(default_factory=EnvSection)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    inference: InferenceSection = Field(default_factory=InferenceSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
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
        return self


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RelaxConfig:
    return load_config(path, overrides, RelaxConfig)
