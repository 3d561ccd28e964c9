"""The multiple-choice reward: accuracy and format, weighted, as a rubric (:mod:`relax_gym.envs.rubric`, whose rules
are the functions of :mod:`relax_gym.envs.rewards`)."""

from __future__ import annotations

import functools

from pydantic import BaseModel, ConfigDict, Field, model_validator

from relax_gym.envs.rubric import Rubric

__all__ = ["MultipleChoiceReward"]


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
    return Rubric(parts=[{"name": "accuracy", "rule": "multiple_choice", "weight": accuracy},
                         {"name": "format", "rule": "format", "weight": fmt}])
