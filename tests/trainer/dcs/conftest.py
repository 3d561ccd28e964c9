"""Fixtures of the DCS tests that push to an embedded engine in this process (tests/trainer/dcs/engine_helpers.py).
A module that needs another engine defines its own ``engine`` fixture, which takes precedence."""

from __future__ import annotations

import pytest

from relax_gym.trainer.dcs.group import GroupReceiver

from .engine_helpers import actor_policy, in_process_engine


@pytest.fixture(scope="module")
def engine():
    """``(engine, url)``: an in-process engine that receives through the DCS's ``GroupReceiver``."""
    eng, server = in_process_engine(GroupReceiver())
    yield eng, server.url
    server.close()


@pytest.fixture(scope="module")
def actor():
    """The actor's model: the policy with another seed."""
    return actor_policy()
