"""Dataset loaders for the real layouts (NExT-QA CSV, R1-json, generic jsonl) and the spec that picks one."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from relax_gym.envs.datasets.base import DatasetError, McqSample
from relax_gym.envs.datasets.jsonl import load_jsonl
from relax_gym.envs.datasets.nextqa import load_nextqa, nextqa_from_dir
from relax_gym.envs.datasets.r1json import load_r1json, r1json_from_dir

Format = Literal["nextqa", "r1json", "jsonl"]


class DatasetSpec(BaseModel):
    """Which layout to read, which split, and which bundled sample stands in when no ``data_dir`` is given."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    format: Format
    split: str = "val"
    sample: Literal["nextqa", "avqa", "nextqa-agent", "avqa-agent"] | None = None  # a name samples.ensure_sample knows
    file: str | None = None  # jsonl: the file inside data_dir (default "{split}.jsonl")
    on_missing: Literal["error", "skip"] = "error"


def load_dataset(spec: DatasetSpec, data_dir: Path, split: str | None = None) -> list[McqSample]:
    split = split or spec.split
    if spec.format == "nextqa":
        return nextqa_from_dir(data_dir, split, on_missing=spec.on_missing)
    if spec.format == "r1json":
        return r1json_from_dir(data_dir, split)
    file = Path(data_dir) / (spec.file or f"{split}.jsonl")
    return load_jsonl(file)


__all__ = ["DatasetError", "DatasetSpec", "McqSample", "load_dataset", "load_jsonl", "load_nextqa", "load_r1json", "nextqa_from_dir", "r1json_from_dir"]
