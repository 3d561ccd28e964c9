"""Small pure reward functions. Each returns a float in [0, 1]. (Weighted combinations of them are rubrics:
:mod:`relax_gym.envs.rubric`; the multiple-choice one is :mod:`relax_gym.envs.multiple_choice_reward`.)"""

from __future__ import annotations

import re
import string

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
