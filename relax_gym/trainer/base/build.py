"""Build a base model: a random tiny thinker learns to caption synthetic media by supervised training, then is saved
in the cache under the hash of everything that decides its weights, so a second build is a directory lookup.

    info = ensure_base("tiny-omni", PolicyConfig(hidden_size=128, num_layers=2))
    info.path          # a checkpoint directory: build_policy(PolicyConfig(path=info.path)) loads it
    info.built         # False when the cache already held it
    info.report        # base.json: the spec, seconds, held-out caption accuracy per corpus, what it saw

The base sees only the caption corpora (:mod:`relax_gym.envs.synth_captions`): media from the QA generators with a
sentence of what is in them, never a QA question, option list, answer letter or QA clip.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relax_gym.envs.samples import sample_root
from relax_gym.envs.synth_captions import CAPTION_SAMPLES
from relax_gym.omni.render import render
from relax_gym.trainer.actors.hf import HFActor
from relax_gym.trainer.base.corpus import Captioned, load_corpus
from relax_gym.trainer.base.spec import BASES, BaseSpec
from relax_gym.trainer.engines.embedded import EmbeddedEngine
from relax_gym.trainer.policy import PolicyConfig, build_policy
from relax_gym.trainer.policy.model import save_policy

__all__ = ["BaseInfo", "base_key", "bases_root", "ensure_base", "policy_shape"]

logger = logging.getLogger(__name__)

#: Bump when the build's code changes what it produces (the cache key carries it).
BUILD_VERSION = 1
# PolicyConfig fields that do not shape a random thinker's architecture (the base's own seed draws the weights)
_NOT_SHAPE = {"path", "base", "seed", "dtype"}

Progress = Callable[[str, dict[str, Any]], None]


def bases_root() -> Path:
    """``$RELAX_GYM_CACHE/bases`` or ``~/.cache/relax-gym/bases``: beside the generated samples."""
    return sample_root().parent / "bases"


def policy_shape(policy: PolicyConfig) -> dict[str, Any]:
    """The architecture a base is built with: every field of ``policy`` but path / base / seed / dtype."""
    return {k: v for k, v in policy.model_dump(mode="json").items() if k not in _NOT_SHAPE}


def base_key(spec: BaseSpec, policy: PolicyConfig) -> str:
    """16 hex digits of blake2b over the spec, the architecture, the corpora's versions and the build's version."""
    blob = json.dumps({"spec": spec.model_dump(mode="json"), "shape": policy_shape(policy), "build": BUILD_VERSION,
                       "corpora": {n: CAPTION_SAMPLES[n] for n in sorted(spec.corpora)}}, sort_keys=True)
    return hashlib.blake2b(blob.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class BaseInfo:
    name: str
    path: Path
    built: bool  # this call trained it (False: found in the cache)
    report: dict[str, Any]


def ensure_base(name: str, policy: PolicyConfig, *, root: Path | None = None, spec: BaseSpec | None = None,
                progress: Progress | None = None) -> BaseInfo:
    """The base ``name`` (or ``spec``) for ``policy``'s architecture: from the cache, or built now into it. Building
    writes a temporary sibling folder and renames it into place, so concurrent builds never see half a base."""
    if spec is None:
        if name not in BASES:
            raise ValueError(f"model.base={name!r} is no known base; known: {', '.join(sorted(BASES))}")
        spec = BASES[name]
    root = Path(root) if root is not None else bases_root()
    key = base_key(spec, policy)
    final = root / f"{name}-{key}"
    report, built = build_into_cache(final, "base.json",
                                     lambda out: _build(name, key, spec, policy, out, progress or (lambda event, data: None)))
    return BaseInfo(name, final, built, report)


def build_into_cache(final: Path, report_file: str, build: Callable[[Path], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """``(report, built)`` of the cached model folder ``final``: read from its ``report_file``, or built now by
    ``build(tmp)`` into a temporary sibling renamed into place (concurrent builds never see half a folder; when
    another process finishes first, its copy wins). Bases and judges are cached this way."""
    if (final / report_file).is_file():
        return json.loads((final / report_file).read_text()), False
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        report = build(tmp)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / report_file).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished first: its copy wins
            return json.loads((final / report_file).read_text()), False
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report, True


def _build(name: str, key: str, spec: BaseSpec, policy: PolicyConfig, out: Path, progress: Progress) -> dict[str, Any]:
    start = time.perf_counter()
    corpora = {c: load_corpus(c, video_frames=spec.video_frames) for c in sorted(spec.corpora)}
    t_data = time.perf_counter() - start
    train = {c: [r for r in recs if r.split == "train"] for c, recs in corpora.items()}
    held = [r for recs in corpora.values() for r in recs if r.split == "held"]
    cfg = policy.model_copy(update={"path": None, "base": None, "seed": spec.seed})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model, processor = build_policy(cfg)
        actor = HFActor(model, processor, lr=spec.lr, micro_batch_size=spec.batch_size)
        rng = np.random.default_rng(spec.seed)
        names = sorted(train)
        shares = np.array([spec.corpora[c] for c in names], dtype=float)
        shares /= shares.sum()

        def batch() -> list[Any]:
            picks = rng.choice(len(names), size=spec.batch_size, p=shares)
            recs = [train[names[k]][int(rng.integers(len(train[names[k]])))] for k in picks]
            return [render(r.conversation(), processor, add_generation_prompt=False) for r in recs]

        model.train()
        nll = float("nan")
        with cf.ThreadPoolExecutor(1) as pool:  # renders (decode + features) the next batch while this one trains
            upcoming = pool.submit(batch)
            for step in range(spec.steps):
                items = upcoming.result()
                upcoming = pool.submit(batch) if step + 1 < spec.steps else None
                nll = actor.sft_step(items)["sft_nll"]
                progress("base_step", {"step": step + 1, "of": spec.steps, "sft_nll": nll})
        model.eval()
    t_train = time.perf_counter() - start - t_data
    accuracy = caption_accuracy(model, processor, held)
    save_policy(model, processor, out)
    report = {"name": name, "key": key, "spec": spec.model_dump(mode="json"),
              "shape": policy_shape(policy), "build_version": BUILD_VERSION, "final_sft_nll": nll,
              "seconds": {"data": round(t_data, 1), "train": round(t_train, 1), "total": round(time.perf_counter() - start, 1)},
              "held_caption_accuracy": accuracy,
              "saw": {c: {"train_records": len(train[c]), "version": CAPTION_SAMPLES[c]} for c in names},
              "never_saw": "QA questions, option lists, answer letters, QA clips (the caption corpora have their own seeds)"}
    (out / "base.json").write_text(json.dumps(report, indent=1) + "\n")
    progress("base_done", report)
    return report


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("<|im_end|>", "")).strip()


def caption_accuracy(model: Any, processor: Any, records: list[Captioned]) -> dict[str, float]:
    """Share of ``records`` whose greedy caption is exactly the reference, per corpus."""
    if not records:
        return {}
    engine = EmbeddedEngine(model, processor, max_batch=64)
    try:
        rendered = [engine.render(list(r.prompt)) for r in records]
        with cf.ThreadPoolExecutor(64) as pool:
            outs = list(pool.map(lambda x: engine.generate_rendered(
                x.input_ids, x.mm, sampling_params={"max_new_tokens": 16, "temperature": 0.0}, return_logprob=False), rendered))
    finally:
        engine.close()
    hits: dict[str, list[bool]] = {}
    for r, o in zip(records, outs):
        hits.setdefault(r.corpus, []).append(_normal(o.text) == _normal(r.caption))
    return {c: round(float(np.mean(h)), 3) for c, h in hits.items()}
