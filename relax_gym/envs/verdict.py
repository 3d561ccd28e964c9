"""Reading a judge's answer: a label (``yes`` / ``no`` / any labels a rubric part names) or a score (``7``,
``7/10``, ``score: 7.5``), into a value in [0, 1] — or None when the answer says neither clearly.

A judge model is a language model: it can answer with both labels, with a score out of range, with nothing, or with
text that only resembles a verdict. Those are malformed verdicts (None), never guesses; the trainer masks the
episode and counts them (``judge_error``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

__all__ = ["parse_label", "parse_score", "parse_verdict"]

_NUMBER = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)(?:\s*(?:/|\bout of\b)\s*(\d+(?:\.\d+)?))?(?![\w.])", re.IGNORECASE)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def parse_label(text: str, labels: Mapping[str, float]) -> float | None:
    """The value of the one label ``text`` states. The whole answer may be the label (``"Yes."``), or the label
    may stand as a word among others (``"verdict: no"``); an answer that states two different labels, or none, is
    malformed (None). Labels match case- and punctuation-insensitively, multi-word labels as whole phrases."""
    if not labels:
        raise ValueError("a label verdict needs at least one label")
    answer = _normal(text)
    if not answer:
        return None
    table = {_normal(k): float(v) for k, v in labels.items()}
    if answer in table:
        return table[answer]
    spans = [(m.start(), m.end(), label) for label in table if label
             for m in re.finditer(rf"(?<!\S){re.escape(label)}(?!\S)", answer)]
    # an occurrence inside a longer label's occurrence ("correct" in "not correct") is not a statement of its own
    stated = [s for s in spans if not any(o is not s and o[0] <= s[0] and s[1] <= o[1] for o in spans)]
    values = {table[label] for _, _, label in stated}
    return values.pop() if len(values) == 1 else None


def parse_score(text: str, max_score: float) -> float | None:
    """The one number ``text`` states, divided by ``max_score`` (``"8/10"`` and ``"8 out of 10"`` use their own denominator); None when
    there is no number, more than one different score, or a value outside [0, max]."""
    if max_score <= 0:
        raise ValueError(f"max_score must be > 0, got {max_score}")
    scores = set()
    for num, den in _NUMBER.findall(text):
        value, top = float(num), float(den) if den else max_score
        if top <= 0 or not math.isfinite(value) or not 0.0 <= value <= top:
            return None
        scores.add(value / top)
    return scores.pop() if len(scores) == 1 else None


def parse_verdict(text: str, verdict: str, *, labels: Mapping[str, float] | None = None,
                  max_score: float = 10.0) -> float | None:
    """``verdict`` ``"label"`` or ``"score"``: the value in [0, 1] (label values are the rubric's own), or None."""
    if verdict == "label":
        return parse_label(text, labels or {"yes": 1.0, "no": 0.0})
    if verdict == "score":
        return parse_score(text, max_score)
    raise ValueError(f"verdict must be 'label' or 'score', got {verdict!r}")
