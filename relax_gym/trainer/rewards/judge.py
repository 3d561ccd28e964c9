"""The judge: scores the rubric parts an env leaves pending (``info["judge_requests"]``) with a language model —
the GenRM role's core, the same code in both modes.

A :class:`Judge` speaks SGLang's ``/generate`` through any engine client: in colocate mode a coalescing client on
an engine in the trainer's process, in async mode a deployment-handle client on the ``genrm`` role's replicas
(relax_gym/trainer/async_engine/roles/genrm.py). Each request is the rubric part's rendered prompt as one user
turn (:func:`~relax_gym.trainer.rewards.judge_prompt.judge_messages`), answered greedily; the answer is read as a
label or a score (:mod:`~relax_gym.envs.verdict`). Calls are made per episode as soon as it ends, so
judging overlaps the generation of the step's other episodes (no step-wide barrier); the client batches the calls
that are in flight together.

A verdict that cannot be had — the call timed out (``judge.timeout_s``), the engine failed, or the answer was
malformed — is a failed verdict: :func:`judge_trajectory` then masks the episode with status ``judge_error`` (it
never reaches the loss, and the step's ``status_judge_error`` counts it). Nothing raises into the step.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relax_gym.envs.rubric import JudgeRequest, combine
from relax_gym.envs.verdict import parse_verdict
from relax_gym.omni.render import render
from relax_gym.trainer.rewards.judge_prompt import judge_messages
from relax_gym.trainer.rollout.episode import MASKED_STATUSES

__all__ = ["JUDGE_ERROR", "Judge", "Verdict", "judge_trajectory"]

log = logging.getLogger(__name__)

#: The status of an episode whose judge verdict could not be had (masked like env_error / engine_error).
JUDGE_ERROR = "judge_error"


@dataclass(frozen=True)
class Verdict:
    """One judge answer: ``value`` in [0, 1] or None; ``status`` ``ok``, ``malformed``, ``timeout`` or
    ``engine_error``; ``text``: what the judge said (or the error)."""

    part: str
    value: float | None
    status: str
    text: str


class Judge:
    """``client``: an engine client (``await client.generate(input_ids, sampling_params=…)``) serving the judge
    model; ``processor``: the judge model's processor (the prompt is rendered with it)."""

    def __init__(self, client: Any, processor: Any, *, max_new_tokens: int = 8, timeout_s: float = 60.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.client, self.processor = client, processor
        self.sampling = {"max_new_tokens": int(max_new_tokens), "temperature": 0.0, "top_p": 1.0}
        self.timeout_s = float(timeout_s)
        self.counts: Counter[str] = Counter()  # verdict statuses over the judge's life

    async def verdict(self, request: JudgeRequest) -> Verdict:
        try:
            ids = render(judge_messages(request.prompt), self.processor, add_generation_prompt=True).input_ids
            out = await asyncio.wait_for(self.client.generate(list(ids), sampling_params=self.sampling, return_logprob=False),
                                         self.timeout_s)
        except TimeoutError:
            return self._count(Verdict(request.part, None, "timeout", f"no answer within {self.timeout_s:g} s"))
        except Exception as exc:  # noqa: BLE001 - an engine failure is a failed verdict, never a failed step
            return self._count(Verdict(request.part, None, "engine_error", f"{type(exc).__name__}: {exc}"))
        try:
            text = self.processor.decode(out.output_ids, skip_special_tokens=True).strip()
            value = parse_verdict(text, request.verdict, labels=request.labels, max_score=request.max_score)
        except Exception as exc:  # noqa: BLE001 - undecodable ids or a verdict that cannot be read: no verdict
            return self._count(Verdict(request.part, None, "malformed", f"{type(exc).__name__}: {exc}"))
        return self._count(Verdict(request.part, value, "ok" if value is not None else "malformed", text))

    async def score(self, requests: Sequence[JudgeRequest | Mapping[str, Any]]) -> list[Verdict]:
        """One verdict per request, in order; the calls run concurrently."""
        reqs = [r if isinstance(r, JudgeRequest) else JudgeRequest.model_validate(r) for r in requests]
        return list(await asyncio.gather(*(self.verdict(r) for r in reqs)))

    def _count(self, verdict: Verdict) -> Verdict:
        self.counts[verdict.status] += 1
        if verdict.status != "ok":
            log.debug("judge verdict for part %r failed (%s): %s", verdict.part, verdict.status, verdict.text)
        return verdict


async def judge_trajectory(traj: Any, judge: Judge | None) -> Any:
    """Score ``traj``'s pending judge parts (``traj.info["judge_requests"]``) and recompute its reward from every
    part (:func:`~relax_gym.envs.rubric.combine` with ``info["reward_weights"]``). A failed verdict (or no judge
    configured) masks the episode as ``judge_error``; an episode already masked, or with nothing pending, is left
    as it is. ``info`` gains ``judge_calls``, ``judge_failures`` and, when the env reports its own rule verdict
    (``reward_context["rule_match"]``), ``judge_agrees`` (1/0: the judge's verdict of the first judge part
    matched it)."""
    requests = traj.info.pop("judge_requests", None)
    weights = traj.info.pop("reward_weights", None)
    if not requests or traj.status in MASKED_STATUSES:
        return traj
    if judge is None:
        traj.status, traj.reward = JUDGE_ERROR, 0.0
        traj.error = (f"the env left judge parts pending ({', '.join(r['part'] for r in requests)}) but the run has no "
                      "judge: add a judge: section to the recipe (docs/judges.md)")
        traj.info.update(judge_calls=0, judge_failures=len(requests), judge_failure="no_judge")
        return traj
    if not weights:
        traj.status, traj.reward = JUDGE_ERROR, 0.0
        traj.error = "the env left judge parts pending without info['reward_weights']: the reward cannot be recombined"
        traj.info.update(judge_calls=0, judge_failures=len(requests), judge_failure="no_weights")
        return traj
    verdicts = await judge.score(requests)
    failed = [v for v in verdicts if v.value is None]
    breakdown = dict(traj.reward_breakdown)
    for v in verdicts:
        breakdown[v.part] = float(v.value or 0.0)
    traj.reward_breakdown = breakdown
    traj.info.update(judge_calls=len(verdicts), judge_failures=len(failed))
    rule = (traj.info.get("reward_context") or {}).get("rule_match")
    if rule is not None and verdicts and verdicts[0].value is not None:
        traj.info["judge_agrees"] = int((verdicts[0].value >= 0.5) == bool(rule))
    if failed:
        traj.info["judge_failure"] = failed[0].status  # timeout, engine_error or malformed: the step row counts each
        traj.status, traj.reward = JUDGE_ERROR, 0.0
        traj.error = "; ".join(f"judge part {v.part!r}: {v.status}: {v.text[:200]}" for v in failed)
        return traj
    # the env's step counted the pending parts 0; the rubric is a weighted mean, so the judged parts add their share
    # (and rewards of earlier turns, summed by the runner, stay)
    traj.reward += combine(weights, {v.part: float(v.value) for v in verdicts})
    return traj
