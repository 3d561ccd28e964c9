"""Our envs as verifiers environments: verifiers' own evaluation (``Environment.evaluate``, in the verifiers venv)
of ``vf.load_environment("relax_gym.envs.interop.verifiers_serve", env=..., url=...)`` completes episodes of
``nextqa-video`` and ``echo-ink-agent`` served by our env server, with a client that answers each model call with
the episode's next gold action. Asserted on what that client received: the clip's frames, the picture's pixels and
the sound's samples decode there, and every episode earns the env's maximum."""

from __future__ import annotations

import pytest

from .media_probe import DECODE, EPISODES, assert_media, run_against_our_server

# runs in the verifiers venv (this checkout appended to its path)
EVALUATE = DECODE + r'''
import json, sys
sys.path.append(sys.argv[3])
import verifiers.legacy as vf

received = []


class Oracle(vf.Client):
    """Answers each model call with the episode's next gold action (state["relax_gold"])."""
    def setup_client(self, config): return None
    async def to_native_tool(self, tool): return tool
    async def to_native_prompt(self, messages): return messages, {}
    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        received.extend(media(prompt))
        return kwargs["state"]["relax_gold"]
    async def raise_from_native_response(self, response): return None
    async def from_native_response(self, response):
        message = vf.ResponseMessage(content=response, finish_reason="stop", is_truncated=False)
        return vf.Response(id="oracle", created=0, model="oracle", message=message)
    async def close(self): return None


env = vf.load_environment("relax_gym.envs.interop.verifiers_serve", env=sys.argv[2], url=sys.argv[1], episodes=2)
out = env.evaluate_sync(client=Oracle(object()), model="oracle", num_examples=2, rollouts_per_example=1)
print(json.dumps({"rewards": [r["reward"] for r in out["outputs"]], "errors": [r.get("error") for r in out["outputs"]],
                  "received": received}, default=str))
'''


@pytest.mark.parametrize("env_id, kinds", EPISODES)
def test_verifiers_own_evaluation_completes_our_episodes_with_their_media(env_id, kinds):
    got = run_against_our_server("verifiers", EVALUATE, env_id)
    assert got["rewards"] == [1.0, 1.0] and got["errors"] == [None, None], got
    assert_media(got["received"], kinds)
