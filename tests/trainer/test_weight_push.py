"""The actor's DCS pusher drops an engine whose replica is gone (unreachable at the pause step) and pushes again."""

from __future__ import annotations

import asyncio
import socket

import pytest

from relax_gym.trainer.dcs import DCSCoordinator, DCSError
from relax_gym.trainer.policy import build_policy
from relax_gym.trainer.dcs.service import DCSPusher


def dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_unreachable_engines_are_removed_before_the_push_is_retried():
    model, _ = build_policy()
    coordinator = DCSCoordinator([dead_url(), dead_url()], transport="disk")
    pusher = DCSPusher(coordinator, model)
    try:
        with pytest.raises(DCSError, match="no engines registered"):  # both gone: nothing left to push to
            asyncio.run(pusher.push(model.state_dict(), 1))
        assert coordinator.engines == () and coordinator.version == 0
    finally:
        pusher.close()
