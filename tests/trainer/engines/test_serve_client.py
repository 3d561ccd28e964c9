"""The env workers' client of the inference deployment: coalesced handle calls with dict bodies, errors as over HTTP."""

from __future__ import annotations

import asyncio

import pytest

from relax_gym.trainer.engines.client import EngineConnectionError, EngineHTTPError
from relax_gym.trainer.engines.serve_client import HandleEngineClient


class RayActorDied(RuntimeError):
    pass


RayActorDied.__module__ = "ray.exceptions"  # what the client treats as "the replica could not answer"


def answer(ids, version="3"):
    return {"text": "", "output_ids": list(ids), "meta_info": {"weight_version": version, "prompt_tokens": 1,
                                                               "completion_tokens": len(ids), "finish_reason": {"type": "length"}}}


class FakeRole:
    """``handle.generate.remote(body)`` as a Serve handle answers it (an awaitable)."""

    def __init__(self, refuse=None, die=0):
        self.bodies, self.refuse, self.die = [], refuse, die
        self.generate = self

    def remote(self, body):
        self.bodies.append(body)

        async def call():
            if self.die:
                self.die -= 1
                raise RayActorDied("replica died")
            ids = body["input_ids"]
            if isinstance(ids[0], list):
                if self.refuse is not None and any(row == self.refuse for row in ids):
                    return 400, "bad request in the batch"
                return 200, [answer(row) for row in ids]
            if ids == self.refuse:
                return 400, "bad request"
            return 200, answer(ids)

        return call()


def test_concurrent_calls_become_one_handle_call_with_a_dict_body():
    role = FakeRole()

    async def main():
        client = HandleEngineClient(role)
        return await asyncio.gather(*(client.generate([i, i + 1], sampling_params={"max_new_tokens": 2}) for i in range(5)))

    outs = asyncio.run(main())
    assert [o.output_ids for o in outs] == [[i, i + 1] for i in range(5)]
    assert all(o.weight_version == "3" for o in outs)
    assert len(role.bodies) == 1 and isinstance(role.bodies[0], dict)
    assert role.bodies[0]["input_ids"] == [[i, i + 1] for i in range(5)]


def test_a_refused_batch_is_resent_alone_and_only_the_culprit_fails():
    role = FakeRole(refuse=[9, 9])

    async def main():
        client = HandleEngineClient(role)
        return await asyncio.gather(client.generate([1, 2]), client.generate([9, 9]), return_exceptions=True)

    good, bad = asyncio.run(main())
    assert good.output_ids == [1, 2]
    assert isinstance(bad, EngineHTTPError) and bad.status_code == 400 and "bad request" in bad.message


def test_unanswered_calls_are_retried_then_reported_as_connection_errors():
    async def main(role, retries):
        client = HandleEngineClient(role, retries=retries, backoff_s=0.001, coalesce=False)
        return await client.generate([1])

    assert asyncio.run(main(FakeRole(die=2), retries=2)).output_ids == [1]
    with pytest.raises(EngineConnectionError, match="unreachable"):
        asyncio.run(main(FakeRole(die=5), retries=1))


class FakeStreamingRole:
    """``handle.options(stream=True).generate_stream.remote(body)`` as a Serve streaming call answers it (an async
    generator of the role's items); ``die_after``: a Ray failure after that many tokens."""

    def __init__(self, status=200, die_after=None):
        self.status, self.die_after, self.bodies = status, die_after, []
        self.generate_stream = self

    def options(self, stream=False):
        assert stream is True
        return self

    def remote(self, body):
        self.bodies.append(body)

        async def items():
            for i, token in enumerate(body["input_ids"]):
                if self.die_after is not None and i == self.die_after:
                    raise RayActorDied("replica died mid-stream")
                yield ("token", token)
            yield ("done", self.status, answer(body["input_ids"]) if self.status == 200 else "bad request")

        return items()


def test_a_streamed_call_hands_out_each_token_and_answers_like_a_plain_call():
    role = FakeStreamingRole()
    seen = []

    async def main():
        return await HandleEngineClient(role).generate([4, 5, 6], sampling_params={"max_new_tokens": 3},
                                                       on_token=seen.append)

    out = asyncio.run(main())
    assert seen == [4, 5, 6] == out.output_ids and out.weight_version == "3"
    assert len(role.bodies) == 1 and role.bodies[0]["input_ids"] == [4, 5, 6]  # alone, not batched


def test_a_refused_stream_raises_the_status_and_a_lost_one_is_not_resent():
    async def main(role):
        return await HandleEngineClient(role, retries=3, backoff_s=0.001).generate([1, 2], on_token=lambda t: None)

    with pytest.raises(EngineHTTPError) as err:
        asyncio.run(main(FakeStreamingRole(status=400)))
    assert err.value.status_code == 400 and "bad request" in err.value.message
    lost = FakeStreamingRole(die_after=1)
    with pytest.raises(EngineConnectionError, match="lost a streamed request"):
        asyncio.run(main(lost))
    assert len(lost.bodies) == 1, "a stream that handed out tokens is never sent twice"
