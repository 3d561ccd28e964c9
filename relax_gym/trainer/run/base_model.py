"""Both trainers' first move: a recipe's ``model.base`` becomes the checkpoint the run starts from (built into the
cache on first use, relax_gym/trainer/base), and the run directory keeps the base's report as ``base.json``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from relax_gym.trainer.base.build import ensure_base
from relax_gym.trainer.config import RelaxConfig

__all__ = ["resolve_base"]


def resolve_base(cfg: RelaxConfig, run_dir: Path, progress: Any = None) -> RelaxConfig:
    """``cfg`` with ``model.base`` turned into ``model.path`` (unchanged when no base is named). ``progress`` sees
    ``base_step`` events while a base is built and one ``base`` event when it is ready (``seconds``, ``built``)."""
    if cfg.model.base is None:
        return cfg
    name = cfg.model.base
    start = time.perf_counter()
    info = ensure_base(name, cfg.model, progress=progress)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    (Path(run_dir) / "base.json").write_text(json.dumps({**info.report, "path": str(info.path)}, indent=1) + "\n")
    if progress is not None:
        progress("base", {"name": name, "path": str(info.path), "seconds": time.perf_counter() - start,
                          "built": info.built, "report": info.report})
    return cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(info.path), "base": None})})
