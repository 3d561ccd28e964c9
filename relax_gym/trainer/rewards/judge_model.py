"""Judge models built in code: a tiny text-only thinker of the policy family learns, by supervised training, to give
the verdict a rule gives on (facts, description) pairs; it is then frozen, cached and served like any checkpoint.

    info = ensure_judge("describe-judge")
    info.path      # a checkpoint directory: build_policy(PolicyConfig(path=info.path)) loads it; the embedded
                   # engine (or SGLang) serves it unchanged (same tokenizer and processor as the policy)
    info.built     # False when the cache already held it
    info.report    # judge.json: the spec, seconds, steps, held-out agreement with the rule verdict (overall, per kind)

The data are the ``nextqa-describe`` env's pairs (:func:`relax_gym.envs.describe_facts.make_pairs`: correct, wrong,
mixed, truncated, garbage descriptions of random facts), never a clip. Each prompt is made by the env's own rubric
part (``match`` of :data:`relax_gym.envs.describe.DESCRIBE_RUBRIC`, the description cut as the env cuts it) and
rendered exactly as the judge server renders it (:func:`~relax_gym.trainer.rewards.judge_prompt.judge_messages`
through :func:`~relax_gym.omni.render.render`); the target is the rule verdict's word (``yes`` / ``no``) and the
end-of-turn token, the assistant turn of that conversation. Training pairs and held-out pairs come from different
seeds; the held-out agreement is measured the way the judge is used: greedy generation on the embedded engine, the
answer read by :func:`~relax_gym.envs.verdict.parse_verdict` (an unreadable answer counts as a disagreement).
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from relax_gym.envs.describe import DESCRIBE_RUBRIC, MAX_JUDGED_CHARS
from relax_gym.envs.describe_facts import (
    PAIR_KINDS,
    PAIRS_VERSION,
    Pair,
    facts_text,
    make_pairs,
)
from relax_gym.envs.samples import sample_root
from relax_gym.envs.verdict import parse_verdict
from relax_gym.omni import Message, TextPart
from relax_gym.omni.render import Rendered, render
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.base.build import build_into_cache
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.policy.model import save_policy
from relax_gym.trainer.policy.tokenizer import TOKENIZER_VERSION
from relax_gym.trainer.rewards.judge_prompt import judge_messages

__all__ = ["JUDGES", "JudgeInfo", "JudgeSpec", "agreement", "ensure_judge", "judge_item", "judge_key", "judge_prompt",
           "judges_root"]

#: Bump when the build's code changes what it produces (the cache key carries it).
JUDGE_BUILD_VERSION = 1
_MATCH = next(p for p in DESCRIBE_RUBRIC.parts if p.name == "match")

Progress = Callable[[str, dict[str, Any]], None]


class JudgeSpec(BaseModel):
    """A judge: a random thinker of these text sizes, ``steps`` SFT batches of ``batch_size`` fresh pairs at ``lr``
    (AdamW), weights and pairs drawn from ``seed``; measured on ``held_pairs`` pairs of another seed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int = Field(gt=0)
    batch_size: int = Field(default=64, gt=0)
    lr: float = Field(default=1e-3, gt=0)
    seed: int = 0
    held_pairs: int = Field(default=1000, gt=0)
    hidden_size: int = Field(default=128, gt=0)
    num_layers: int = Field(default=2, gt=0)
    num_heads: int = Field(default=4, gt=0)
    num_kv_heads: int = Field(default=2, gt=0)
    about: str = ""

    def policy(self) -> PolicyConfig:
        """The thinker it trains: the policy family and tokenizer, these text sizes, the smallest media towers."""
        return PolicyConfig(hidden_size=self.hidden_size, intermediate_size=2 * self.hidden_size, num_layers=self.num_layers,
                            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, seed=self.seed,
                            vision_depth=1, vision_embed=32, vision_intermediate=64,
                            audio_layers=1, audio_d_model=32, audio_ffn=64)


#: The named judges a recipe's ``judge.model`` can ask for.
JUDGES: dict[str, JudgeSpec] = {
    "describe-judge": JudgeSpec(
        steps=450, lr=1e-3, about="nextqa-describe's match part: does the description state the clip's facts, yes or no"),
}


def judges_root() -> Path:
    """``$RELAX_GYM_CACHE/judges`` or ``~/.cache/relax-gym/judges``: beside the samples and the bases."""
    return sample_root().parent / "judges"


def judge_key(spec: JudgeSpec) -> str:
    """16 hex digits of blake2b over the spec, the judge prompt's template, the pairs' and tokenizer's versions and
    the build's version."""
    blob = json.dumps({"spec": spec.model_dump(mode="json"), "template": _MATCH.template, "cut": MAX_JUDGED_CHARS,
                       "pairs": PAIRS_VERSION, "tokenizer": TOKENIZER_VERSION, "build": JUDGE_BUILD_VERSION},
                      sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class JudgeInfo:
    name: str
    path: Path
    built: bool  # this call trained it (False: found in the cache)
    report: dict[str, Any]


def ensure_judge(name: str, root: Path | None = None, *, spec: JudgeSpec | None = None,
                 progress: Progress | None = None) -> JudgeInfo:
    """The judge ``name`` (or ``spec``): from the cache, or built now into it. Building writes a temporary sibling
    folder and renames it into place, so concurrent builds never see half a judge."""
    if spec is None:
        if name not in JUDGES:
            raise ValueError(f"judge {name!r} is no known judge; known: {', '.join(sorted(JUDGES))}")
        spec = JUDGES[name]
    root = Path(root) if root is not None else judges_root()
    final = root / f"{name}-{judge_key(spec)}"
    report, built = build_into_cache(final, "judge.json",
                                     lambda out: _build(name, spec, out, progress or (lambda event, data: None)))
    return JudgeInfo(name, final, built, report)


def judge_prompt(pair: Pair) -> str:
    """The judge's prompt for ``pair``, made by the env's own rubric part from what the env would put in it."""
    return _MATCH.request(pair.description[:MAX_JUDGED_CHARS], {"facts": facts_text(pair.facts)}).prompt


def judge_item(pair: Pair, processor: Any) -> Rendered:
    """One SFT example: the prompt as the server renders it, then the verdict word and the end-of-turn token."""
    answer = Message(role="assistant", content=(TextPart("yes" if pair.verdict else "no"),))
    return render([*judge_messages(judge_prompt(pair)), answer], processor, add_generation_prompt=False)


def _build(name: str, spec: JudgeSpec, out: Path, progress: Progress) -> dict[str, Any]:
    start = time.perf_counter()
    # train pairs: seed-derived stream 2*seed+1; held-out pairs: 2*seed+2 (never the same stream)
    train = make_pairs(spec.steps * spec.batch_size, seed=2 * spec.seed + 1)
    held = make_pairs(spec.held_pairs, seed=2 * spec.seed + 2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model, processor = build_policy(spec.policy())
        actor = HFActor(model, processor, lr=spec.lr, micro_batch_size=32)  # sorted by length: less padding

        def batch(k: int) -> list[Rendered]:
            items = [judge_item(p, processor) for p in train[k * spec.batch_size:(k + 1) * spec.batch_size]]
            return sorted(items, key=len)  # similar lengths together: less padding

        model.train()
        nll = float("nan")
        with cf.ThreadPoolExecutor(1) as pool:  # renders the next batch while this one trains
            upcoming = pool.submit(batch, 0)
            for step in range(spec.steps):
                items = upcoming.result()
                if step + 1 < spec.steps:
                    upcoming = pool.submit(batch, step + 1)
                nll = actor.sft_step(items)["sft_nll"]
                progress("judge_step", {"step": step + 1, "of": spec.steps, "sft_nll": nll})
        model.eval()
    t_train = time.perf_counter() - start
    measured = agreement(model, processor, held)
    save_policy(model, processor, out)
    report = {"name": name, "key": judge_key(spec), "spec": spec.model_dump(mode="json"),
              "build_version": JUDGE_BUILD_VERSION, "pairs_version": PAIRS_VERSION, "template": _MATCH.template,
              "final_sft_nll": nll, "steps": spec.steps, "train_pairs": len(train),
              "seconds": {"train": round(t_train, 1), "total": round(time.perf_counter() - start, 1)},
              "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
              "held_out": measured, "pair_kinds": PAIR_KINDS}
    (out / "judge.json").write_text(json.dumps(report, indent=1) + "\n")
    progress("judge_done", report)
    return report


def agreement(model: Any, processor: Any, pairs: Sequence[Pair], *, max_new_tokens: int = 4) -> dict[str, Any]:
    """Share of ``pairs`` whose served verdict (greedy on the embedded engine, read by ``parse_verdict``) equals the
    rule verdict: ``overall``, ``per_kind``, ``yes_rule`` / ``no_rule`` (on the pairs the rule says yes / no to),
    ``malformed`` (answers that were no verdict), ``n``."""
    engine = EmbeddedEngine(model, processor, max_batch=128)
    try:
        prompts = [render(judge_messages(judge_prompt(p)), processor, add_generation_prompt=True).input_ids for p in pairs]
        sampling = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
        with cf.ThreadPoolExecutor(128) as pool:
            outs = list(pool.map(lambda ids: engine.generate_rendered(ids, None, sampling_params=sampling,
                                                                      return_logprob=False), prompts))
    finally:
        engine.close()
    hits: dict[str, list[bool]] = defaultdict(list)
    malformed = 0
    for pair, o in zip(pairs, outs):
        value = parse_verdict(processor.decode(o.output_ids, skip_special_tokens=True), "label",
                              labels=_MATCH.labels)
        malformed += value is None
        ok = value is not None and (value >= 0.5) == pair.verdict
        for key in ("overall", f"kind:{pair.kind}", "yes_rule" if pair.verdict else "no_rule"):
            hits[key].append(ok)
    mean = {k: round(float(np.mean(v)), 4) for k, v in hits.items()}
    return {"overall": mean["overall"], "yes_rule": mean.get("yes_rule"), "no_rule": mean.get("no_rule"),
            "per_kind": {k.removeprefix("kind:"): v for k, v in sorted(mean.items()) if k.startswith("kind:")},
            "malformed": malformed, "n": len(pairs)}
