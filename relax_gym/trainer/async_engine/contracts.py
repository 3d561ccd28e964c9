"""What the async engine's roles answer the controller, and the bus rows as the trainer reads them: typed once.

The roles (:mod:`.roles`) and the planner's simulated roles (trainer/plan/sim_roles.py) answer these shapes; the
controller reads them. They stay plain dicts at run time (they cross Ray as they always did), typed as
``TypedDict``\\ s; :func:`mismatch` says how an answer differs from its contract (tests hold real and simulated
answers to it).

- :class:`ActorStepAnswer`: ``ActorRole.train_step`` (one RL step of the actor: versions, consumed samples,
  staleness, data wait, timings, the truncated-IS cap it used);
- :class:`WarmupAnswer`, :class:`CheckpointAnswer`: the actor's ``warmup`` and ``checkpoint``;
- :class:`AdvantagesAnswer`: ``AdvantagesRole.process`` (the step's group counts);
- :class:`StreamAnswer`: ``ReferenceRole.process`` and ``CriticRole.values`` (rows seen, rows forwarded);
- :data:`CriticStartAnswer`: ``CriticRole.start``; ``CriticRole.train`` answers its loss metrics (open-ended);
- :class:`EpisodeAnswer`: one episode of ``EnvWorkerRole.run_group`` / ``evaluate`` (an
  :class:`~relax_gym.trainer.rollout.samples.EpisodeSummary` as a dict, plus the partition it joined);
- :class:`RolloutRow` / :class:`TrainRow`: a bus row as the env worker writes it and as the actor reads it
  (:data:`~relax_gym.trainer.rollout.samples.ROLLOUT_FIELDS` / :data:`~relax_gym.trainer.rollout.samples.TRAIN_FIELDS`).

The inference and genrm roles answer SGLang's ``/generate`` protocol (``(status, body)``), which is not ours to
type here.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypedDict

from relax_gym.trainer.rollout.samples import EpisodeSummary

__all__ = ["ActorStepAnswer", "AdvantagesAnswer", "CheckpointAnswer", "CriticStartAnswer", "EpisodeAnswer",
           "RolloutRow", "StreamAnswer", "TrainRow", "WarmupAnswer", "contract_keys", "mismatch"]


class ActorStepAnswer(TypedDict):
    metrics: dict[str, float]  # the actor's loss metrics (the controller adds the critic's under PPO)
    version: int  # the weight version the engines serve after the step's push
    trained_version: int  # the version the step's gradients were taken at
    sample_ids: list[str]  # every sample the step consumed (acked), masked ones included
    episodes_trained: int  # samples forwarded
    partial_groups: int  # groups that arrived incomplete
    staleness_avg: float
    staleness_max: int
    rollout_version_min: int  # -1: no generated turn in the step
    rollout_version_max: int
    data_wait_s: float  # time the actor waited for micro-batches
    time_train_s: float
    time_sync_s: float  # the weight push
    actor_step_s: float  # the call's wall time
    tis_cap: float | None  # the truncated-IS cap the step used (None: no correction)


class WarmupAnswer(TypedDict):
    rows: list[dict[str, float]]  # the SFT warm-up's per-step metrics
    version: int


class CheckpointAnswer(TypedDict):
    path: str | None
    error: str | None  # a write that failed (disk full); the previous checkpoint stays the resume point


class AdvantagesAnswer(TypedDict):
    groups: int
    zero_adv_groups: int  # groups whose valid rewards are all equal
    valid_groups: int  # groups with a valid sample
    kept: int  # samples kept by the dynamic-sampling filter
    masked: int
    rows: int


class StreamAnswer(TypedDict):
    rows: int  # rows processed
    forwarded: int  # rows the model forwarded (trainable ones)


CriticStartAnswer = TypedDict("CriticStartAnswer", {"trained": int, "from": str})


class _Placed(TypedDict, total=False):
    partition: int | None  # run_group: the partition the episode's row went to (None: discarded as too stale)
    bus_bytes: int  # run_group, rows that went to the bus: the row's payload and the media it first references
    media_bytes_saved: int  # what that row would have carried inline, less that


EpisodeAnswer = TypedDict("EpisodeAnswer", {f.name: Any for f in fields(EpisodeSummary)}, total=True)  # type: ignore[misc]


class RolloutRow(TypedDict):
    sample_id: str
    group_id: int
    seed: int
    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    mm_inputs: Any
    reward: float
    status: str
    trainable: bool
    policy_version: int
    policy_versions: list[int]


class TrainRow(TypedDict):
    group_id: int
    tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    mm_inputs: Any
    status: str
    trainable: bool
    policy_version: int
    policy_versions: list[int]
    advantages: Any  # one float, or (PPO) one per next-token position
    keep: bool  # the dynamic-sampling filter's verdict


OPTIONAL_KEYS: dict[Any, frozenset[str]] = {
    EpisodeAnswer: frozenset(_Placed.__annotations__),
    TrainRow: frozenset({"ref_logprobs", "routed_experts"}),  # with a reference role / an MoE policy
    RolloutRow: frozenset({"routed_experts"}),
}


def contract_keys(contract: Any) -> frozenset[str]:
    """The keys every answer of ``contract`` holds."""
    return frozenset(contract.__annotations__)


def mismatch(contract: Any, answer: dict[str, Any]) -> list[str]:
    """How ``answer`` differs from ``contract``: its missing and its unknown keys (empty when it conforms)."""
    need, may = contract_keys(contract), OPTIONAL_KEYS.get(contract, frozenset())
    return ([f"missing {k!r}" for k in sorted(need - set(answer))]
            + [f"unknown {k!r}" for k in sorted(set(answer) - need - may)])
