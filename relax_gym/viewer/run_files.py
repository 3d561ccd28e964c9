"""Reading a run directory for the viewer: metrics rows, the steps that have rollout records, a step's records, and
media paths that stay inside the run's media folder.

Files are read on each request, never cached: a run that is still going appends to them, and the page polls.
A line being written while it is read (no newline yet), or a line that is not JSON, is skipped, not an error.
The formats are the trainer's (``metrics.jsonl``: one JSON object per row with ``step``; ``rollouts/step_NNNNNN.jsonl``:
the records of :mod:`relax_gym.trainer.run.rollout_records`), read here as plain JSON so the viewer depends on no
trainer code.
"""

from __future__ import annotations

import json
import mimetypes
import re
from pathlib import Path
from typing import Any

__all__ = ["RunFiles", "filter_records", "media_type"]

_STEP_FILE = re.compile(r"^step_(\d{6,})\.jsonl$")
_MEDIA_TYPES = {".webm": "video/webm", ".wav": "audio/wav", ".png": "image/png", ".jpg": "image/jpeg",
                ".jpeg": "image/jpeg", ".mp4": "video/mp4", ".flac": "audio/flac", ".ogg": "audio/ogg"}


def media_type(path: Path) -> str:
    return _MEDIA_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def _json_lines(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):  # the writer is still on this line
            break
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class RunFiles:
    """One run directory, read-only."""

    def __init__(self, run_dir: str | Path) -> None:
        self.root = Path(run_dir).resolve()
        self.media_root = self.root / "media"

    def describe(self) -> dict[str, Any]:
        """Name, path, the config's headline (env, algorithm, mode, steps) and whether the run has ended."""
        config: dict[str, Any] = {}
        try:
            config = json.loads((self.root / "config.json").read_text())
        except (OSError, ValueError):
            pass
        trainer = config.get("trainer", {}) if isinstance(config, dict) else {}
        summary = None
        try:
            summary = json.loads((self.root / "summary.json").read_text())
        except (OSError, ValueError):
            pass
        return {"name": self.root.name, "path": str(self.root),
                "env": (config.get("env") or {}).get("id"), "algorithm": (config.get("algorithm") or {}).get("name"),
                "mode": trainer.get("mode"), "steps": trainer.get("steps"), "group_size": trainer.get("group_size"),
                "finished": summary is not None, "summary": summary}

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (warm-up rows have negative steps), in file order."""
        return _json_lines(self.root / "metrics.jsonl")

    def step_numbers(self) -> list[int]:
        folder = self.root / "rollouts"
        if not folder.is_dir():
            return []
        return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _STEP_FILE.match(p.name)))

    def records(self, step: int) -> list[dict[str, Any]]:
        """A step's records, one per episode: a record written again (a resumed run replaying a step) replaces the
        earlier one of the same kind and index."""
        by_key: dict[tuple[str, int], dict[str, Any]] = {}
        for row in _json_lines(self.root / "rollouts" / f"step_{step:06d}.jsonl"):
            by_key[(str(row.get("kind")), int(row.get("index", len(by_key))))] = row
        return sorted(by_key.values(), key=lambda r: (r.get("kind") != "train", r.get("index", 0)))

    def steps(self) -> list[dict[str, Any]]:
        """Each step with records: how many train and eval episodes, their mean rewards, the statuses and tools seen,
        and the file's size (the page refetches a step whose file grew)."""
        out = []
        for step in self.step_numbers():
            records = self.records(step)
            item: dict[str, Any] = {"step": step, "bytes": (self.root / "rollouts" / f"step_{step:06d}.jsonl").stat().st_size}
            for kind in ("train", "eval"):
                rs = [r for r in records if r.get("kind") == kind]
                item[kind] = len(rs)
                item[f"{kind}_reward"] = sum(float(r.get("reward", 0.0)) for r in rs) / len(rs) if rs else None
            item["statuses"] = sorted({str(r.get("status")) for r in records})
            item["tools"] = sorted({t for r in records for t in r.get("tools", [])})
            out.append(item)
        return out

    def media_path(self, rel: str) -> Path | None:
        """The file a record's media URL names, or None when it is not a file inside ``RUN_DIR/media``."""
        path = (self.media_root / rel).resolve()
        if not path.is_relative_to(self.media_root) or not path.is_file():
            return None
        return path


def filter_records(records: list[dict[str, Any]], *, kind: str | None = None, status: str | None = None,
                   tool: str | None = None, reward_min: float | None = None,
                   reward_max: float | None = None) -> list[dict[str, Any]]:
    """The records that pass every filter given: kind, status, a tool the episode called (``tool="none"``: episodes
    that called none), and a reward range (inclusive)."""
    out = []
    for r in records:
        reward = float(r.get("reward", 0.0))
        if kind and r.get("kind") != kind or status and r.get("status") != status:
            continue
        if tool and (tool not in r.get("tools", []) if tool != "none" else r.get("tools")):
            continue
        if reward_min is not None and reward < reward_min or reward_max is not None and reward > reward_max:
            continue
        out.append(r)
    return out
