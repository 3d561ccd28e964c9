"""Media an agent program sends reach the policy exactly as an env's media would, through each of the three APIs.

One picture, one clip of sound and one short video (PNG, WAV, MP4 as ``data:`` URLs: what a program in a sandbox can
send, its files being out of the server's reach) go to the embedded engine's endpoint over loopback HTTP as each API
spells them:

- Chat Completions: ``image_url``, ``input_audio`` (base64 WAV), ``video_url`` (the vLLM / SGLang extension);
- Responses: ``input_image``, ``input_audio``, and the video as the same ``video_url`` part (the API has none);
- Messages (Anthropic): an ``image`` block with a base64 source (the API has no audio or video block).

Each call's prompt ids are those of the env side's render of the same conversation (``relax_gym.omni.render`` with
the engine's processor, the parts as an env builds them from the same bytes), its media pad tokens included, and
the session records the media.
"""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import soundfile
from PIL import Image

from relax_gym.omni import AudioPart, ImagePart, Message, TextPart, VideoPart
from relax_gym.omni.render import render
from relax_gym.trainer.gateway.api import SESSION_HEADER

from .test_openai_api import http  # noqa: F401 - the fixture (an httpx client of the served engine)


def png_bytes() -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def wav_bytes() -> bytes:
    t = np.arange(16_000) / 16_000
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16_000, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def mp4_bytes() -> bytes:
    """One second of a moving square, 64x48 at 8 fps, H.264."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=8)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(8):
            frame = np.zeros((48, 64, 3), dtype=np.uint8)
            frame[10:30, 4 + 6 * i:24 + 6 * i] = (200, 60, 30)
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


PNG, WAV, MP4 = png_bytes(), wav_bytes(), mp4_bytes()
B64 = {name: base64.b64encode(data).decode() for name, data in (("png", PNG), ("wav", WAV), ("mp4", MP4))}
QUESTION = "What do you see and hear?"


def env_side(served, *parts) -> list[int]:
    """The prompt ids of an env's observation holding the question and these parts (as every call here sends them),
    rendered by the engine's processor."""
    return render([Message("user", (TextPart(QUESTION), *parts))], served.processor).input_ids


def recorded(http, session: str) -> dict:
    (call,) = http.get(f"/v1/relax/sessions/{session}").json()["calls"]
    return call


def picture_sound_video() -> tuple:
    """The parts an env builds from the same bytes."""
    return ImagePart.of(PNG, mime="image/png"), AudioPart.of(WAV, mime="audio/wav"), VideoPart.of(MP4, mime="video/mp4")


def test_chat_completions_carries_an_image_audio_and_a_video_as_an_env_would(served, http):
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{B64['png']}"}},
               {"type": "input_audio", "input_audio": {"data": B64["wav"], "format": "wav"}},
               {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{B64['mp4']}"}}]
    r = http.post("/v1/chat/completions", headers={SESSION_HEADER: "media-chat"},
                  json={"model": "policy", "messages": [{"role": "user", "content": content}], "max_tokens": 2})
    assert r.status_code == 200, r.text
    ids = r.json()["prompt_token_ids"]
    assert ids == env_side(served, *picture_sound_video())
    for kind in ("image", "audio", "video"):
        assert ids.count(served.processor.media_token_ids[kind]) > 1, kind  # its pad tokens, expanded
    call = recorded(http, "media-chat")
    assert call["prompt_ids"] == ids and [m["type"] for m in call["media"]] == ["image_url", "input_audio", "video_url"]


def test_responses_carries_an_image_audio_and_a_video_as_an_env_would(served, http):
    content = [{"type": "input_text", "text": QUESTION},
               {"type": "input_image", "image_url": f"data:image/png;base64,{B64['png']}", "detail": "auto"},
               {"type": "input_audio", "input_audio": {"data": B64["wav"], "format": "wav"}},
               {"type": "video_url", "video_url": {"url": f"data:video/mp4;base64,{B64['mp4']}"}}]
    r = http.post("/v1/responses", headers={SESSION_HEADER: "media-responses"},
                  json={"model": "policy", "input": [{"role": "user", "content": content}], "max_output_tokens": 2})
    assert r.status_code == 200, r.text
    expected = env_side(served, *picture_sound_video())
    assert r.json()["usage"]["input_tokens"] == len(expected)
    assert recorded(http, "media-responses")["prompt_ids"] == expected


def test_messages_carries_an_image_as_an_env_would(served, http):
    content = [{"type": "text", "text": QUESTION},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": B64["png"]}}]
    r = http.post("/v1/messages", headers={SESSION_HEADER: "media-messages"},
                  json={"model": "policy", "max_tokens": 2, "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    expected = env_side(served, picture_sound_video()[0])
    assert r.json()["usage"]["input_tokens"] == len(expected)
    assert recorded(http, "media-messages")["prompt_ids"] == expected
