"""What a foreign client received, decoded on its side: prepended to the scripts the serving tests run in a
framework's venv (which has av, soundfile and Pillow, the env server's own needs). ``decoded(part)`` turns an
OpenAI content part with inline media into what decoding it gave (frames, pixels, samples); ``media(messages)``
does every part of a list of messages."""

import json
import subprocess
from pathlib import Path

import relax_gym
from relax_gym.envs.interop.frameworks import FRAMEWORKS
from relax_gym.envs.interop.venvs import ensure_venv
from relax_gym.envs.remote.server import EnvServer

CHECKOUT = str(Path(relax_gym.__file__).resolve().parent.parent)

DECODE = r'''
import base64, io
import av, soundfile
from PIL import Image


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


def media(messages):
    found = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else message.content
        for part in content if isinstance(content, list) else []:
            part = part if isinstance(part, dict) else part.model_dump()
            found += [d for d in [decoded(part)] if d]
    return found
'''

# (env id, the media kinds its episodes show: one set per medium, any of whose part types will do)
EPISODES = [("nextqa-video", [{"video_url"}]), ("echo-ink-agent", [{"image_url"}, {"audio_url", "input_audio"}])]


def assert_media(received: list[dict], kinds: list[set[str]]) -> None:
    """Each medium arrived as a part of its kind, and each decoded to something (frames, pixels, samples)."""
    types = {m["type"] for m in received}
    assert all(types & kind for kind in kinds), received
    for m in received:
        assert (m["frames"] >= 8 if m["type"] == "video_url" else min(m["size"]) > 0 if m["type"] == "image_url"
                else m["samples"] > 0), m


def run_against_our_server(scheme: str, script: str, env_id: str) -> dict:
    """``script`` run in ``scheme``'s venv with argv ``URL ENV_ID CHECKOUT`` while our env server serves ``env_id``
    on loopback; the JSON of its last line."""
    python = ensure_venv(FRAMEWORKS[scheme])
    server = EnvServer(env_id)
    server.start()
    try:
        run = subprocess.run([str(python), "-c", script, server.url, env_id, CHECKOUT], capture_output=True, text=True,
                             timeout=600)
    finally:
        server.close()
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
