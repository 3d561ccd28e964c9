"""``image-zoom``: omni tool use. A 256x256 picture hides a small coloured square; the observation shows the picture
at low resolution (the square's colour is lost in the downscale), and a ``zoom(x, y, w, h)`` tool returns the
region at full detail as a new image part. Multiple choice: the square's colour. Needs no sandbox. The answer's
reward context: ``gold_letter``, ``options``, ``question`` and ``gold`` (the colour's name).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from PIL import Image

from relax_gym.envs.rewards import LETTERS, answer_letter
from relax_gym.envs.tool_env import Task, ToolEnv
from relax_gym.envs.tools import ToolError, ToolOutput, tool
from relax_gym.omni import ImagePart, TextPart

SIZE = 256
SQUARE = 6
COLOURS = {"red": (225, 30, 30), "green": (30, 190, 40), "blue": (35, 60, 235), "yellow": (235, 220, 30)}
OVERVIEW_PIXELS = 48 * 48
ZOOM_OUT = 96  # zoomed crops are shown at up to 96x96


@tool
def zoom(ctx: ImageZoomEnv, x: int, y: int, w: int, h: int) -> ToolOutput:
    """Show a region of the original 256x256 image at full detail.

    Args:
        x: left edge of the region, in pixels of the original image.
        y: top edge of the region, in pixels.
        w: width of the region, 4 to 256 pixels.
        h: height of the region, 4 to 256 pixels.
    """
    if not (0 <= x < SIZE and 0 <= y < SIZE):
        raise ToolError(f"(x, y) = ({x}, {y}) lies outside the {SIZE}x{SIZE} image.")
    if not (4 <= w <= SIZE and 4 <= h <= SIZE):
        raise ToolError("w and h must be between 4 and 256.")
    crop = ctx.picture[y : min(y + h, SIZE), x : min(x + w, SIZE)]
    scale = max(1, ZOOM_OUT // max(crop.shape[:2]))
    big = np.asarray(Image.fromarray(crop).resize((crop.shape[1] * scale, crop.shape[0] * scale), Image.Resampling.NEAREST))
    part = ImagePart.of(np.ascontiguousarray(big), max_pixels=ZOOM_OUT * ZOOM_OUT)
    return ToolOutput(text=f"region x={x}..{x + crop.shape[1]}, y={y}..{y + crop.shape[0]}:", parts=[part])


class ImageZoomEnv(ToolEnv):
    media_kinds = ("image",)

    def __init__(self, *, max_turns: int = 4, **kwargs: Any) -> None:
        super().__init__([zoom], max_turns=max_turns, **kwargs)
        self.picture = np.zeros((SIZE, SIZE, 3), np.uint8)
        self.options: list[str] = []
        self.gold_letter = "A"

    def _make_task(self, options: dict[str, Any]) -> Task:
        rng = self.np_random
        picture = rng.integers(150, 215, size=(SIZE, SIZE, 3), dtype=np.uint8)  # light, noisy background
        colour = list(COLOURS)[int(rng.integers(len(COLOURS)))]
        x, y = (int(v) for v in rng.integers(8, SIZE - 8 - SQUARE, size=2))
        picture[y : y + SQUARE, x : x + SQUARE] = COLOURS[colour]
        self.picture = picture
        self.options = [str(c) for c in rng.permutation(list(COLOURS))]
        self.gold_letter = LETTERS[self.options.index(colour)]
        lettered = "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(self.options))
        question = (f"A small coloured square is hidden in this {SIZE}x{SIZE} image (shown here at low resolution). "
                    f"What colour is it?\nOptions:\n{lettered}\nUse the zoom tool to look closer.")
        gx, gy = max(0, x - 10), max(0, y - 10)
        call = json.dumps({"name": "zoom", "arguments": {"x": gx, "y": gy, "w": 26, "h": 26}})
        return Task(
            prompt=[ImagePart.of(picture, max_pixels=OVERVIEW_PIXELS), TextPart(question)],
            gold_calls=[f"<think>The square is near ({x}, {y}).</think><tool_call>{call}</tool_call>"],
            gold_answer=f"<think>The zoomed region shows a {colour} square.</think><answer>{self.gold_letter}</answer>",
            info={"square_xy": (x, y), "colour": colour},
            reward_context={"gold_letter": self.gold_letter, "options": list(self.options), "question": question, "gold": colour},
        )

    def _accuracy(self, answer: str) -> float:
        return 1.0 if answer_letter(answer, self.options) == self.gold_letter else 0.0
