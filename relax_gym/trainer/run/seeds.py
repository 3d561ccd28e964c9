"""The seeds of a run's episodes, one formula for both training modes (and the checkpoint's data cursor).

Step k (from 1) plays prompt p < ``prompts_per_step`` with seed ``seed * 10_000_019 + k * 1_000 + p``, once per
group member; eval episode i plays seed ``500_000 + i`` (greedy, on the eval split). The warm-up's demonstrations
use seeds from :data:`~relax_gym.trainer.run.warmup.WARMUP_SEED` on, apart from both.
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["EVAL_SEED_BASE", "eval_seeds", "prompt_seed", "seed_everything", "step_seed_base", "train_seeds"]

RUN_SEED_STRIDE = 10_000_019  # per trainer.seed: room for 10,000 steps before two seeds' streams meet
STEP_SEED_STRIDE = 1_000  # room for up to 1000 prompts per step
EVAL_SEED_BASE = 500_000


def step_seed_base(seed: int, step: int) -> int:
    """The seed of prompt 0 of step ``step`` (counted from 1)."""
    return int(seed) * RUN_SEED_STRIDE + int(step) * STEP_SEED_STRIDE


def prompt_seed(seed: int, step: int, prompt: int) -> int:
    """The seed of prompt ``prompt`` of step ``step`` (counted from 1): every member of its group plays it."""
    return step_seed_base(seed, step) + int(prompt)


def train_seeds(seed: int, step: int, prompts_per_step: int, group_size: int) -> list[tuple[int, int]]:
    """``(episode seed, group id)`` of every episode of step ``step``, in the order the colocate loop plays them."""
    return [(prompt_seed(seed, step, p), p) for p in range(prompts_per_step) for _ in range(group_size)]


def eval_seeds(n: int) -> list[int]:
    """The seeds of the ``n`` eval episodes (the same at every eval)."""
    return [EVAL_SEED_BASE + i for i in range(n)]


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's global generators from ``trainer.seed`` (model init and sampling at start-up)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
