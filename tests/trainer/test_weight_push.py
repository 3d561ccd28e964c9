"""The DCS pusher drops an engine whose replica is gone (unreachable at the pause step) and pushes again (when
all are gone, there is nothing to push to until their replacements register); the colocated embedded engine is pushed to in process."""

from __future__ import annotations

import asyncio
import socket

import pytest

from relax_gym.trainer.engines.settings import InferenceSection
from relax_gym.trainer.dcs import DCSCoordinator, DCSError, checkpoint_names
from relax_gym.trainer.dcs.push import DCSPush, LocalPush, in_thread, make_pusher, weight_transport
from relax_gym.trainer.policy import build_policy


def dead_url() -> str:
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_unreachable_engines_are_removed_before_the_push_is_retried():
    model, _ = build_policy()
    coordinator = DCSCoordinator([dead_url(), dead_url()], transport="disk")
    pusher = in_thread(make_pusher(InferenceSection(), names=checkpoint_names(model), coordinator=coordinator))
    assert isinstance(pusher.pusher, DCSPush)
    try:
        # both died during the push: nothing is left to push to, which is not the actor's failure (replaced engines
        # register again and ask the actor for the weights it pushed last)
        report = asyncio.run(pusher.push(model.state_dict(), 1))
        assert (report.engines, report.bytes, report.version) == (0, 0, 1)
        assert coordinator.engines == () and coordinator.version == 0
        with pytest.raises(DCSError, match="no engines registered"):  # none at the start: a configuration error
            asyncio.run(pusher.push(model.state_dict(), 2))
    finally:
        pusher.close()


def test_a_colocated_embedded_engine_is_pushed_to_in_process():
    import copy

    from relax_gym.trainer.engines.embedded import EmbeddedEngine

    model, processor = build_policy()
    inference = InferenceSection()
    assert weight_transport(inference) == "tcp"
    assert weight_transport(InferenceSection.model_validate({"engine": "sglang"})) == "nccl"
    with EmbeddedEngine(copy.deepcopy(model), processor) as engine:
        pusher = make_pusher(inference, engine=engine, urls=["http://unused"])
        assert isinstance(pusher, LocalPush)
        state = {k: v.detach().clone() + 0.5 for k, v in model.state_dict().items()}
        report = pusher.push(state, 3)
        assert report.version == 3 and report.transport == "local" and report.bytes > 0
        assert engine.weight_version == "3"
        key = next(iter(state))
        from relax_gym.trainer.engines.admin_protocol import tensor_digest

        assert engine.weights_checksum([key])[key] == tensor_digest(state[key])
        pusher.close()
