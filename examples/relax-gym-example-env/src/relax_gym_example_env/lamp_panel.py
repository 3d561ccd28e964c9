"""lamp-panel: count the lit lamps in one row of a panel, by looking at it through a tool.

The first observation shows the whole panel as a tiny image (too coarse to count lamps in) and asks how many
lamps are lit in one row. The agent calls look(row), which answers with a sharp image of that row, then answers
with an option letter. Everything is drawn from the episode's seed, so no data files are needed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from relax_gym.envs.rewards import LETTERS, answer_letter
from relax_gym.envs.tool_env import Task, ToolEnv
from relax_gym.envs.tools import ToolError, ToolOutput, tool
from relax_gym.omni import ImagePart, TextPart

ROWS, LAMPS, CELL = 3, 8, 16  # the panel: 3 rows of 8 lamps, 16 x 16 pixels per lamp
LIT, DARK, BACKGROUND = (250, 210, 40), (40, 40, 50), 90
OVERVIEW_PIXELS = 24 * 9  # the first look: the 128 x 48 panel shrunk to 24 x 9 pixels


def draw(lamps: np.ndarray) -> np.ndarray:
    """A (rows, lamps) boolean array as an RGB picture: one square per lamp, yellow when lit."""
    picture = np.full((lamps.shape[0] * CELL, lamps.shape[1] * CELL, 3), BACKGROUND, np.uint8)
    for r in range(lamps.shape[0]):
        for c in range(lamps.shape[1]):
            picture[r * CELL + 3:(r + 1) * CELL - 3, c * CELL + 3:(c + 1) * CELL - 3] = LIT if lamps[r, c] else DARK
    return picture


@tool
def look(ctx: LampPanelEnv, row: int) -> ToolOutput:
    """Take a sharp picture of one row of the panel.

    Args:
        row: the row to look at, 0 (top) to 2 (bottom).
    """
    if not 0 <= row < ROWS:
        raise ToolError(f"row must be between 0 and {ROWS - 1}, got {row}.")
    return ToolOutput(text=f"row {row}:", parts=[ImagePart.of(draw(ctx.lamps[row:row + 1]))])


class LampPanelEnv(ToolEnv):
    media_kinds = ("image",)

    def __init__(self, *, max_turns: int = 3, **kwargs: Any) -> None:
        super().__init__([look], max_turns=max_turns, **kwargs)
        self.lamps = np.zeros((ROWS, LAMPS), bool)
        self.options: list[str] = []
        self.gold_letter = "A"

    def _make_task(self, options: dict[str, Any]) -> Task:
        rng = self.np_random  # seeded by reset(seed=...): same seed, same episode
        self.lamps = rng.random((ROWS, LAMPS)) < 0.5
        row = int(rng.integers(ROWS))
        count = int(self.lamps[row].sum())
        wrong = rng.choice([n for n in range(LAMPS + 1) if n != count], size=3, replace=False)
        self.options = [str(n) for n in rng.permutation([count, *wrong])]
        self.gold_letter = LETTERS[self.options.index(str(count))]
        lettered = "\n".join(f"{LETTERS[i]}. {option}" for i, option in enumerate(self.options))
        question = (f"This panel has {ROWS} rows of {LAMPS} lamps. How many lamps are lit in row {row} "
                    f"(0 is the top row)?\nOptions:\n{lettered}\nCall look(row) to see a row up close.")
        call = json.dumps({"name": "look", "arguments": {"row": row}})
        return Task(
            prompt=[ImagePart.of(draw(self.lamps), max_pixels=OVERVIEW_PIXELS), TextPart(question)],
            gold_calls=[f"<think>The overview is too small; look at row {row}.</think><tool_call>{call}</tool_call>"],
            gold_answer=f"<think>{count} lamps are lit.</think><answer>{self.gold_letter}</answer>",
            info={"row": row, "lit": count},
        )

    def _accuracy(self, answer: str) -> float:
        return 1.0 if answer_letter(answer, self.options) == self.gold_letter else 0.0
