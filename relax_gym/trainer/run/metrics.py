"""Run metrics: ``metrics.jsonl`` always (one JSON object per line, append-only), TensorBoard when enabled."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True, purge_step: int | None = None) -> None:
        """``purge_step``: a resumed run's first step; TensorBoard hides the events at and after it that the
        interrupted run wrote (``metrics.jsonl`` is rewound by :func:`~relax_gym.trainer.run.checkpoint.rewind_metrics`)."""
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"), purge_step=purge_step)

    def write(self, step: int, values: dict[str, Any]) -> None:
        row = {"step": step, **{k: _plain(v) for k, v in values.items()}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics (is {run_dir} a relax-gym run directory?)")
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path} line {line_no}: invalid JSON ({exc.msg})") from None
    return rows


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
