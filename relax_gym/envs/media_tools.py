"""Building blocks for tools that look at media: argument types, range checks and budgets that answer the agent
with one clear error naming the offending argument, and small converters from arrays to media parts.

Every check raises :class:`~relax_gym.envs.tools.ToolError`; the tool machinery turns it into an ``Error: …`` tool
response, the episode goes on and the env counts it in ``info["tool_errors"]``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Annotated

import numpy as np
from PIL import Image
from pydantic import Field

from relax_gym.envs.tools import ToolError
from relax_gym.omni import ImagePart

#: A time in seconds as a tool argument: finite and >= 0 (pydantic reports violations by argument name).
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
#: A positive, finite rate (frames per second).
Rate = Annotated[float, Field(gt=0, allow_inf_nan=False)]
#: A pixel coordinate or size.
Pixels = Annotated[int, Field(ge=0)]


def check_span(start_s: float, end_s: float, duration_s: float, *, what: str, min_s: float = 0.0,
               max_s: float | None = None) -> None:
    """``0 <= start_s < end_s <= duration_s`` and ``min_s <= end_s - start_s <= max_s``, else a ToolError naming the
    argument at fault (``what`` is the medium: "clip", "audio")."""
    if start_s >= duration_s:
        raise ToolError(f"start_s={start_s:g} is at or past the end of the {what} ({duration_s:.2f} s); use 0 <= start_s < {duration_s:.2f}.")
    if end_s > duration_s + 1e-6:
        raise ToolError(f"end_s={end_s:g} is past the end of the {what} ({duration_s:.2f} s).")
    if end_s <= start_s:
        raise ToolError(f"end_s={end_s:g} must be greater than start_s={start_s:g}.")
    if end_s - start_s < min_s - 1e-9:
        raise ToolError(f"end_s - start_s = {end_s - start_s:g} s is shorter than the minimum span of {min_s:g} s.")
    if max_s is not None and end_s - start_s > max_s + 1e-9:
        raise ToolError(f"end_s - start_s = {end_s - start_s:g} s is longer than one call may cover ({max_s:g} s); split it into several calls.")


def check_time(name: str, t_s: float, duration_s: float, *, what: str) -> None:
    """``0 <= t_s < duration_s``, else a ToolError naming ``name``."""
    if t_s >= duration_s:
        raise ToolError(f"{name}={t_s:g} is at or past the end of the {what} ({duration_s:.2f} s); use 0 <= {name} < {duration_s:.2f}.")


def check_region(x: int, y: int, w: int, h: int, width: int, height: int, *, min_side: int = 4) -> None:
    """The rectangle ``(x, y, w, h)`` lies inside a ``width`` x ``height`` image and is at least ``min_side``
    pixels on each side, else a ToolError naming the argument at fault."""
    if x >= width:
        raise ToolError(f"x={x} lies outside the image (width {width}); use 0 <= x < {width}.")
    if y >= height:
        raise ToolError(f"y={y} lies outside the image (height {height}); use 0 <= y < {height}.")
    if w < min_side:
        raise ToolError(f"w={w} is below the smallest region side of {min_side} pixels.")
    if h < min_side:
        raise ToolError(f"h={h} is below the smallest region side of {min_side} pixels.")
    if x + w > width:
        raise ToolError(f"w={w}: the region x..x+w = {x}..{x + w} runs past the image's right edge ({width}).")
    if y + h > height:
        raise ToolError(f"h={h}: the region y..y+h = {y}..{y + h} runs past the image's bottom edge ({height}).")


@dataclass
class Budget:
    """How much of a medium an episode may look at: at most ``per_call`` units in one call and ``total`` in all
    (``unit`` names them in errors: "frames", "s of audio")."""

    total: float
    per_call: float
    unit: str
    used: float = 0.0

    @property
    def left(self) -> float:
        return max(self.total - self.used, 0.0)

    def check(self, amount: float, request: str, hint: str) -> None:
        """Raise a ToolError if ``request`` (the call as the agent wrote it) may not take ``amount``, saying which
        limit it breaks and how to fit (``hint`` names the arguments to change)."""
        if amount > self.per_call + 1e-9:
            raise ToolError(f"{request} needs {amount:g} {self.unit}, more than one call may take ({self.per_call:g}); {hint}.")
        if amount > self.left + 1e-9:
            raise ToolError(f"{request} needs {amount:g} {self.unit}, but only {self.left:g} of this episode's "
                            f"{self.total:g} are left; {hint}.")

    def take(self, amount: float) -> None:
        """Count ``amount`` as used (after :meth:`check` passed and the media decoded)."""
        self.used += amount

    def reset(self) -> None:
        self.used = 0.0


def png_image_part(array: np.ndarray, *, max_pixels: int) -> ImagePart:
    """An RGB array as a lossless PNG image part (compact in JSON and in engine requests; same pixels, same bytes)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array, dtype=np.uint8)).save(buf, format="PNG")
    return ImagePart.of(buf.getvalue(), mime="image/png", max_pixels=max_pixels)


def short_number(value: float) -> float | int:
    """A number as short as JSON can write it (``6.0`` -> ``6``), for gold tool calls the policy imitates."""
    return int(value) if float(value).is_integer() else value
