"""Trajectories as data-bus rows, and bus rows as the items the actor trains on. Plain helpers shared by the
roles (which never import one another).

One row per episode. The env worker writes the rollout columns (:data:`ROLLOUT_FIELDS`, and for an MoE policy
:data:`ROUTING_FIELD`: the episode's routed experts as one int16 ``(tokens, layers, k)`` tensor, moved by the bus as
a raw tensor buffer, never pickled); later roles add their
own columns to the same rows (``ref_logprobs`` by the reference role, ``advantages`` and ``keep`` by the
advantages role; under PPO ``values`` by the critic role, and ``advantages`` is then one float per next-token
position, written with ``returns``). A sample id names the step, the group and the member: ``"s000003-g0002-01"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from relax_gym.trainer.rollout.episode import MASKED_STATUSES, Trajectory
from relax_gym.trainer.policy.routing import ROUTING_DTYPE, empty_routing

__all__ = [
    "ROLLOUT_FIELDS", "ROUTING_FIELD", "TRAIN_FIELDS", "EpisodeSummary", "TrainItem", "masked_row", "masked_summary", "parse_version",
    "sample_id", "summary_dict", "summary_of", "as_list", "train_items", "trajectory_row",
]

# Written by the env worker for every episode (failed ones included, masked: loss_mask all 0, trainable False).
ROLLOUT_FIELDS = ("sample_id", "group_id", "seed", "tokens", "loss_mask", "rollout_logprobs", "mm_inputs", "reward",
                  "status", "trainable", "policy_version", "policy_versions")
# An MoE policy's rows also carry this column (written by the env worker, read by the actor).
ROUTING_FIELD = "routed_experts"
# What the actor reads per row (plus ``ref_logprobs`` when a reference role runs, ``routed_experts`` for MoE).
TRAIN_FIELDS = ("group_id", "tokens", "loss_mask", "rollout_logprobs", "mm_inputs", "status", "trainable",
                "policy_version", "policy_versions", "advantages", "keep")


def sample_id(step: int, group: int, member: int) -> str:
    return f"s{step:06d}-g{group:04d}-{member:02d}"


def parse_version(version: str | None) -> int | None:
    """The engine reports weight versions as strings; the trainer's are integers."""
    if version is None:
        return None
    try:
        return int(version)
    except (TypeError, ValueError):
        return None


def trajectory_row(traj: Trajectory, sid: str, versions: Sequence[int]) -> dict[str, Any]:
    """The bus row of one finished (or failed) episode. ``versions``: the policy version of each generated turn."""
    versions = [int(v) for v in versions]
    trainable = bool(traj.trainable)
    row = {
        "sample_id": sid,
        "group_id": int(traj.group_id),
        "seed": int(traj.seed),
        "tokens": [int(t) for t in traj.input_ids],
        "loss_mask": [int(m) for m in traj.loss_mask] if trainable else [0] * len(traj.input_ids),
        "rollout_logprobs": [float(x) for x in traj.rollout_logprobs],
        "mm_inputs": {k: v.detach().cpu() for k, v in traj.mm.items()},
        "reward": float(traj.reward),
        "status": str(traj.status),
        "trainable": trainable,
        "policy_version": min(versions) if versions else -1,
        "policy_versions": versions,
    }
    if traj.routed_experts is not None:
        row[ROUTING_FIELD] = traj.routed_experts.detach().cpu().to(ROUTING_DTYPE).contiguous()
    return row


@dataclass
class EpisodeSummary:
    """What the controller keeps of an episode (the heavy columns stay on the bus). ``reward_breakdown``: the env's
    reward components, whatever their names (``info["reward_breakdown"]``)."""

    sample_id: str
    group_id: int
    reward: float
    status: str
    trainable: bool
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    completion_tokens: int = 0
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0  # tool calls answered with an error (a bad call, or a tool that raised)
    tool_crashes: int = 0  # of which a tool raised: the env's bug, not the agent's
    error: str = ""
    policy_versions: list[int] = field(default_factory=list)
    agent_segments: int = 0  # agent-program episodes: token-continuous segments of the recorded calls (0: not one)
    agent_untrained_tokens: int = 0  # their completion tokens outside the trained (final) segment
    judge_calls: int = 0  # judge verdicts asked for this episode's pending rubric parts (trainer/rewards/judge.py)
    judge_failures: int = 0  # of which failed (timeout, engine error, malformed answer): the episode is a judge_error
    judge_agrees: int = -1  # 1/0: the judge's verdict matched the env's own rule verdict (-1: the env has none)
    judge_failure: str = ""  # why the judge failed this episode: timeout, engine_error or malformed ("" : it did not)
    # where its wall time went (rollout/episode.py EpisodeTiming): engine calls, env steps (tools), reset, in all
    generate_s: float = 0.0
    env_s: float = 0.0
    reset_s: float = 0.0
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in MASKED_STATUSES


def summary_of(traj: Trajectory, sid: str, versions: Sequence[int]) -> EpisodeSummary:
    return EpisodeSummary(
        sample_id=sid, group_id=int(traj.group_id), reward=float(traj.reward), status=str(traj.status),
        trainable=bool(traj.trainable), reward_breakdown={str(k): float(v) for k, v in traj.reward_breakdown.items()},
        completion_tokens=int(traj.completion_tokens),
        turns=int(traj.turns), tool_calls=int(traj.info.get("tool_calls", 0) or 0),
        tool_errors=int(traj.info.get("tool_errors", 0) or 0), tool_crashes=int(traj.info.get("tool_crashes", 0) or 0),
        error=traj.error,
        policy_versions=[int(v) for v in versions],
        agent_segments=int(traj.info.get("agent_segments", 0) or 0),
        agent_untrained_tokens=int(traj.info.get("agent_untrained_tokens", 0) or 0),
        judge_calls=int(traj.info.get("judge_calls", 0) or 0), judge_failures=int(traj.info.get("judge_failures", 0) or 0),
        judge_agrees=int(traj.info.get("judge_agrees", -1)),
        judge_failure=str(traj.info.get("judge_failure", "")),
        generate_s=float(sum(traj.timing.generate_s)), env_s=float(sum(traj.timing.env_s)),
        reset_s=float(traj.timing.reset_s), wall_s=float(traj.timing.wall_s),
    )


def summary_dict(traj: Trajectory, sid: str = "", versions: Sequence[int] = ()) -> dict[str, Any]:
    """:func:`summary_of` as a plain dict: what the env workers answer, and what the step row is built from."""
    return asdict(summary_of(traj, sid, versions))


def masked_summary(sid: str, group: int, error: str, partition: int | None = None) -> dict[str, Any]:
    """The summary of an episode that never ran (its env worker failed every attempt), as the controller keeps it."""
    return {**asdict(EpisodeSummary(sample_id=sid, group_id=int(group), reward=0.0, status="env_error", trainable=False,
                                    error=error)), "partition": partition}


@dataclass
class TrainItem:
    """One bus row in the shape the hf actor's collate and loss want (``input_ids``, ``loss_mask``, ``mm``,
    ``rollout_logprobs``), with its advantage and provenance."""

    sample_id: str
    group_id: int
    input_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    mm: dict[str, torch.Tensor]
    advantage: float
    keep: bool
    trainable: bool
    policy_versions: list[int]
    ref_logprobs: torch.Tensor | None = None
    routed_experts: torch.Tensor | None = None  # MoE: (positions, layers, k) int16 recorded at rollout
    token_advantages: torch.Tensor | None = None  # PPO: one advantage per next-token position (``advantage`` unused)

    @property
    def trained(self) -> bool:
        """Goes into the loss: a valid episode in a group the advantages role kept."""
        return self.trainable and self.keep and sum(self.loss_mask) > 0


def train_items(sample_ids: Sequence[str], fields: dict[str, list[Any]]) -> list[TrainItem]:
    """Bus columns (as fetched) → :class:`TrainItem` rows, in the fetched order. Values may come back as lists or
    as tensors (a bus may store sequences as tensors); both are accepted."""
    n = len(sample_ids)
    refs = fields.get("ref_logprobs") or [None] * n
    routed = fields.get(ROUTING_FIELD) or [None] * n
    return [
        TrainItem(
            sample_id=sample_ids[i], group_id=int(fields["group_id"][i]), input_ids=[int(x) for x in as_list(fields["tokens"][i])],
            loss_mask=[int(x) for x in as_list(fields["loss_mask"][i])],
            rollout_logprobs=[float(x) for x in as_list(fields["rollout_logprobs"][i])],
            mm=dict(fields["mm_inputs"][i] or {}), advantage=_scalar_advantage(fields["advantages"][i]),
            keep=bool(fields["keep"][i]), trainable=bool(fields["trainable"][i]),
            policy_versions=[int(v) for v in as_list(fields["policy_versions"][i])],
            ref_logprobs=_tensor(refs[i]), routed_experts=routed[i], token_advantages=_token_advantages(fields["advantages"][i]),
        )
        for i in range(n)
    ]


def as_list(value: Any) -> list[Any]:
    """A fetched sequence value (list, tuple or tensor) as a flat Python list."""
    if isinstance(value, torch.Tensor):
        return value.reshape(-1).tolist()
    return list(value) if value is not None else []


def _per_token(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, torch.Tensor) and value.dim() > 0)


def _scalar_advantage(value: Any) -> float:
    """A row's ``advantages`` value as one number (0.0 for a per-token row: see :func:`_token_advantages`)."""
    return 0.0 if _per_token(value) else float(value)


def _token_advantages(value: Any) -> torch.Tensor | None:
    """A per-token ``advantages`` row (PPO) as a float32 tensor; None for a per-item number."""
    return _tensor(value).reshape(-1) if _per_token(value) else None


def _tensor(value: Any) -> torch.Tensor | None:
    if value is None:
        return None
    return value.float() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)


def masked_row(sid: str, group: int, seed: int, routing: tuple[int, int] | None = None) -> dict[str, Any]:
    """The row of an episode that never ran (its env worker failed every attempt): no tokens, masked. ``routing``:
    ``(MoE layers, top_k)`` of an MoE policy, whose rows all carry the routing column (here empty)."""
    row = {"sample_id": sid, "group_id": int(group), "seed": int(seed), "tokens": [], "loss_mask": [],
           "rollout_logprobs": [], "mm_inputs": {}, "reward": 0.0, "status": "env_error", "trainable": False,
           "policy_version": -1, "policy_versions": []}
    if routing is not None:
        row[ROUTING_FIELD] = empty_routing(*routing)
    return row
