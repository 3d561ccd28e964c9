"""A tiny random Qwen2.5-Omni thinker and its processor, built once per session (no download)."""

from __future__ import annotations

import pytest

from relax_gym.trainer.policy.model import PolicyConfig, build_policy


@pytest.fixture(scope="session")
def policy():
    return build_policy(PolicyConfig())


@pytest.fixture(scope="session")
def model(policy):
    return policy[0]


@pytest.fixture(scope="session")
def processor(policy):
    return policy[1]
