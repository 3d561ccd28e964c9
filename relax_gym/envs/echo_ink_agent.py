"""``echo-ink-agent``: audio-visual multiple choice (AVQA-R1-6K layout) where the agent listens and looks through
tools.

The first observation holds the image at low resolution (``overview_max_pixels``) and only the first
``excerpt_s`` seconds of the audio, with the full sizes and duration stated, then the question and its options.
Two tools look closer:

- ``listen(start_s, end_s)`` returns that span of the audio (at least ``min_listen_s``, at most
  ``max_listen_s`` per call and ``listen_budget_s`` per episode);
- ``zoom(x, y, w, h)`` returns that region of the image at full detail (capped at ``zoom_max_pixels``).

Bad arguments (a span outside the audio, a region outside the image, a budget exceeded) are answered with one tool
error naming the argument, and the episode goes on. The gold plan listens to the audio (as much as one call may)
and zooms on the whole image, then answers. Reward: accuracy + format, minus the optional ``call_cost`` per call
beyond ``free_calls``.

The bundled sample (``avqa-agent``, see :func:`relax_gym.envs.synth.write_avqa_agent_sample`) puts what decides the
answer after the default one-second excerpt (the beeps, the second tone) or in details the low-resolution
overview smears (small red circles among orange ones).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from relax_gym.envs.datasets import McqSample
from relax_gym.envs.mcq_agent import McqAgentEnv, call_action
from relax_gym.envs.media_tools import Budget, Pixels, Seconds, check_region, check_span, png_image_part, short_number
from relax_gym.envs.tools import ToolOutput, tool
from relax_gym.omni import AudioPart, AudioSampling, ImagePart, ImageSampling, MediaSource, TextPart
from relax_gym.omni.decode import fit_pixels
from relax_gym.omni.parts import Part

DEFAULT_DATASET = {"format": "r1json", "split": "valid", "sample": "avqa-agent"}
FULL_RESOLUTION = 8192 * 8192  # "no limit" for the copy the zoom tool cuts from
MIN_ZOOM_SIDE = 4


@tool
def listen(ctx: EchoInkAgentEnv, start_s: Seconds, end_s: Seconds) -> ToolOutput:
    """Listen to a span of the audio.

    Args:
        start_s: where the span starts, in seconds from the start of the audio.
        end_s: where it ends, in seconds (greater than start_s, at most the audio's duration).
    """
    return ctx.listen(start_s, end_s)


@tool
def zoom(ctx: EchoInkAgentEnv, x: Pixels, y: Pixels, w: Pixels, h: Pixels) -> ToolOutput:
    """Show a region of the image at full detail.

    Args:
        x: left edge of the region, in pixels of the full-size image.
        y: top edge of the region, in pixels.
        w: width of the region, in pixels (at least 4).
        h: height of the region, in pixels (at least 4).
    """
    return ctx.zoom(x, y, w, h)


class EchoInkAgentEnv(McqAgentEnv):
    media_kinds = ("image", "audio")

    def __init__(self, *, dataset: dict[str, Any] | None = None, excerpt_s: float = 1.0, overview_max_pixels: int = 32 * 32,
                 zoom_max_pixels: int = 224 * 224, min_listen_s: float = 0.1, max_listen_s: float = 10.0,
                 listen_budget_s: float = 30.0, sample_rate: int = 16_000, max_turns: int = 4, **kwargs: Any) -> None:
        if excerpt_s <= 0 or overview_max_pixels < 1 or zoom_max_pixels < 1 or not 0 < min_listen_s <= max_listen_s <= listen_budget_s:
            raise ValueError("need excerpt_s > 0, positive pixel limits and 0 < min_listen_s <= max_listen_s <= listen_budget_s")
        super().__init__([listen, zoom], dataset=dataset or DEFAULT_DATASET, max_turns=max_turns, **kwargs)
        self.excerpt_s = float(excerpt_s)
        self.overview_max_pixels = overview_max_pixels
        self.zoom_max_pixels = zoom_max_pixels
        self.min_listen_s = float(min_listen_s)
        self.sample_rate = sample_rate
        self.seconds = Budget(total=listen_budget_s, per_call=max_listen_s, unit="s of audio")
        self.audio = MediaSource.of(self.samples[0].media["audio"])
        self.picture = np.zeros((1, 1, 3), np.uint8)
        self.audio_s = 0.0

    # -- opening ------------------------------------------------------------------------------------------

    def _open(self, sample: McqSample) -> list[Part]:
        self.seconds.reset()
        self.audio = MediaSource.of(sample.media["audio"])
        image = MediaSource.of(sample.media["image"])
        self.picture = ImagePart(image, ImageSampling(max_pixels=FULL_RESOLUTION)).decode()
        self.audio_s = AudioPart(self.audio, AudioSampling(sample_rate=self.sample_rate)).decode().duration_s
        height, width = self.picture.shape[:2]
        shown_w, shown_h = fit_pixels(width, height, self.overview_max_pixels)
        excerpt = min(self.excerpt_s, self.audio_s)
        parts: list[Part] = [
            TextPart(f"An image of {width}x{height} pixels, shown here at {shown_w}x{shown_h}:"),
            ImagePart(image, ImageSampling(max_pixels=self.overview_max_pixels)),
            TextPart(f"\nThe first {excerpt:.2f} s of a {self.audio_s:.2f} s audio clip:"),
            AudioPart(self.audio, AudioSampling(sample_rate=self.sample_rate, end_s=excerpt)),
        ]
        if self.tools_enabled:
            parts.append(TextPart(f"\nTools: listen(start_s, end_s) plays a span of the audio ({self.min_listen_s:g} to "
                                  f"{self.seconds.per_call:g} s per call, {self.seconds.total:g} s in all); zoom(x, y, w, h) "
                                  "shows a region of the image at full detail."))
        return parts

    def _gold_calls(self, sample: McqSample) -> list[str]:
        end = math.floor(min(self.audio_s, self.seconds.per_call) * 100) / 100
        height, width = self.picture.shape[:2]
        return [
            call_action("listen", {"start_s": 0, "end_s": short_number(end)}, "The excerpt is too short; listen to the audio."),
            call_action("zoom", {"x": 0, "y": 0, "w": width, "h": height}, "Look at the image in full detail."),
        ]

    # -- tools --------------------------------------------------------------------------------------------

    def listen(self, start_s: float, end_s: float) -> ToolOutput:
        check_span(start_s, end_s, self.audio_s, what="audio", min_s=self.min_listen_s, max_s=self.seconds.per_call)
        self.seconds.check(end_s - start_s, f"listen(start_s={start_s:g}, end_s={end_s:g})", "shorten end_s - start_s")
        part = AudioPart(self.audio, AudioSampling(sample_rate=self.sample_rate, start_s=start_s, end_s=end_s))
        part.decode()
        self.seconds.take(end_s - start_s)
        return ToolOutput(text=f"the audio from {start_s:.2f} s to {end_s:.2f} s ({self.seconds.left:.2f} s of "
                               f"{self.seconds.total:g} s left):", parts=[part])

    def zoom(self, x: int, y: int, w: int, h: int) -> ToolOutput:
        height, width = self.picture.shape[:2]
        check_region(x, y, w, h, width, height, min_side=MIN_ZOOM_SIDE)
        crop = self.picture[y : y + h, x : x + w]
        part = png_image_part(crop, max_pixels=self.zoom_max_pixels)
        shown_w, shown_h = fit_pixels(w, h, self.zoom_max_pixels)
        return ToolOutput(text=f"region x={x}..{x + w}, y={y}..{y + h}, shown at {shown_w}x{shown_h}:", parts=[part])
