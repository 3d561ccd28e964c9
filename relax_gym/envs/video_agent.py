"""``nextqa-video-agent``: NExT-QA multiple choice where the agent watches the clip through tools.

The first observation holds a coarse overview — ``overview_frames`` keyframes as images, each labelled with its
time, and the clip's duration — then the question and its options. Two tools look closer:

- ``watch(start_s, end_s, fps)`` returns a video part of that span, sampled at ``fps`` (at most ``max_fps``);
- ``frame(t_s)`` returns the frame nearest to ``t_s`` as an image.

Frames are budgeted: one call may take at most ``max_frames_per_call`` and an episode ``frame_budget`` in all
(a ``frame`` costs one). A request over a limit, a span outside the clip or a bad value is answered with one
tool error naming the argument, and the episode goes on. The gold plan watches the whole clip once at the
densest rate one call allows, then answers. Reward: accuracy + format (``ToolEnv``), minus the optional
``call_cost`` per call beyond ``free_calls``.

The bundled sample (``nextqa-agent``, see :func:`relax_gym.envs.synth.write_nextqa_agent_sample`) is built so that
the answer happens between the default four keyframes: the overview alone leaves it at chance.
"""

from __future__ import annotations

import math
from typing import Any

from relax_gym.envs.datasets import McqSample
from relax_gym.envs.mcq_agent import McqAgentEnv, call_action
from relax_gym.envs.media_tools import Budget, Rate, Seconds, check_span, check_time, png_image_part, short_number
from relax_gym.envs.tools import ToolError, ToolOutput, tool
from relax_gym.omni import MediaSource, TextPart, VideoPart, VideoSampling
from relax_gym.omni.decode import sample_times
from relax_gym.omni.parts import Part

DEFAULT_DATASET = {"format": "nextqa", "split": "val", "sample": "nextqa-agent"}


@tool
def watch(ctx: NextQAVideoAgentEnv, start_s: Seconds, end_s: Seconds, fps: Rate = 2.0) -> ToolOutput:
    """Watch a span of the clip as video.

    Args:
        start_s: where the span starts, in seconds from the start of the clip.
        end_s: where it ends, in seconds (greater than start_s, at most the clip's duration).
        fps: frames per second to sample from the span; the frames count against the episode's frame budget.
    """
    return ctx.watch(start_s, end_s, fps)


@tool
def frame(ctx: NextQAVideoAgentEnv, t_s: Seconds) -> ToolOutput:
    """Look at one frame of the clip as an image.

    Args:
        t_s: the time of the frame, in seconds from the start of the clip.
    """
    return ctx.frame(t_s)


class NextQAVideoAgentEnv(McqAgentEnv):
    media_kinds = ("image", "video")

    def __init__(self, *, dataset: dict[str, Any] | None = None, overview_frames: int = 4, max_fps: float = 8.0,
                 max_frames_per_call: int = 16, frame_budget: int = 32, max_pixels: int = 224 * 224,
                 max_turns: int = 4, **kwargs: Any) -> None:
        if overview_frames < 1 or max_frames_per_call < 1 or frame_budget < 1 or max_fps <= 0 or max_pixels < 1:
            raise ValueError("overview_frames, max_frames_per_call, frame_budget, max_fps and max_pixels must be positive")
        super().__init__([watch, frame], dataset=dataset or DEFAULT_DATASET, max_turns=max_turns, **kwargs)
        self.overview_frames = overview_frames
        self.max_fps = float(max_fps)
        self.max_pixels = max_pixels
        self.frames = Budget(total=frame_budget, per_call=max_frames_per_call, unit="frames")
        self.video = MediaSource.of(self.samples[0].media["video"])
        self.duration_s = 0.0
        self.native_fps = 0.0

    # -- opening ------------------------------------------------------------------------------------------

    def _open(self, sample: McqSample) -> list[Part]:
        self.frames.reset()
        self.video = MediaSource.of(sample.media["video"])
        n = self.overview_frames
        overview = VideoPart(self.video, VideoSampling(fps=1000.0, min_frames=n, max_frames=n, max_pixels=self.max_pixels)).decode()
        self.duration_s, self.native_fps = overview.duration_s, overview.native_fps
        parts: list[Part] = [TextPart(
            f"A video clip of {self.duration_s:.2f} s ({self.native_fps:g} fps). {len(overview.frames)} keyframes from it:")]
        for picture, t in zip(overview.frames, overview.timestamps):
            parts += [TextPart(f"\nt={t:.2f}s "), png_image_part(picture, max_pixels=self.max_pixels)]
        if self.tools_enabled:
            parts.append(TextPart(
                f"\nTools: watch(start_s, end_s, fps) shows a span as video, frame(t_s) one frame; at most "
                f"{self.frames.per_call:g} frames per call and {self.frames.total:g} in all, fps up to {self.max_fps:g}."))
        return parts

    def _gold_calls(self, sample: McqSample) -> list[str]:
        end = math.floor(self.duration_s * 100) / 100
        limit = min(self.frames.per_call, self.frames.total)
        fps = max(math.floor(limit / end * 100) / 100, 0.01) if end > 0 else 1.0
        fps = min(fps, self.max_fps)
        args = {"start_s": 0, "end_s": short_number(end), "fps": short_number(fps)}
        return [call_action("watch", args, "The answer is between the keyframes; watch the whole clip.")]

    # -- tools --------------------------------------------------------------------------------------------

    def watch(self, start_s: float, end_s: float, fps: float) -> ToolOutput:
        check_span(start_s, end_s, self.duration_s, what="clip")
        if fps > self.max_fps:
            raise ToolError(f"fps={fps:g} is above the limit of {self.max_fps:g} frames per second.")
        probe = VideoSampling(fps=fps, min_frames=1, max_frames=10**6, start_s=start_s, end_s=end_s)
        count = len(sample_times(start_s, end_s, probe, self.native_fps))
        request = f"watch(start_s={start_s:g}, end_s={end_s:g}, fps={fps:g})"
        self.frames.check(count, request, "lower fps or shorten end_s - start_s")
        spec = VideoSampling(fps=fps, min_frames=1, max_frames=count, start_s=start_s, end_s=end_s, max_pixels=self.max_pixels)
        part = VideoPart(self.video, spec)
        video = part.decode()
        self.frames.take(len(video.frames))
        return ToolOutput(
            text=f"{len(video.frames)} frames from {video.timestamps[0]:.2f} s to {video.timestamps[-1]:.2f} s "
                 f"({self.frames.left:g} of {self.frames.total:g} frames left):",
            parts=[part],
        )

    def frame(self, t_s: float) -> ToolOutput:
        check_time("t_s", t_s, self.duration_s, what="clip")
        self.frames.check(1, f"frame(t_s={t_s:g})", "watch fewer frames")
        step = 1.0 / self.native_fps if self.native_fps > 0 else 0.04
        spec = VideoSampling(fps=1000.0, min_frames=1, max_frames=1, start_s=t_s,
                             end_s=min(t_s + step, self.duration_s), max_pixels=self.max_pixels)
        video = VideoPart(self.video, spec).decode()
        self.frames.take(1)
        return ToolOutput(text=f"the frame at {video.timestamps[0]:.2f} s ({self.frames.left:g} frames left):",
                          parts=[png_image_part(video.frames[0], max_pixels=self.max_pixels)])
