"""Checkpoints of a training run, and resuming from them (both trainer modes).

A checkpoint is a folder ``RUN_DIR/checkpoints/step_NNNNNN/`` holding

- the model, in the actor backend's own format (:class:`CheckpointableActor`): the ``hf`` backend
  (:class:`~relax_gym.trainer.actors.hf.HFActor`) writes the policy with ``save_policy`` (a model directory that
  ``model.path`` loads), the megatron backend its ``dist_checkpointing`` folder;
- ``optimizer.pt``: the optimizer state with ``torch.save`` (a backend whose optimizer is sharded provides
  ``save_optimizer`` / ``load_optimizer`` and they are used instead);
- what else the run trains besides the policy, one folder each (``critic/``: PPO's value model, written by
  :meth:`~relax_gym.trainer.actors.critic.Critic.save`), staged next to the checkpoint and moved in before it is
  complete (:func:`part_stage`);
- ``trainer_state.pt``: a :class:`TrainerState` — the step (RL steps done), the policy version the engines serve,
  the data cursor (the seeds of the next step follow from it and the config), the random states (Python,
  NumPy, torch, and the trainer's own ``np.random.Generator``), the time spent so far (the learning-rate schedule
  may run on a time budget), and what the trainer mode adds (the async controller: its sample-id ledger and the
  bus cursor).

A checkpoint is written into ``step_NNNNNN.partial`` and renamed when complete, so a crash while writing never
leaves a folder that :func:`latest_checkpoint` would pick. Resuming rewinds ``metrics.jsonl`` to the checkpoint's
step (:func:`rewind_metrics`) so that the replayed steps do not appear twice.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from relax_gym.trainer.run.rollout_records import rewind_rollouts
from relax_gym.trainer.run.seeds import step_seed_base

__all__ = [
    "CHECKPOINTS", "CRITIC_DIR", "OPTIMIZER_FILE", "part_stage", "REFERENCE_DIR", "STATE_FILE", "CheckpointError", "CheckpointFailures", "CheckpointWriteError", "CheckpointableActor", "ResumePoint",
    "TrainerState", "capture_rng", "check_cursor", "trainer_state", "checkpoint_dir", "data_cursor", "eval_history", "latest_checkpoint",
    "load_checkpoint", "read_state", "reference_model", "restore_rng", "resume_point", "rewind_metrics", "save_checkpoint",
]

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
CRITIC_DIR = "critic"  # algorithm.name=ppo: the value model's folder inside a checkpoint
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step_(\d{6,})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or does not fit the config it is resumed with; the message says which."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (e.g. disk full); nothing of it was left behind and the earlier checkpoints are
    intact. A run reports it (a warning and ``checkpoint_failed`` in the step's row) and goes on training."""


@runtime_checkable
class CheckpointableActor(Protocol):
    """What an actor backend provides: its model to and from a folder (in its own format) and its optimizer."""

    optimizer: torch.optim.Optimizer

    def save_checkpoint(self, directory: Path) -> Any: ...

    def load_checkpoint(self, directory: Path) -> None: ...


OPTIMIZER_FILE = "optimizer.pt"


def _save_optimizer(actor: CheckpointableActor, directory: Path) -> None:
    custom = getattr(actor, "save_optimizer", None)
    if custom is not None:
        custom(directory)
    else:
        torch.save(actor.optimizer.state_dict(), directory / OPTIMIZER_FILE)


def _load_optimizer(actor: CheckpointableActor, directory: Path) -> None:
    custom = getattr(actor, "load_optimizer", None)
    if custom is not None:
        custom(directory)
        return
    file = directory / OPTIMIZER_FILE
    if not file.is_file():
        raise CheckpointError(f"{directory}: no {OPTIMIZER_FILE}; the optimizer cannot be restored")
    actor.optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))


@dataclass
class TrainerState:
    step: int  # RL steps completed; the run resumes with step + 1
    version: int  # policy version of the saved weights (what the engines serve after the resume)
    cursor: dict[str, int]  # the data cursor: see data_cursor()
    rng: dict[str, Any]  # capture_rng()
    elapsed_s: float = 0.0  # run time spent before the checkpoint (the time-budget clock)
    extra: dict[str, Any] = field(default_factory=dict)  # what the trainer mode adds


def data_cursor(trainer: Any, step: int) -> dict[str, int]:
    """Where the data stream stands after ``step`` RL steps (``trainer``: the config's trainer section). Step k's
    prompts are seeds ``seed * 10_000_019 + k * 1_000 + p`` for p < prompts_per_step (:mod:`~relax_gym.trainer.run.seeds`), so the next seed base
    with the shape that produced it is the whole cursor."""
    return {"step": int(step), "seed": int(trainer.seed), "prompts_per_step": int(trainer.prompts_per_step),
            "group_size": int(trainer.group_size), "next_seed_base": step_seed_base(trainer.seed, step + 1)}


def trainer_state(trainer: Any, *, step: int, version: int, rng: np.random.Generator | None, elapsed_s: float,
                  extra: dict[str, Any] | None = None) -> TrainerState:
    """The state a checkpoint after ``step`` saves (both modes): the data cursor of ``trainer`` (the config's
    trainer section), this process's random states and ``rng``, the run's clock, and what the mode adds."""
    return TrainerState(step=int(step), version=int(version), cursor=data_cursor(trainer, step), rng=capture_rng(rng),
                        elapsed_s=float(elapsed_s), extra=dict(extra or {}))


def check_cursor(cursor: dict[str, int], trainer: Any, where: Path) -> None:
    """Refuse to resume with a config whose data stream differs from the checkpoint's."""
    for key in ("seed", "prompts_per_step", "group_size"):
        if int(cursor[key]) != int(getattr(trainer, key)):
            raise CheckpointError(f"{where}: saved with trainer.{key}={cursor[key]}, but the config says "
                                  f"{getattr(trainer, key)}; resume with the run's own config")


def capture_rng(generator: np.random.Generator | None = None) -> dict[str, Any]:
    """The random states of this process: Python's, NumPy's global one, torch's CPU (and CUDA) generators, and
    ``generator`` (a trainer's own NumPy generator) when given."""
    out: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["torch_cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        out["generator"] = generator.bit_generator.state
    return out


def restore_rng(states: dict[str, Any], generator: np.random.Generator | None = None) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "torch_cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["torch_cuda"])
    if generator is not None:
        if "generator" not in states:
            raise CheckpointError("the checkpoint holds no state for the trainer's random generator")
        generator.bit_generator.state = states["generator"]


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step:06d}"


def part_stage(run_dir: Path, step: int, part: str) -> Path:
    """Where a part of the checkpoint of ``step`` that another process writes (the async critic role's
    ``critic/``) is staged, emptied first: :func:`save_checkpoint` moves it in (``parts``)."""
    stage = checkpoint_dir(run_dir, step).with_name(f"step_{step:06d}.{part}.partial")
    shutil.rmtree(stage, ignore_errors=True)
    return stage


def save_checkpoint(run_dir: Path, actor: CheckpointableActor, state: TrainerState,
                    parts: dict[str, Path] | None = None) -> Path:
    """Write the checkpoint of ``state.step`` (model and optimizer by ``actor``, then the trainer state); atomic.
    ``parts``: finished folders (staged with :func:`part_stage`) moved in under their names, e.g. ``critic``.

    A write that fails (disk full, quota, I/O error: seen as ``OSError``, torch's ``RuntimeError`` or safetensors'
    error) raises :class:`CheckpointWriteError` after removing what it wrote: the previous checkpoints are untouched
    and stay the resume point."""
    final = checkpoint_dir(run_dir, state.step)
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        actor.save_checkpoint(partial)
        _save_optimizer(actor, partial)
        for name, folder in (parts or {}).items():
            if not Path(folder).is_dir():
                raise CheckpointError(f"the checkpoint part {name!r} was to be moved in from {folder}, which does not exist")
            os.replace(folder, partial / name)
        torch.save(asdict(state), partial / STATE_FILE)
    except CheckpointError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except Exception as exc:  # a full disk surfaces as OSError, torch's RuntimeError or SafetensorError
        shutil.rmtree(partial, ignore_errors=True)
        for folder in (parts or {}).values():
            shutil.rmtree(folder, ignore_errors=True)
        previous = latest_checkpoint(run_dir)
        try:
            free = f"{shutil.disk_usage(final.parent).free / 2**20:.0f} MiB free there"
        except OSError:
            free = "free space unknown"
        raise CheckpointWriteError(
            f"the checkpoint of step {state.step} could not be written to {partial} ({type(exc).__name__}: "
            f"{str(exc)[:300]}; {free}); what was written is removed. The last complete checkpoint is "
            f"{previous.name if previous else 'none (nothing to resume from yet)'}") from exc
    if final.exists():  # the same step saved again (a replayed step after a rollback): the new one wins
        shutil.rmtree(final)
    os.replace(partial, final)
    return final


class CheckpointFailures:
    """A run's failed checkpoint writes: each is logged as a warning (with the last complete checkpoint, which stays
    the resume point) and counted; the run goes on. ``figures()`` goes into the run's summary."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.last_error = ""

    def record(self, step: int, error: str) -> None:
        self.steps.append(step)
        self.last_error = error
        log.warning("checkpoint of step %d failed; training goes on: %s", step, error)

    def figures(self) -> dict[str, Any]:
        return {"checkpoint_failures": len(self.steps), "checkpoint_failed_steps": list(self.steps),
                **({"checkpoint_last_error": self.last_error} if self.last_error else {})}


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint with the highest step in ``run_dir`` (None when there is none)."""
    root = Path(run_dir) / CHECKPOINTS
    found = [(int(m.group(1)), p) for p in root.glob("step_*") if (m := _STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def read_state(path: Path) -> TrainerState:
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: no {STATE_FILE} (not a complete relax-gym checkpoint)")
    raw = torch.load(file, map_location="cpu", weights_only=False)
    missing = [k for k in ("step", "version", "cursor", "rng") if k not in raw]
    if missing:
        raise CheckpointError(f"{file}: an older or foreign trainer state without {missing}; it cannot be resumed")
    return TrainerState(**{k: raw[k] for k in TrainerState.__dataclass_fields__ if k in raw})


def load_checkpoint(path: Path, actor: CheckpointableActor | None = None) -> TrainerState:
    """Load the model and optimizer into ``actor`` (when given) and return the trainer state. Random states are
    restored by the caller (:func:`restore_rng`), once everything that consumes them at start-up has run."""
    state = read_state(path)
    if actor is not None:
        actor.load_checkpoint(Path(path))
        _load_optimizer(actor, Path(path))
    return state


def rewind_metrics(run_dir: Path, step: int | None) -> int:
    """Drop the rows of steps after ``step`` from ``metrics.jsonl`` (the SFT rows, step <= 0, stay; ``step`` None:
    every row, for a run that starts over); returns how many rows were dropped. The file is replaced atomically."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row_step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            dropped += 1  # a line cut short by the crash
            continue
        if step is not None and row_step <= step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    os.replace(tmp, path)
    return dropped


# ------------------------------------------------------------------------------------------------------ resuming
REFERENCE_DIR = "reference"


@dataclass
class ResumePoint:
    """Where a resumed run continues: the latest checkpoint (``path`` None when none was written yet: the run
    starts over) and its state."""

    path: Path | None
    state: TrainerState | None

    @property
    def step(self) -> int:
        return self.state.step if self.state is not None else 0


def resume_point(run_dir: Path, trainer: Any) -> ResumePoint:
    """The latest checkpoint of ``run_dir`` (its data cursor checked against ``trainer``, the config's trainer
    section), with ``metrics.jsonl`` and the rollout records rewound to its step (every row and record when there
    is no checkpoint)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise CheckpointError(f"{run_dir}: no config.json, so not a relax-gym run directory to resume")
    path = latest_checkpoint(run_dir)
    state = read_state(path) if path is not None else None
    if state is not None:
        check_cursor(state.cursor, trainer, path)
    rewind_metrics(run_dir, state.step if state is not None else None)
    rewind_rollouts(run_dir, state.step if state is not None else None)
    return ResumePoint(path, state)


def eval_history(run_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """``(last eval, first eval)`` of a rewound run from its metrics rows: the ``eval_*`` values of the last row
    that has them, and of step 0."""
    from relax_gym.trainer.run.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if "eval_reward" in r and r["step"] >= 0]
    if not rows:
        raise CheckpointError(f"{run_dir}/metrics.jsonl holds no eval row; the run cannot be resumed from it")
    pick = lambda row: {k: v for k, v in row.items() if k.startswith("eval_")}  # noqa: E731
    return pick(rows[-1]), pick(rows[0])


def reference_model(run_dir: Path, actor: Any, processor: Any, model_cfg: Any, *, resumed: bool) -> Any:
    """The frozen reference policy of the KL term (the warmed-up policy): saved to ``run_dir/reference`` when the
    run starts, loaded from there when it resumes (the actor's weights have moved on since)."""
    from relax_gym.trainer.policy import build_policy, save_policy

    path = Path(run_dir) / REFERENCE_DIR
    if resumed:
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: the run's reference policy is missing; a run with algorithm.kl_coef > 0 "
                                  "cannot resume without it")
        model, _ = build_policy(model_cfg.model_copy(update={"path": str(path)}))
        return model.eval()
    model = actor.hf_model()
    save_policy(model, processor, path)
    return model
