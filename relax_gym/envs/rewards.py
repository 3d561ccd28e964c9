"""Small pure reward functions. Each returns a float in [0, 1]; combiners return a total plus a breakdown."""

from __future__ import annotations

import functools
import re
import string
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from relax_gym.envs.rubric import Rubric

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
LETTERS = string.ascii_uppercase


def extract_answer(text: str) -> str | None:
    """Content of the last ``<answer>…</answer>`` block, stripped; None when there is none."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def answer_letter(answer: str, options: list[str] | tuple[str, ...]) -> str | None:
    """Map an answer ("B", "(b)", "B. walks left", or the option's own text) to its letter."""
    letters = LETTERS[: len(options)]
    m = re.fullmatch(r"\(?\s*([A-Za-z])\s*\)?\s*(?:[.:)\-]\s*.*)?", answer, re.DOTALL)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    lowered = " ".join(answer.lower().split())
    for letter, option in zip(letters, options):
        if lowered == " ".join(option.lower().split()):
            return letter
    return None


def multiple_choice(text: str, gold_letter: str, options: list[str] | tuple[str, ...]) -> float:
    answer = extract_answer(text)
    if answer is None:
        return 0.0
    return 1.0 if answer_letter(answer, options) == gold_letter.upper() else 0.0


def think_answer_format(text: str) -> float:
    """1.0 when the whole text is ``<think>…</think><answer>…</answer>`` (whitespace allowed around)."""
    return 1.0 if _FORMAT.fullmatch(text) else 0.0


MAX_MATH_ANSWER_CHARS = 2_000


def math_answer(text: str, gold: str) -> float:
    """math-verify equivalence of the ``<answer>`` content (or the whole text) with ``gold``.

    The comparison runs in a worker process with a hard time limit (:mod:`relax_gym.envs.math_grader`): an answer
    that makes sympy compute for ever (``9^9^9``) is a wrong answer, never a hung episode. Answers longer than
    ``MAX_MATH_ANSWER_CHARS`` are wrong without a comparison."""
    from relax_gym.envs.math_grader import equivalent

    answer = extract_answer(text) or text
    if len(answer) > MAX_MATH_ANSWER_CHARS:
        return 0.0
    return 1.0 if equivalent(gold, answer) else 0.0


class MultipleChoiceReward(BaseModel):
    """reward = accuracy * w_accuracy + format * w_format, normalised by the weights' sum so the max is 1: the
    rubric :attr:`rubric` (parts ``accuracy`` and ``format``) with these weights."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    accuracy: float = Field(default=0.9, ge=0.0)
    format: float = Field(default=0.1, ge=0.0)

    @model_validator(mode="after")
    def _some_weight(self) -> MultipleChoiceReward:
        if self.accuracy + self.format <= 0:
            raise ValueError("at least one reward weight must be positive")
        return self

    @property
    def rubric(self) -> Rubric:
        """The same reward as a rubric: parts ``accuracy`` (rule ``multiple_choice``) and ``format`` (rule
        ``format``), with these weights; it reads ``gold_letter`` and ``options`` from the reward context."""
        return _mcq_rubric(self.accuracy, self.format)

    def __call__(self, text: str, gold_letter: str, options: list[str] | tuple[str, ...]) -> tuple[float, dict[str, float]]:
        score = self.rubric.score(text, {"gold_letter": gold_letter, "options": list(options)})
        return score.total, score.breakdown


@functools.lru_cache(maxsize=64)
def _mcq_rubric(accuracy: float, fmt: float) -> Rubric:
    # imported here: rubric.py builds its rules from this module's functions
    from relax_gym.envs.rubric import Rubric

    return Rubric(parts=[{"name": "accuracy", "rule": "multiple_choice", "weight": accuracy},
                         {"name": "format", "rule": "format", "weight": fmt}])
