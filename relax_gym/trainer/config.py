"""The training config: one typed tree, loaded from a YAML recipe with dotted overrides.

    relax-gym train recipes/cpu-nextqa.yaml trainer.steps=50 algorithm.name=dapo

Sections: ``model`` (the policy), ``env`` (which env, its kwargs for training and for evaluation), ``algorithm``
(GRPO / DAPO / GSPO / PPO / SFT and their knobs), ``critic`` (PPO's value model: its optimiser), ``inference``
(engine and sampling), ``actor`` (optimiser), ``trainer`` (loop shape: steps, group sizes, evaluation, checkpoints,
``mode: colocate|async`` and ``max_staleness``), ``roles`` (the async engine's deployments: replicas and CPU share
per role, which data bus, recovery budgets), ``faults``
(what to break and when, :mod:`~relax_gym.trainer.faults.schedule`), ``metrics``. Every model forbids
unknown keys, so a typo is an error naming the key. Values that name parts not built are refused by the schema
rather than silently ignored. ``actor.backend: megatron`` trains the policy's language decoder as a megatron-core
GPTModel, sharded over ranks with ``actor.parallel`` (``tp``, ``pp``, ``dp``, ``ep``: one process per rank, a Ray
rank group; relax_gym/trainer/actors/megatron/group.py). ``inference.engine: sglang``
launches a real SGLang server per inference replica (``inference.sglang``: checkpoint, interpreter, TP size, port,
memory share, extra flags, weight sync).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.trainer.actors.settings import ActorSection, CriticSection
from relax_gym.trainer.algorithms import AlgorithmConfig
from relax_gym.trainer.base.spec import BASES
from relax_gym.trainer.config_loader import ConfigError, load_config
from relax_gym.trainer.engines.settings import InferenceSection, SGLangSection
from relax_gym.trainer.faults.schedule import FaultsSection
from relax_gym.trainer.policy import PolicyConfig

__all__ = ["ConfigError", "RelaxConfig", "load_recipe"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvSection(_Section):
    id: str = "nextqa-video"
    kwargs: dict[str, Any] = Field(default_factory=lambda: {"split": "train"})  # training episodes
    eval_kwargs: dict[str, Any] = Field(default_factory=lambda: {"split": "val"})  # held-out evaluation episodes


class JudgeSection(_Section):
    """``judge:`` the LLM judge that scores an env's judge rubric parts (relax_gym/trainer/rewards/judge.py): in
    colocate mode an engine in the trainer's process, in async mode the ``genrm`` role (``roles.genrm``)."""

    # a named judge (relax_gym/trainer/rewards/judge_model.py: built into the cache on first use) or a checkpoint dir
    model: str
    engine: Literal["embedded", "sglang"] = "embedded"
    sglang: SGLangSection = Field(default_factory=SGLangSection)  # engine: sglang (model_path: the judge checkpoint)
    max_new_tokens: int = Field(default=8, ge=1)  # a verdict is a label or a score: a few tokens
    # per judge call; a call past it fails the verdict (judge_error). In async mode a call may first wait up to
    # roles.replica_wait_s for a replaced genrm replica: that wait comes on top
    timeout_s: float = Field(default=60.0, gt=0)
    max_batch: int = Field(default=64, ge=1)  # judge requests per engine batch

    def inference(self) -> InferenceSection:
        """The judge engine's settings (it always answers greedily: its requests ask for temperature 0)."""
        return InferenceSection(engine=self.engine, sglang=self.sglang, max_new_tokens=self.max_new_tokens,
                                max_batch=self.max_batch)


class TrainerSection(_Section):
    mode: Literal["colocate", "async"] = "colocate"  # colocate: one process, synchronous; async: Ray Serve roles
    max_staleness: int = Field(default=0, ge=0)  # S: a rollout for step k starts only while k - v_trained <= S
    off_policy_tis_cap: float | None = Field(default=2.0, gt=1)  # async, S >= 1, algorithm.tis_cap unset: IS cap
    # async: "wait" trains step k on the groups launched for it (the slowest one included); "carry" trains it on the
    # first groups that finish, and a straggler joins a later step while within S (relax_gym/trainer/async_engine/carry.py)
    stragglers: Literal["wait", "carry"] = "wait"
    # the media tensors a group's rows share are stored once (async: on the data bus by content key, colocate: one
    # tensor object) instead of once per row (relax_gym/trainer/rollout/media.py); false: a copy per row
    dedupe_media: bool = True
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
    # what a demonstration's <think> holds: "empty" (<think></think>) or "describe": the policy's own greedy
    # description of the episode's media, asked with its base's describe instruction (model.base or a base checkpoint),
    # so the policy learns to say what it perceives before it answers (relax_gym/trainer/run/warmup.py)
    sft_think: Literal["empty", "describe"] = "empty"


class RoleSection(_Section):
    """One role of the async engine (a Ray Serve deployment)."""

    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=0.0, ge=0)  # Ray logical CPUs reserved per replica (0: a role that mostly waits)
    num_gpus: float = Field(default=0.0, ge=0)  # GPUs per replica: Ray places it on a node that has them
    torch_threads: int | None = Field(default=None, ge=1)  # torch intra-op threads per replica (None: torch's default)
    max_ongoing_requests: int = Field(default=1024, ge=1)  # concurrent handle calls one replica accepts


class RolesSection(_Section):
    """The async engine's topology (``trainer.mode: async``); ignored in colocate mode."""

    bus: Literal["transferqueue", "inprocess"] = "transferqueue"  # inprocess: one bus hosted in a Ray actor
    env_worker: RoleSection = Field(default_factory=RoleSection)
    inference: RoleSection = Field(default_factory=lambda: RoleSection(num_cpus=1.0, torch_threads=1))
    reference: RoleSection = Field(default_factory=lambda: RoleSection(torch_threads=1))  # deployed when kl_coef > 0
    critic: RoleSection = Field(default_factory=lambda: RoleSection(torch_threads=1))  # deployed when algorithm.name=ppo
    advantages: RoleSection = Field(default_factory=RoleSection)
    actor: RoleSection = Field(default_factory=lambda: RoleSection(num_cpus=1.0, torch_threads=1))
    genrm: RoleSection = Field(default_factory=lambda: RoleSection(torch_threads=1))  # deployed when judge: is set
    # recovery (docs/architecture.md, "Recovery"): Serve health-checks every replica this often and replaces a failed
    # one in place (level 1); a role replaced more than restart_budget times, or a dead actor, makes the controller
    # restart the whole topology from the last checkpoint (level 2), at most max_global_restarts times per run
    health_check_period_s: float = Field(default=10.0, gt=0)
    restart_budget: int = Field(default=3, ge=0)
    max_global_restarts: int = Field(default=2, ge=0)
    replica_wait_s: float = Field(default=120.0, gt=0)  # how long a call waits for a replaced replica to come back

    @model_validator(mode="after")
    def _one_actor(self) -> RolesSection:
        if self.actor.replicas != 1:
            raise ValueError(f"roles.actor.replicas must be 1: the actor (hf or megatron) trains in one process (got {self.actor.replicas})")
        return self


class MetricsSection(_Section):
    tensorboard: bool = True
    # rollout records for `relax-gym view` (relax_gym/trainer/run/rollout_records.py): each step's eval episodes and
    # its first rollouts_per_step train episodes, with their media stored once under RUN_DIR/media up to rollout_media_mb
    rollouts_per_step: int = Field(default=4, ge=0)
    rollout_media_mb: float = Field(default=256.0, ge=0)


class RelaxConfig(_Section):
    model: PolicyConfig = Field(default_factory=PolicyConfig)
    env: EnvSection = Field(default_factory=EnvSection)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    inference: InferenceSection = Field(default_factory=InferenceSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    roles: RolesSection = Field(default_factory=RolesSection)
    faults: FaultsSection = Field(default_factory=FaultsSection)
    critic: CriticSection = Field(default_factory=CriticSection)  # algorithm.name=ppo: the value model
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    judge: JudgeSection | None = None  # an LLM judge for envs whose rubrics have judge parts

    @model_validator(mode="after")
    def _consistent(self) -> RelaxConfig:
        if self.model.base is not None and self.model.base not in BASES:
            raise ValueError(f"model.base={self.model.base!r} is no known base; known: {', '.join(sorted(BASES))}")
        if self.algorithm.name not in ("sft", "ppo") and self.trainer.group_size < 2:  # ppo: the critic is the baseline
            raise ValueError("trainer.group_size must be >= 2 for group-normalised algorithms")
        if self.algorithm.temperature != self.inference.temperature:
            raise ValueError(
                f"algorithm.temperature ({self.algorithm.temperature}) must equal inference.temperature "
                f"({self.inference.temperature}): training log-probs must use the sampling distribution"
            )
        if self.trainer.mode == "colocate" and self.trainer.max_staleness != 0:
            raise ValueError(f"trainer.max_staleness={self.trainer.max_staleness} needs trainer.mode=async "
                             "(colocate is the synchronous baseline, S = 0)")
        if self.trainer.mode == "colocate" and self.trainer.stragglers != "wait":
            raise ValueError(f"trainer.stragglers={self.trainer.stragglers} needs trainer.mode=async (a colocate step "
                             "always waits for its whole rollout)")
        # actor.backend=megatron converts both families: qwen2_5_omni (dense) and qwen3_omni_moe (MoE layers,
        # actors/megatron/moe.py), so there is no family check here
        if self.algorithm.routing_replay and self.model.family != "qwen3_omni_moe":
            raise ValueError(f"algorithm.routing_replay needs a mixture-of-experts policy (model.family=qwen3_omni_moe), "
                             f"got model.family={self.model.family!r}")
        if self.inference.engine == "sglang" and self.inference.sglang.model_path is None and self.model.path is None:
            raise ValueError("inference.engine=sglang needs a checkpoint to serve: set inference.sglang.model_path or "
                             "model.path (SGLang cannot build the tiny random policy)")
        if (self.inference.engine == "sglang" and self.inference.sglang.port and self.trainer.mode == "async"
                and self.roles.inference.replicas > 1):
            raise ValueError(f"inference.sglang.port={self.inference.sglang.port} with roles.inference.replicas="
                             f"{self.roles.inference.replicas}: each replica launches its own server; use port 0 (a free one)")
        no_reference = self.trainer.mode == "async" and self.algorithm.kl_coef == 0
        if self.trainer.mode == "async" and not self.algorithm.needs_critic and any(
                f.kind == "kill" and f.role == "critic" for f in self.faults.inject):
            raise ValueError("faults.inject kills the critic role, which an async run deploys only when algorithm.name=ppo")
        if self.roles.critic.replicas != 1:
            raise ValueError(f"roles.critic.replicas must be 1: the critic trains in one process (got {self.roles.critic.replicas})")
        for i, fault in enumerate(self.faults.inject):
            if fault.kind == "kill" and fault.role == "reference" and no_reference:
                raise ValueError(f"faults.inject[{i}] kills the reference role, which an async run deploys only "
                                 "when algorithm.kl_coef > 0")
            if fault.kind == "kill" and fault.role == "genrm" and self.judge is None:
                raise ValueError(f"faults.inject[{i}] kills the genrm role, which a run deploys only with a judge: section")
            if fault.kind == "engine_error" and self.inference.engine != "embedded":
                raise ValueError(f"faults.inject[{i}] (engine_error) arms the embedded engine; inference.engine is "
                                 f"{self.inference.engine!r}")
        if self.judge is not None and self.judge.engine == "sglang":
            js = self.judge.sglang
            if js.model_path is not None and js.model_path != self.judge.model:
                raise ValueError(f"judge.sglang.model_path ({js.model_path}) must be judge.model ({self.judge.model}) or "
                                 "unset: the judge's prompts are rendered with judge.model's processor")
            if js.port and self.trainer.mode == "async" and self.roles.genrm.replicas > 1:
                raise ValueError(f"judge.sglang.port={js.port} with roles.genrm.replicas={self.roles.genrm.replicas}: each "
                                 "replica launches its own server; use port 0 (a free one)")
            if js.port and self.inference.engine == "sglang" and js.port == self.inference.sglang.port:
                raise ValueError(f"judge.sglang.port and inference.sglang.port are both {js.port}: two servers cannot "
                                 "share a port")
        if self.trainer.mode == "async" and self.algorithm.name == "sft":
            raise ValueError("trainer.mode=async runs RL algorithms; algorithm.name=sft has no rollouts to pipeline")
        return self


def load_recipe(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RelaxConfig:
    return load_config(path, overrides, RelaxConfig)
