"""The ``actor:`` and ``critic:`` sections of a recipe (optimiser, batching, the megatron rank layout), and
:class:`ActorRecipe`: what :mod:`.factory` reads of a whole config. The actors own these; the config tree
(:mod:`relax_gym.trainer.config`) holds them, and its ``RelaxConfig`` is an ``ActorRecipe``."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.policy import PolicyConfig

__all__ = ["ActorRecipe", "ActorSection", "CriticSection", "LRSchedule", "ParallelSection"]

#: ``actor.lr_schedule``: how the RL phase's learning rate decays (relax_gym.trainer.run.lr_schedule)
LRSchedule = Literal["constant", "linear", "cosine"]

_FROZEN = ConfigDict(extra="forbid", frozen=True)


class ParallelSection(BaseModel):
    """How the megatron actor is sharded: one process per rank, world size ``tp * pp * dp`` (``cp`` must stay 1)."""

    model_config = _FROZEN

    tp: int = Field(default=1, ge=1)  # tensor parallel: each matrix split over tp ranks (vision/audio towers replicated)
    pp: int = Field(default=1, ge=1)  # pipeline parallel: decoder layers split into pp stages (towers on stage 0)
    dp: int = Field(default=1, ge=1)  # data parallel: each micro-batch split over dp ranks, gradients summed
    ep: int = Field(default=1, ge=1)  # expert parallel (qwen3_omni_moe): experts split over ep of the dp ranks
    cp: int = Field(default=1, ge=1)  # context parallel: refused (needs CUDA attention kernels; see runtime.py)
    # auto: world size 1 trains in this process, more ranks in a Ray rank group; ray: a rank group even for one rank
    launcher: Literal["auto", "ray"] = "auto"
    num_cpus_per_rank: float = Field(default=1.0, gt=0)  # Ray placement-group bundle per rank (never empty)
    num_gpus_per_rank: float = Field(default=0.0, ge=0)  # 1 on a GPU cluster (nccl); 0 on a CPU (gloo)

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @model_validator(mode="after")
    def _fits(self) -> ParallelSection:
        if self.cp != 1:
            raise ValueError(f"actor.parallel.cp={self.cp}: context parallel is not supported -- megatron-core splits "
                             "attention over cp ranks only with Transformer Engine's ring attention (CUDA), and this "
                             "backend runs megatron-core's local attention with an explicit mask")
        if (self.dp * self.cp) % self.ep:
            raise ValueError(f"actor.parallel.ep={self.ep} must divide actor.parallel.dp={self.dp}: experts are "
                             "split over the data-parallel ranks (Megatron's layout)")
        return self


class ActorSection(BaseModel):
    model_config = _FROZEN
    # hf: plain torch; megatron: megatron-core's GPTModel as the policy's language decoder (relax_gym/trainer/actors/megatron/actor.py)
    backend: Literal["hf", "megatron"] = "hf"
    parallel: ParallelSection = Field(default_factory=ParallelSection)  # megatron only: the rank layout
    lr: float = Field(default=2e-4, gt=0)
    lr_schedule: LRSchedule = "constant"  # RL phase: decay to min_lr_ratio * lr over the run (steps or time budget)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    # hold the peak lr until the mean training reward of the last lr_hold_window steps exceeds this, then decay over
    # what remains of the run (None: decay from the first step); see relax_gym/trainer/run/lr_schedule.py
    lr_hold_until_reward: float | None = None
    lr_hold_window: int = Field(default=50, ge=1)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=32, ge=1)
    epochs_per_step: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _parallel_sizes(self) -> ActorSection:
        p = self.parallel
        if self.backend != "megatron" and (p.world != 1 or p.ep != 1 or p.launcher != "auto"):
            raise ValueError(f"actor.parallel (tp={p.tp}, pp={p.pp}, dp={p.dp}, ep={p.ep}, launcher={p.launcher}) "
                             f"applies to actor.backend=megatron, not {self.backend!r}")
        return self


class CriticSection(BaseModel):
    """``algorithm.name: ppo``: the value model's optimiser and batching (relax_gym/trainer/actors/critic.py). Its
    architecture and starting weights are the warmed-up policy's; it trains in plain torch (hf) whatever
    ``actor.backend`` is, at a constant learning rate."""

    model_config = _FROZEN

    lr: float = Field(default=1e-4, gt=0)
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: float = Field(default=0.0, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    micro_batch_size: int = Field(default=32, ge=1)
    epochs: int = Field(default=1, ge=1)  # optimiser steps per RL step, each over the step's whole batch


class _Seeded(Protocol):
    @property
    def seed(self) -> int: ...


class ActorRecipe(Protocol):
    """The parts of a run's config that build an actor or a critic (``relax_gym.trainer.config.RelaxConfig``
    has them all): declared here so the actors never import the config tree above them."""

    @property
    def actor(self) -> ActorSection: ...

    @property
    def critic(self) -> CriticSection: ...

    @property
    def model(self) -> PolicyConfig: ...

    @property
    def algorithm(self) -> AlgorithmConfig: ...

    @property
    def trainer(self) -> _Seeded: ...
