"""Cost models of the planner: how long each simulated call takes, as typed, seeded figures.

    costs = Costs.from_yaml("plan.yaml")          # or Costs(episode=..., generation=..., ...)
    rng = episode_rng(seed=0, step=3, prompt=1, member=0)
    episode = costs.episode.draw(rng)             # turns (tokens), tool waits, reset time: one episode's shape

Every random figure is a :class:`Dist` (fixed, lognormal, pareto, or an empirical sample, clipped to [min, max]),
drawn from a ``random.Random`` keyed by the episode's own identity (seed, launch step, prompt, member), never by
the order in which the simulation asks: the same episode has the same shape in every mode and every sweep point
(common random numbers), and a schedule is reproducible bit for bit.

The figures, and the one formula behind each (all documented on the fields):

- **episode** (:class:`EpisodeCost`): model turns per episode, tokens generated per turn (a long tail, capped at
  ``max_new_tokens``), prompt tokens, tokens a tool result adds, the wait of a tool call between two turns, the
  env's reset (media decode, sandbox lease); or measured episodes (``empirical``) resampled whole; the share of
  groups whose rewards are all equal (GRPO gives them no gradient: the actor skips their forward pass).
- **generation** (:class:`GenerationCost`): a replica decodes its ``n`` running sequences together at
  ``peak_tokens_per_s * n / (n + half_batch)`` tokens/s in all (continuous batching: each sequence gets an equal
  share), at most ``max_batch`` at once (the rest queue); a prompt token costs ``prefill_cost`` decode tokens.
- **train** (:class:`TrainCost`): the actor's forward + backward time per trained token and per micro-batch, the
  optimiser step, the reference role's forward per token; measured on ``gpus`` GPUs, scaled to the actor's
  count by ``(gpus / actor_gpus) ** scaling``.
- **sync** (:class:`SyncCost`): a weight push takes ``push_s + weight_bytes / bandwidth_bytes_per_s``; the engines
  stop for its last ``pause_s`` (the whole push when unset: pause, load, flush, continue); colocate adds the
  engines' sleep / wake per step.
- **cluster** (:class:`Cluster`): how many replicas and actor GPUs each mode gets.

``notes`` records where each figure came from (``relax-gym plan calibrate`` fills it: fitted, given by the run's
config, assumed, or missing).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["Cluster", "Costs", "Dist", "EpisodeCost", "EpisodeDraw", "GenerationCost", "SyncCost", "TrainCost",
           "TurnDraw", "episode_rng", "group_rng"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dist(_Model):
    """A non-negative random figure. ``fixed``: ``value``; ``lognormal``: ``value * exp(sigma * N(0, 1))`` (``value``
    is the median); ``pareto``: ``scale * (1 + Lomax(alpha))`` (a smaller ``alpha`` is a heavier tail);
    ``empirical``: one of ``samples``, uniformly. Every draw is clipped to [``min``, ``max``]."""

    kind: Literal["fixed", "lognormal", "pareto", "empirical"] = "fixed"
    value: float = Field(default=0.0, ge=0)
    sigma: float = Field(default=0.0, ge=0)
    scale: float = Field(default=0.0, ge=0)
    alpha: float = Field(default=1.5, gt=0)
    samples: tuple[float, ...] = ()
    min: float = Field(default=0.0, ge=0)
    max: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Dist:
        if self.kind == "empirical" and not self.samples:
            raise ValueError("an empirical Dist needs samples")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"Dist max {self.max} is below its min {self.min}")
        return self

    @classmethod
    def fixed(cls, value: float) -> Dist:
        return cls(kind="fixed", value=value)

    @classmethod
    def lognormal(cls, median: float, sigma: float, max: float | None = None) -> Dist:
        return cls(kind="lognormal", value=median, sigma=sigma, max=max)

    @classmethod
    def from_tool_latency(cls, spec: dict[str, Any]) -> Dist:
        """The planner's form of an env's ``tool_latency`` (:class:`~relax_gym.envs.latency.ToolLatency`)."""
        kind = spec.get("dist", "lognormal")
        return cls(kind=kind, value=float(spec.get("median_s", 0.5)), sigma=float(spec.get("sigma", 1.0)),
                   scale=float(spec.get("scale_s", 0.5)), alpha=float(spec.get("alpha", 1.5)),
                   max=float(spec.get("max_s", 30.0)))

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            x = self.value
        elif self.kind == "lognormal":
            x = self.value * math.exp(self.sigma * rng.normalvariate(0.0, 1.0))
        elif self.kind == "pareto":
            x = self.scale * rng.paretovariate(self.alpha)
        else:
            x = self.samples[rng.randrange(len(self.samples))]
        x = max(x, self.min)
        return float(min(x, self.max) if self.max is not None else x)

    def mean(self, n: int = 20_000) -> float:
        """The mean of a draw, clipping included (exact for fixed and empirical, else from ``n`` seeded draws)."""
        if self.kind == "fixed":
            return float(min(max(self.value, self.min), self.max if self.max is not None else math.inf))
        rng = random.Random(0)
        return sum(self.draw(rng) for _ in range(n)) / n


@dataclass(frozen=True)
class TurnDraw:
    """One model turn: ``prompt_tokens`` new to the engine (the first prompt, or a tool result), ``completion_tokens``
    generated, then the wait of its tool calls, ``tool_s`` (0 when it makes none)."""

    prompt_tokens: int
    completion_tokens: int
    tool_s: float


@dataclass(frozen=True)
class EpisodeDraw:
    reset_s: float
    turns: tuple[TurnDraw, ...]

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    @property
    def tokens(self) -> int:
        """What the actor trains on: the whole conversation (every prompt and completion token)."""
        return sum(t.prompt_tokens + t.completion_tokens for t in self.turns)


class EpisodeCost(_Model):
    """One episode's shape (see the module docstring)."""

    turns: Dist = Dist.fixed(1)  # model turns per episode (rounded, at least 1)
    completion_tokens: Dist = Dist.fixed(256)  # tokens generated per turn
    prompt_tokens: Dist = Dist.fixed(256)  # the first prompt
    observation_tokens: Dist = Dist.fixed(0)  # what a tool result adds to the context, per turn after the first
    tool_s: Dist = Dist.fixed(0)  # a tool call's wait between two turns (sandbox, API)
    reset_s: Dist = Dist.fixed(0)  # the env's reset before the first turn (media decode, sandbox lease)
    max_new_tokens: int | None = Field(default=None, ge=1)  # a turn's generation cap
    # measured episodes (turns, completion tokens in all, other tokens in all[, tool calls]): resampled whole instead
    # of turns / completion_tokens / prompt_tokens (a run's rollout records). Completion tokens are split evenly over
    # the turns, the other tokens (prompt and tool results) all go to the first turn's prefill, and the tool calls
    # (default: one between each two turns) wait one ``tool_s`` draw each, spread over the turns from the first
    empirical: tuple[tuple[int, ...], ...] = ()
    zero_adv_group_share: float = Field(default=0.0, ge=0, le=1)  # groups whose rewards are all equal

    @model_validator(mode="after")
    def _check(self) -> EpisodeCost:
        bad = [e for e in self.empirical if len(e) not in (3, 4)]
        if bad:
            raise ValueError(f"an empirical episode is (turns, completion, other tokens[, tool calls]), got {bad[0]}")
        return self

    def draw(self, rng: random.Random) -> EpisodeDraw:
        reset = self.reset_s.draw(rng)
        if self.empirical:
            e = self.empirical[rng.randrange(len(self.empirical))]
            n, completion, prompt = max(1, int(e[0])), int(e[1]), int(e[2])
            calls = int(e[3]) if len(e) > 3 else n - 1
            per = [completion // n + (1 if i < completion % n else 0) for i in range(n)]
            observed = False
        else:
            n = max(1, round(self.turns.draw(rng)))
            per = [round(self.completion_tokens.draw(rng)) for _ in range(n)]
            prompt = round(self.prompt_tokens.draw(rng))
            calls, observed = n - 1, True
        if self.max_new_tokens is not None:
            per = [min(c, self.max_new_tokens) for c in per]
        turns = []
        for i, c in enumerate(per):
            new = prompt if i == 0 else (round(self.observation_tokens.draw(rng)) if observed else 0)
            k = calls // n + (1 if i < calls % n else 0)  # tool calls after this turn
            turns.append(TurnDraw(new, max(1, c), sum(self.tool_s.draw(rng) for _ in range(k))))
        return EpisodeDraw(reset, tuple(turns))


class GenerationCost(_Model):
    """One inference replica (see the module docstring for the batch-size curve)."""

    peak_tokens_per_s: float = Field(default=2000.0, gt=0)  # decode throughput of a saturated batch, all sequences
    half_batch: float = Field(default=16.0, ge=0)  # running sequences at which the replica makes half its peak
    max_batch: int = Field(default=256, ge=1)  # sequences decoded at once; the rest wait in the replica's queue
    prefill_cost: float = Field(default=0.0, ge=0)  # a prompt token's cost in decode tokens
    gpus_per_replica: int = Field(default=1, ge=1)

    def throughput(self, running: int) -> float:
        """The replica's tokens/s in all with ``running`` sequences decoding."""
        return self.peak_tokens_per_s * running / (running + self.half_batch) if running > 0 else 0.0


class TrainCost(_Model):
    s_per_token: float = Field(default=1e-4, ge=0)  # actor forward + backward per trained token, on ``gpus`` GPUs
    s_per_micro_batch: float = Field(default=0.0, ge=0)  # fixed cost of a micro-batch that forwards anything
    step_overhead_s: float = Field(default=0.0, ge=0)  # the optimiser step and the end of a step's stream
    ref_s_per_token: float = Field(default=0.0, ge=0)  # the reference role's forward (0: no KL term, no such role)
    micro_batch_size: int = Field(default=32, ge=1)  # rows (whole groups are fetched: rounded down to groups)
    gpus: int = Field(default=1, ge=1)  # the actor GPUs these figures are for
    scaling: float = Field(default=1.0, ge=0)  # time ∝ (gpus / actor_gpus) ** scaling (1: linear, 0: none)

    def factor(self, actor_gpus: int) -> float:
        """Time multiplier on ``actor_gpus`` GPUs relative to the measured ``gpus``."""
        return (self.gpus / max(actor_gpus, 1)) ** self.scaling


class SyncCost(_Model):
    push_s: float = Field(default=0.0, ge=0)  # fixed part of one weight push (pause, flush, commit)
    weight_bytes: float = Field(default=0.0, ge=0)  # bytes pushed (bf16: 2 per parameter)
    bandwidth_bytes_per_s: float = Field(default=1e10, gt=0)
    # how long the engines stop decoding per push, at its end (None: the whole push, as SGLang's unstaged update;
    # an engine that stages the buckets while it generates stops only to apply them, ~0.01 s for the embedded one)
    pause_s: float | None = Field(default=None, ge=0)
    sleep_wake_s: float = Field(default=0.0, ge=0)  # colocate: engines sleep + actor wakes, and back, per step
    colocate_push_s: float | None = Field(default=None, ge=0)  # colocate's in-place reload (None: as a push)

    def push_seconds(self) -> float:
        return self.push_s + self.weight_bytes / self.bandwidth_bytes_per_s

    def pause_seconds(self) -> float:
        total = self.push_seconds()
        return total if self.pause_s is None else min(self.pause_s, total)

    def colocate_seconds(self) -> float:
        return self.colocate_push_s if self.colocate_push_s is not None else self.push_seconds()


class Cluster(_Model):
    """GPUs and how each mode uses them. Async: ``replicas`` inference replicas and the actor on the rest (or
    ``actor_gpus``). Colocate: every GPU serves the rollout (``gpus // gpus_per_replica`` replicas, or
    ``colocate_replicas``), then every GPU trains (or ``colocate_actor_gpus``)."""

    gpus: int = Field(default=1, ge=1)
    replicas: int = Field(default=1, ge=1)
    actor_gpus: int | None = Field(default=None, ge=1)
    colocate_replicas: int | None = Field(default=None, ge=1)
    colocate_actor_gpus: int | None = Field(default=None, ge=1)
    episode_slots: int | None = Field(default=None, ge=1)  # episodes in play at once (None: the trainer's pools)

    def split(self, mode: str, gpus_per_replica: int) -> tuple[int, int]:
        """(inference replicas, actor GPUs) in ``mode``."""
        if mode == "colocate":
            return (self.colocate_replicas or max(1, self.gpus // gpus_per_replica), self.colocate_actor_gpus or self.gpus)
        actor = self.actor_gpus if self.actor_gpus is not None else self.gpus - self.replicas * gpus_per_replica
        if actor < 1:
            raise ValueError(f"{self.replicas} replicas of {gpus_per_replica} GPU(s) leave no GPU of {self.gpus} to the "
                             f"actor")
        return self.replicas, actor


class Costs(_Model):
    episode: EpisodeCost = Field(default_factory=EpisodeCost)
    generation: GenerationCost = Field(default_factory=GenerationCost)
    train: TrainCost = Field(default_factory=TrainCost)
    sync: SyncCost = Field(default_factory=SyncCost)
    cluster: Cluster = Field(default_factory=Cluster)
    notes: dict[str, str] = Field(default_factory=dict)  # figure -> where it came from

    @classmethod
    def from_yaml(cls, path: str | Path) -> Costs:
        return cls.model_validate(yaml.safe_load(Path(path).read_text()) or {})

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.model_dump(mode="json", exclude_defaults=True), sort_keys=False,
                                             default_flow_style=None, width=120))

    def with_updates(self, **parts: dict[str, Any]) -> Costs:
        """A copy with some fields of some parts replaced: ``costs.with_updates(cluster={"replicas": 4})``."""
        return self.model_validate({**self.model_dump(), **{name: {**getattr(self, name).model_dump(), **fields}
                                                            for name, fields in parts.items()}})


def episode_rng(seed: int, step: int, prompt: int, member: int) -> random.Random:
    """The draws of one episode: sample ``member`` of prompt ``prompt`` launched for step ``step`` (from 1). A string
    seed is hashed with SHA-512: the same on every platform and run, whatever ``PYTHONHASHSEED``."""
    return random.Random(f"episode:{seed}:{step}:{prompt}:{member}")


def group_rng(seed: int, step: int, prompt: int) -> random.Random:
    """The draws of one prompt group (its rewards)."""
    return random.Random(f"group:{seed}:{step}:{prompt}")
