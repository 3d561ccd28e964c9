"""Our envs as verifiers environments: verifiers' own evaluation (``Environment.evaluate``, in the verifiers venv)
of ``vf.load_environment("relax_gym.envs.interop.verifiers_serve", env=..., url=...)`` completes episodes of
``nextqa-video`` and ``echo-ink-agent`` served by our env server, with a client that answers each model call with
the episode's next gold action. Asserted on what that client received: the clip's frames, the picture's pixels and
the sound's samples decode there, and every episode earns the env's maximum."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import relax_gym
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote.server import EnvServer

CHECKOUT = str(Path(relax_gym.__file__).resolve().parent.parent)

# runs in the verifiers venv (this checkout appended to its path)
EVALUATE = r'''
import base64, io, json, sys
sys.path.append(sys.argv[3])
import av, soundfile
from PIL import Image
import verifiers.legacy as vf

received = []

def decoded(part):
    kind = part["type"]
    if kind == "input_audio":
        return {"type": kind, "samples": len(soundfile.read(io.BytesIO(base64.b64decode(part["input_audio"]["data"])))[0])}
    if kind not in ("image_url", "video_url", "audio_url"):
        return None
    raw = base64.b64decode(part[kind]["url"].split(",", 1)[1])
    if kind == "image_url":
        return {"type": kind, "size": list(Image.open(io.BytesIO(raw)).size)}
    if kind == "video_url":
        with av.open(io.BytesIO(raw)) as clip:
            return {"type": kind, "frames": sum(1 for _ in clip.decode(video=0))}
    return {"type": kind, "samples": len(soundfile.read(io.BytesIO(raw))[0])}


class Oracle(vf.Client):
    """Answers each model call with the episode's next gold action (state["relax_gold"])."""
    def setup_client(self, config): return None
    async def to_native_tool(self, tool): return tool
    async def to_native_prompt(self, messages): return messages, {}
    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        for message in prompt:
            content = message.get("content") if isinstance(message, dict) else message.content
            for part in content if isinstance(content, list) else []:
                part = part if isinstance(part, dict) else part.model_dump()
                found = decoded(part)
                if found:
                    received.append(found)
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


@pytest.mark.parametrize("env_id, kinds", [("nextqa-video", [{"video_url"}]),
                                           ("echo-ink-agent", [{"image_url"}, {"audio_url", "input_audio"}])])
def test_verifiers_own_evaluation_completes_our_episodes_with_their_media(env_id, kinds):
    python = ensure_venv(FRAMEWORKS["verifiers"])
    server = EnvServer(env_id)
    server.start()
    try:
        run = subprocess.run([str(python), "-c", EVALUATE, server.url, env_id, CHECKOUT], capture_output=True,
                             text=True, timeout=600)
    finally:
        server.close()
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["rewards"] == [1.0, 1.0] and got["errors"] == [None, None], got
    types = {m["type"] for m in got["received"]}
    assert all(types & kind for kind in kinds), got["received"]
    for m in got["received"]:
        assert (m["frames"] >= 8 if m["type"] == "video_url" else min(m["size"]) > 0 if m["type"] == "image_url"
                else m["samples"] > 0), m
