"""Helper of the benchmark scripts (not a benchmark): one training run of a config into a fresh run directory, and
what the scripts read back from it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def train_once(cfg: Any, run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], float]:
    """Run ``cfg`` (either mode) into ``run_dir`` (emptied first: metrics.jsonl appends, a rerun must not mix with an
    old run). Returns the summary, every metrics row, the RL step rows, and the loop's seconds (the first step's start
    to the last step's end)."""
    from relax_gym.trainer.train import build_trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = build_trainer(cfg, run_dir)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    loop_s = steps[-1]["elapsed_s"] - (steps[0]["elapsed_s"] - steps[0]["time_step_s"])
    return summary, rows, steps, loop_s
