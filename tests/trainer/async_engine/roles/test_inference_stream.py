"""The inference role streams (``InferenceRole.generate_stream``, what a Serve streaming call runs): the embedded
engine's tokens one by one as it samples them, then the same answer :meth:`InferenceRole.generate` gives; a refused
request is its 400. The role object is used in process (its Serve handle's streaming is Ray's)."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.async_engine.roles.inference import InferenceRole
from relax_gym.trainer.policy import PolicyConfig


@pytest.fixture(scope="module")
def role():
    r = InferenceRole(PolicyConfig().model_dump(mode="json"), {"engine": "embedded"})
    yield r
    r.host.close()


def collect(role, body):
    async def main():
        return [item async for item in role.generate_stream(body)]

    return asyncio.run(main())


def test_tokens_come_one_by_one_then_the_answer_generate_gives(role):
    body = {"input_ids": [role.host.engine.processor.eos_token_id, 11, 12],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}, "return_logprob": True}
    items = collect(role, body)
    tokens = [t for kind, t, *_ in items if kind == "token"]
    (done,) = [item for item in items if item[0] == "done"]
    status, plain = asyncio.run(role.generate(body))
    assert items[-1] is done and done[1] == 200 and len(tokens) == 6
    assert tokens == done[2]["output_ids"] == plain["output_ids"] and status == 200


def test_a_refused_request_is_its_400_after_no_token(role):
    items = collect(role, {"input_ids": [10 ** 7], "sampling_params": {"max_new_tokens": 2}})
    assert len(items) == 1 and items[0][0] == "done" and items[0][1] == 400 and "vocabulary" in items[0][2]
