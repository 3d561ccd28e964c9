"""The generated sample datasets: which exist, where they are cached, and ``ensure_sample(name)``, which generates
one on first use and reuses it afterwards.

The writers live with what they draw: the QA samples in :mod:`relax_gym.envs.synth`, the caption corpora (a base
model's pretraining data) in :mod:`relax_gym.envs.synth_captions`, the nextqa-describe clips with their facts in
:mod:`relax_gym.envs.describe_facts`. Generation goes into a temporary sibling folder that is renamed into place,
so concurrent processes never see a half-written dataset; each sample's folder name carries its own version
(:func:`sample_version`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from relax_gym.envs import describe_facts, synth, synth_captions
from relax_gym.envs.cache import cache_home

__all__ = ["SAMPLE_NAMES", "ensure_sample", "sample_root", "sample_version"]

logger = logging.getLogger(__name__)


def sample_root() -> Path:
    """Folder holding generated samples: ``$RELAX_GYM_CACHE/samples`` or ``~/.cache/relax-gym/samples``."""
    return cache_home() / "samples"


#: Names accepted by ``ensure_sample``.
SAMPLE_NAMES: tuple[str, ...] = ("nextqa", "avqa", "nextqa-agent", "avqa-agent", "video-captions", "audio-image-captions",
                                 "describe")


def _writers() -> dict[str, Callable[[Path], None]]:
    # looked up at call time so the writers can be swapped (e.g. by tests)
    return {"nextqa": synth.write_nextqa_sample, "avqa": synth.write_avqa_sample,
            "nextqa-agent": synth.write_nextqa_agent_sample, "avqa-agent": synth.write_avqa_agent_sample,
            "video-captions": synth_captions.write_video_captions,
            "audio-image-captions": synth_captions.write_audio_image_captions,
            "describe": describe_facts.write_describe_sample}


def sample_version(name: str) -> int:
    """The content version of sample ``name``; its cache folder is ``f"{name}-v{version}"``."""
    if name.endswith("-captions"):
        return synth_captions.CAPTION_SAMPLES[name]
    if name == "describe":
        return describe_facts.DESCRIBE_SAMPLE_VERSION
    return synth.AGENT_SAMPLE_VERSION if name.endswith("-agent") else synth.SAMPLE_VERSION


def ensure_sample(name: str, root: Path | None = None) -> Path:
    """Return ``root/f"{name}-v{sample_version(name)}"``, generating the dataset there on first use.

    An existing folder is reused as is. Generation writes into a temporary folder in the same parent
    and renames it into place, so a reader never sees a partial dataset; if another process finished
    first, its copy wins and ours is discarded.
    """
    writers = _writers()
    if name not in writers:
        raise ValueError(f"unknown sample {name!r}; known samples: {', '.join(sorted(writers))}")
    root = Path(root) if root is not None else sample_root()
    final = root / f"{name}-v{sample_version(name)}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
    try:
        logger.debug("generating sample %s into %s", name, tmp)
        writers[name](tmp)
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700; the cache may be shared
        try:
            os.rename(tmp, final)
        except OSError:
            if not final.is_dir():
                raise
            logger.debug("sample %s was generated concurrently; discarding %s", name, tmp)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
