"""How a judge model is asked: one user turn holding the rubric part's rendered prompt, answered by the verdict text.

The judge model is trained (:mod:`relax_gym.trainer.rewards.judge_model`) and served
(:mod:`relax_gym.trainer.rewards.judge`) through this one function, so the two never drift apart."""

from __future__ import annotations

from relax_gym.omni import Message, TextPart

__all__ = ["judge_messages"]


def judge_messages(prompt: str) -> list[Message]:
    """The conversation a judge sees for one request (rendered with ``add_generation_prompt=True``)."""
    return [Message(role="user", content=(TextPart(prompt),))]
