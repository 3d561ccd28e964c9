"""The OpenAI gateway (trainer/gateway/openai_gateway.py) and the trajectories built from its recordings
(trainer/rollout/program_episode.py): a real agent program on the openai client, the tiny policy behind the
embedded engine over HTTP, the gateway in front of the engine client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest

from relax_gym.envs.agent_program import (
    PYTHON,
    AgentEndpoint,
    AgentProgramEnv,
    ProgramOutcome,
    ProgramTask,
)
from relax_gym.trainer.engines.client import AsyncEngineClient
from relax_gym.trainer.rollout.program_episode import (
    ProgramEpisodes,
    split_segments,
    trajectory_from_calls,
)
from tests.trainer.engines.conftest import start, stop

# Two calls that extend each other, then the agent trims its history (a new segment) and extends that once more.
# The first call of each segment is streamed (the reply put together from its deltas), so the next call continues
# a streamed reply token-exactly.
AGENT = '''
from openai import OpenAI
c = OpenAI(max_retries=0)
def ask(msgs, stream=False):
    kw = dict(model="any", messages=msgs, max_tokens=500, temperature=0.0, extra_body={"top_k": 1, "min_p": 0.5})
    if stream:
        pieces = [e.choices[0].delta.content or "" for e in c.chat.completions.create(stream=True, **kw) if e.choices]
        return {"role": "assistant", "content": "".join(pieces)}
    r = c.chat.completions.create(**kw)
    return r.choices[0].message.model_dump(exclude_none=True)
msgs = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "one"}]
msgs += [ask(msgs, stream=True), {"role": "user", "content": "two"}]
ask(msgs)
msgs = [msgs[0], {"role": "user", "content": "again"}]
msgs += [ask(msgs, stream=True), {"role": "user", "content": "more"}]
ask(msgs)
'''
SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0}


class _Chatty(AgentProgramEnv):
    def _make_task(self, options):
        return ProgramTask(prompt="chat", argv=[PYTHON, "agent.py"], files={"agent.py": AGENT})

    def _score(self, run):
        return (1.0 if run.rc == 0 else 0.0), {"exit_ok": float(run.rc == 0)}


@pytest.fixture(scope="module")
def served_policy(policy):
    s = start(*policy)
    yield s
    stop(s)


def test_recorded_calls_become_the_trained_sequence(served_policy, monkeypatch):
    env = _Chatty(runner="local")
    streamed = []  # the engine requests the gateway streamed (over /generate's events)
    original = AsyncEngineClient._generate_streamed

    async def spy(self, payload, on_token):
        streamed.append(payload["input_ids"])
        return await original(self, payload, on_token)

    monkeypatch.setattr(AsyncEngineClient, "_generate_streamed", spy)

    async def main():
        client = AsyncEngineClient(served_policy.server.url)
        programs = ProgramEpisodes(served_policy.processor)
        try:
            gateway = programs.gateway(client, SAMPLING)
            session, key = gateway.open_session()
            outcome = await asyncio.to_thread(env.run_program, seed=0, endpoint=AgentEndpoint(gateway.base_url, key))
            anonymous = await asyncio.to_thread(httpx.post, f"{gateway.base_url}/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
            assert anonymous.status_code == 401, "the gateway answers episode keys only"
            calls, failures = gateway.close_session(session)
            assert failures == [] and gateway.close_session(session) == ([], []), "a closed session keeps nothing"
            return outcome, calls
        finally:
            programs.close()
            await client.aclose()

    outcome, calls = asyncio.run(main())
    assert outcome.status == "ok" and outcome.reward == 1.0, outcome
    assert len(calls) == 4 and all(len(c.completion_ids) <= SAMPLING["max_new_tokens"] for c in calls), \
        "the trainer's max_new_tokens caps the agent's max_tokens"
    assert all(c.sampling["temperature"] == 1.0 for c in calls), "the trainer's temperature replaces the agent's 0.0"
    assert all(c.sampling["top_k"] == -1 and c.sampling["min_p"] == 0.0 for c in calls), "and its top_k / min_p 1 / 0.5"
    first, second, third, fourth = calls
    assert streamed == [first.prompt_ids, third.prompt_ids], "the agent's streamed calls were streamed from the engine"
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == first.prompt_ids + first.completion_ids
    assert [len(s) for s in split_segments(calls)] == [2, 2]
    traj = trajectory_from_calls(calls, outcome, seed=0, group_id=3)
    assert traj.input_ids == fourth.prompt_ids + fourth.completion_ids, "the trained ids are the recorded ones"
    trained = [i for i, m in zip(traj.input_ids, traj.loss_mask) if m]
    assert trained == third.completion_ids + fourth.completion_ids
    at = len(third.prompt_ids)
    assert traj.rollout_logprobs[at: at + len(third.completion_ids)] == pytest.approx(third.logprobs)
    assert traj.info["agent_segments"] == 2
    assert traj.info["agent_untrained_tokens"] == len(first.completion_ids) + len(second.completion_ids)
    assert traj.trainable and traj.turns == 2 and traj.group_id == 3


# An agent on an API this gateway does not serve: OpenAI's legacy text completions
COMPLETIONS_AGENT = '''
import sys
from openai import OpenAI
try:
    OpenAI(max_retries=0).completions.create(model="any", prompt="hi")
except Exception as exc:
    sys.exit(f"the model call failed: {type(exc).__name__}")
'''


class _OnCompletions(_Chatty):
    def _make_task(self, options):
        return ProgramTask(prompt="chat", argv=[PYTHON, "agent.py"], files={"agent.py": COMPLETIONS_AGENT})


def test_an_agent_that_made_no_call_is_told_by_its_first_refused_request_and_its_stderr(served_policy):
    """The episode names what the agent tripped on (the gateway's first refusal of its key), its exit status and
    the end of its stderr; the record keeps them."""
    async def main():
        client = AsyncEngineClient(served_policy.server.url)
        programs = ProgramEpisodes(served_policy.processor)
        try:
            return await programs.run(_OnCompletions(runner="local"), client, seed=0, group_id=0, sampling_params=SAMPLING)
        finally:
            programs.close()
            await client.aclose()

    traj = asyncio.run(main())
    assert traj.status == "env_error" and not traj.trainable
    assert "no model call (nothing to train on): it exited with status 1; its first refused request: 404 for POST " \
           "/v1/completions: no endpoint '/v1/completions'" in traj.error, traj.error
    assert traj.error.endswith("stderr ends: the model call failed: NotFoundError")
    assert traj.info["agent_first_http_error"].startswith("404 for POST /v1/completions")
    assert traj.info["agent_stderr_tail"].strip() == "the model call failed: NotFoundError" and traj.info["agent_rc"] == 1


def _call(prompt, completion, logprobs=None):
    return SimpleNamespace(prompt_ids=prompt, completion_ids=completion, logprobs=logprobs or [-0.5] * len(completion),
                           weight_version="7", mm={})


def test_segments_split_where_a_prompt_stops_extending_the_sequence():
    a = _call([1, 2], [3])
    b = _call([1, 2, 3, 9], [4, 5])
    c = _call([1, 2, 8], [6])  # rewrote history after token 2
    assert [len(s) for s in split_segments([a, b, c])] == [2, 1]
    assert [len(s) for s in split_segments([])] == []


def test_an_agent_that_never_called_the_model_is_masked():
    traj = trajectory_from_calls([], ProgramOutcome(0.1, {"format": 1.0}, "ok"), seed=1, group_id=0)
    assert traj.status == "env_error" and not traj.trainable and "no model call" in traj.error
    # why, from the program's run: its time-out or exit status and the end of its stderr
    late = trajectory_from_calls([], ProgramOutcome(0.0, {}, "truncated", info={
        "agent_timed_out": True, "agent_rc": None, "agent_seconds": 120.0, "agent_stderr_tail": "a\nb\nimporting openai"}),
        seed=1, group_id=0)
    assert late.error.endswith("no model call (nothing to train on): it timed out after 120.0 s; stderr ends: a | b | "
                               "importing openai")
    crashed = trajectory_from_calls([], ProgramOutcome(0.0, {}, "ok", info={"agent_rc": 1, "agent_timed_out": False}),
                                    seed=1, group_id=0)
    assert crashed.error.endswith(": it exited with status 1")
    failed = trajectory_from_calls([_call([1], [2])], ProgramOutcome(0.0, {}, "env_error", "sandbox gone"), seed=1, group_id=0)
    assert failed.status == "env_error" and failed.error == "sandbox gone" and not failed.trainable


def test_an_engine_failure_during_the_episode_masks_it():
    traj = trajectory_from_calls([_call([1], [2])], ProgramOutcome(0.0, {}, "ok"), seed=1, group_id=0,
                                 failures=["EngineHTTPError: 503 engine restarting"])
    assert traj.status == "engine_error" and not traj.trainable and "503" in traj.error


def test_a_call_that_ends_after_its_session_closed_is_not_kept():
    from relax_gym.trainer.gateway.api import SessionRecorder

    recorder = SessionRecorder()
    recorder.record("ep", request_id="r0", created=0.0, prompt_ids=[1], completion_ids=[2], logprobs=[-0.1], media=(),
                    text="a", finish_reason="stop", weight_version=None)
    recorder.fail("ep", "RuntimeError: boom")
    calls, failures = recorder.close("ep")
    assert len(calls) == 1 and failures == ["RuntimeError: boom"]
    recorder.record("ep", request_id="r1", created=0.0, prompt_ids=[1], completion_ids=[3], logprobs=[-0.1], media=(),
                    text="b", finish_reason="stop", weight_version=None)
    recorder.fail("ep", "late")
    assert recorder.sessions() == {} and recorder.close("ep") == ([], [])


def test_a_timed_out_program_is_trained_with_its_score():
    traj = trajectory_from_calls([_call([1, 2], [3, 4], [-0.1, float("-inf")])], ProgramOutcome(0.0, {}, "truncated"),
                                 seed=1, group_id=0)
    assert traj.status == "truncated" and traj.trainable
    assert traj.loss_mask == [0, 0, 1, 1] and traj.rollout_logprobs == [0.0, 0.0, -0.1, 0.0]
    assert traj.weight_versions == ["7"]
