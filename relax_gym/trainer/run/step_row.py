"""A step's metrics from its episodes, the eval row, and the summary's start / end fields — for both modes.

Episodes come as summaries (:func:`~relax_gym.trainer.rollout.samples.summary_dict`: ``reward``, ``status``,
``trainable``, ``reward_breakdown``, ``completion_tokens``, ``tool_calls``). Reward components are whatever the
env reports in ``info["reward_breakdown"]``: every key K is logged as ``K_mean`` in the step row and ``eval_K`` in
the eval row (the built-in envs report ``accuracy`` and ``format``: ``accuracy_mean``, ``eval_accuracy``, …).
Means are over the episodes that were not masked (:data:`~relax_gym.trainer.rollout.episode.MASKED_STATUSES`); an
episode without a component counts 0 for it (a truncated episode reports no breakdown at all). A trainer keeps the
components it has seen in the run (:class:`RewardComponents`), so a component stays in every later row, at 0.0 in a
batch where no episode reports it, and a run's metric keys do not depend on which episodes happened to finish.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from relax_gym.trainer.rollout.episode import MASKED_STATUSES

__all__ = [
    "EVAL_FIELDS",
    "RewardComponents",
    "bus_bytes",
    "component_means",
    "episodes_masked",
    "eval_components",
    "eval_row",
    "judge_metrics",
    "rollout_row",
    "summary_end",
    "summary_start",
    "timing_metrics",
    "tool_metrics",
    "warn_on_tool_crashes",
]

# The eval row's own fields; every other ``eval_*`` key is a reward component.
EVAL_FIELDS = frozenset({"eval_reward", "eval_failed", "eval_tool_calls", "eval_policy_version"})

Episode = Mapping[str, Any]

log = logging.getLogger(__name__)


def _ok(episodes: Sequence[Episode]) -> list[Episode]:
    return [e for e in episodes if e["status"] not in MASKED_STATUSES]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


class RewardComponents:
    """The reward components a run has seen so far (keys of its episodes' ``reward_breakdown``)."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def observe(self, episodes: Sequence[Episode]) -> list[str]:
        """Add the components of ``episodes``; every name seen so far, sorted."""
        self.names.update(k for e in episodes for k in (e.get("reward_breakdown") or {}))
        return sorted(self.names)


def component_means(episodes: Sequence[Episode], known: Sequence[str] = ()) -> dict[str, float]:
    """The mean of every reward component (a key of some episode's ``reward_breakdown``, or one of ``known``) over
    ``episodes``, by component name, sorted."""
    names = sorted({*known, *(k for e in episodes for k in (e.get("reward_breakdown") or {}))})
    return {k: _mean([float((e.get("reward_breakdown") or {}).get(k, 0.0)) for e in episodes]) for k in names}


def episodes_masked(episodes: Sequence[Episode]) -> int:
    """Episodes that are not trained on (failed, or nothing to learn from)."""
    return sum(1 for e in episodes if not e["trainable"])


def rollout_row(episodes: Sequence[Episode], rollout_s: float, known: Sequence[str] = ()) -> dict[str, Any]:
    """What a step's rollout adds to its metrics row: ``reward_mean``, ``K_mean`` per reward component (those of
    the episodes and the ``known`` ones), ``status_<status>`` counts and ``rollout_tokens_per_s``."""
    ok = _ok(episodes)
    completion = sum(int(e["completion_tokens"]) for e in episodes)
    row = {
        "reward_mean": _mean([float(e["reward"]) for e in ok]),
        **{f"{k}_mean": v for k, v in component_means(ok, known).items()},
        **{f"status_{s}": n for s, n in Counter(e["status"] for e in episodes).items()},
        "rollout_tokens_per_s": completion / max(rollout_s, 1e-9),
    }
    programs = [e for e in episodes if int(e.get("agent_segments", 0) or 0) > 0]
    if programs:  # agent-program episodes: how often agents broke token continuity (see rollout/program_episode.py)
        row["agent_segments_mean"] = _mean([float(e["agent_segments"]) for e in programs])
        row["agent_untrained_tokens"] = sum(int(e.get("agent_untrained_tokens", 0) or 0) for e in programs)
    row.update(judge_metrics(episodes))
    row.update(bus_bytes(episodes))
    row.update(tool_metrics(episodes))
    row.update(timing_metrics(episodes))
    return row


def timing_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Where the step's episodes spent their wall time (summaries' ``generate_s`` / ``env_s`` / ``reset_s`` /
    ``wall_s``, see :class:`~relax_gym.trainer.rollout.episode.EpisodeTiming`): ``time_episode_<part>_s``, the mean
    over the episodes that ran, and ``time_episode_wall_max_s`` (the straggler). Wall-clock figures, hence ``time_``
    like the step's other timings. Empty when no episode reports a wall time (an env worker that failed every
    attempt)."""
    timed = [e for e in episodes if float(e.get("wall_s", 0.0) or 0.0) > 0.0]
    if not timed:
        return {}
    row = {f"time_episode_{part}_s": _mean([float(e.get(f"{part}_s", 0.0) or 0.0) for e in timed])
           for part in ("generate", "env", "reset", "wall")}
    row["time_episode_wall_max_s"] = max(float(e["wall_s"]) for e in timed)
    return row


TOOL_CRASH_WARN_SHARE = 0.1  # warn when at least this share of a step's episodes met a tool that raised


def tool_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Tool envs: ``tool_calls`` and ``tool_errors`` (sums over the step's episodes) and ``tool_crash_episodes``,
    the episodes in which a tool raised (an env bug: the agent only saw an error). Empty when no episode called a
    tool."""
    if not any(int(e.get("tool_calls", 0) or 0) for e in episodes):
        return {}
    return {"tool_calls": sum(int(e.get("tool_calls", 0) or 0) for e in episodes),
            "tool_errors": sum(int(e.get("tool_errors", 0) or 0) for e in episodes),
            "tool_crash_episodes": sum(1 for e in episodes if int(e.get("tool_crashes", 0) or 0) > 0)}


def warn_on_tool_crashes(row: Mapping[str, Any], episodes: int, step: int) -> str | None:
    """Log (and return) a warning when a share of the step's episodes met a tool that raised: training then learns
    from error messages the env author never meant to send. ``relax-gym envs check`` / ``play`` show the traceback."""
    crashed = int(row.get("tool_crash_episodes", 0) or 0)
    if episodes <= 0 or crashed < TOOL_CRASH_WARN_SHARE * episodes or crashed == 0:
        return None
    message = (f"step {step}: a tool raised in {crashed} of {episodes} episodes (the agent saw only an error); "
               f"run `relax-gym envs play ENV` or `envs check ENV` to see the traceback")
    log.warning(message)
    return message


def bus_bytes(episodes: Sequence[Episode]) -> dict[str, int]:
    """Async mode: what the step's rows put on the data bus, ``bus_bytes_put`` (payload bytes, media stored once per
    group included), and ``bus_media_bytes_saved`` (the media bytes the rows would have carried inline beyond
    that; 0 with ``trainer.dedupe_media: false``). Summed from the env workers' per-row figures; empty in colocate
    mode, whose episodes go on no bus."""
    put = [e for e in episodes if "bus_bytes" in e]
    if not put:
        return {}
    return {"bus_bytes_put": sum(int(e["bus_bytes"]) for e in put),
            "bus_media_bytes_saved": sum(int(e.get("media_bytes_saved", 0)) for e in put)}


def judge_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Episodes whose rubric had judge parts: ``judge_calls`` and ``judge_failures`` (sums), ``judge_failed_<why>``
    per kind of failure (``timeout``, ``engine_error``, ``malformed``) and, where the env
    reports its own rule verdict, ``judge_rule_agreement`` (the share of verdicts that matched it). Empty when no
    episode was judged."""
    judged = [e for e in episodes if int(e.get("judge_calls", 0) or 0) or int(e.get("judge_failures", 0) or 0)]
    if not judged:
        return {}
    row: dict[str, float] = {"judge_calls": sum(int(e.get("judge_calls", 0) or 0) for e in judged),
                             "judge_failures": sum(int(e.get("judge_failures", 0) or 0) for e in judged)}
    for why, n in Counter(str(e.get("judge_failure") or "") for e in judged).items():
        if why:  # judge_failed_timeout / _engine_error / _malformed: the judge's service vs the judge's model
            row[f"judge_failed_{why}"] = n
    agreed = [int(e["judge_agrees"]) for e in judged if int(e.get("judge_agrees", -1)) >= 0]
    if agreed:
        row["judge_rule_agreement"] = _mean([float(a) for a in agreed])
    return row


def eval_row(episodes: Sequence[Episode], known: Sequence[str] = ()) -> dict[str, Any]:
    """The eval metrics of greedy episodes: ``eval_reward``, ``eval_K`` per reward component (those of the
    episodes and the ``known`` ones), ``eval_failed``, ``eval_tool_calls``."""
    ok = _ok(episodes)
    return {
        "eval_reward": _mean([float(e["reward"]) for e in ok]),
        **{f"eval_{k}": v for k, v in component_means(ok, known).items() if f"eval_{k}" not in EVAL_FIELDS},
        "eval_failed": len(episodes) - len(ok),
        "eval_tool_calls": _mean([float(e.get("tool_calls", 0) or 0) for e in ok]),
    }


def eval_components(row: Mapping[str, Any]) -> list[str]:
    """The ``eval_*`` keys of an eval row that summarise: the reward and its components."""
    return ["eval_reward", *sorted(k for k in row if k.startswith("eval_") and k not in EVAL_FIELDS)]


def summary_start(first_eval: Mapping[str, Any]) -> dict[str, float]:
    """``eval_reward_start`` and ``eval_K_start`` (e.g. ``eval_accuracy_start``) from the run's first eval."""
    return {f"{k}_start": first_eval[k] for k in eval_components(first_eval)}


def summary_end(last_eval: Mapping[str, Any], first_eval: Mapping[str, Any] | None = None) -> dict[str, float]:
    """``eval_reward_end`` and ``eval_K_end`` from the run's last eval, for every component of the last and the
    first eval (0.0 for one the last eval did not report), so that each ``_start`` field has its ``_end``."""
    names = sorted({*eval_components(last_eval), *(eval_components(first_eval) if first_eval is not None else ())})
    return {f"{k}_end": float(last_eval.get(k, 0.0)) for k in names}
