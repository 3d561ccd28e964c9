"""Fixtures shared by the training runs of tests/integration."""

from __future__ import annotations

from pathlib import Path

import pytest

from relax_gym.trainer.rewards.judge_model import ensure_judge

from .judging import SMALL_JUDGE


@pytest.fixture(scope="session")
def judge_dir() -> Path:
    """The small judge, built once into the cache (the library's rule, as `make train` builds describe-judge)."""
    return ensure_judge("describe-judge-small", spec=SMALL_JUDGE).path
