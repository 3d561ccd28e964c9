"""The mode switch: ``trainer.mode`` picks the loop that drives a run.

    trainer = build_trainer(cfg, run_dir, progress=on_event, resume=False)
    summary = trainer.run()
    trainer.close()

``colocate`` (:class:`~relax_gym.trainer.colocate.ColocateTrainer`): one process, the synchronous baseline.
``async`` (:class:`~relax_gym.trainer.async_engine.controller.AsyncTrainer`): roles as Ray Serve deployments around
the data bus, ``trainer.max_staleness`` steps of rollout ahead of training. Both define their RL step with
:mod:`relax_gym.trainer.run` and write the same run directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from relax_gym.trainer.config import RelaxConfig

Progress = Callable[[str, dict[str, Any]], None]


class Trainer(Protocol):
    def run(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def build_trainer(cfg: RelaxConfig, run_dir: Path, *, progress: Progress | None = None, resume: bool = False) -> Trainer:
    """The trainer ``cfg.trainer.mode`` names; ``resume``: continue ``run_dir`` from its latest checkpoint."""
    if cfg.trainer.mode == "async":
        from relax_gym.trainer.async_engine.controller import AsyncTrainer  # Ray and Serve load only for async runs

        return AsyncTrainer(cfg, run_dir, progress=progress, resume=resume)
    from relax_gym.trainer.colocate import ColocateTrainer

    return ColocateTrainer(cfg, run_dir, progress=progress, resume=resume)
