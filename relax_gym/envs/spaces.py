"""Gymnasium spaces for agent environments: the action is the assistant's text; the observation is a
conversation (a list of messages, each a list of parts)."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

from relax_gym.omni import Message
from relax_gym.omni.parts import TextPart

_PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " \n"


class AssistantText(spaces.Space[str]):
    """Any ``str`` of at most ``max_length`` characters. ``sample()`` draws printable ASCII: random text, which
    is exactly what ``check_env`` needs as a garbage action."""

    def __init__(self, max_length: int = 32_768, seed: int | np.random.Generator | None = None) -> None:
        self.max_length = max_length
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(1, min(self.max_length, 64) + 1))
        return "".join(self.np_random.choice(list(_PRINTABLE), size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AssistantText(max_length={self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, AssistantText) and other.max_length == self.max_length


class Conversation(spaces.Space[list]):
    """A list of :class:`~relax_gym.omni.Message` whose media parts are of the declared kinds."""

    def __init__(self, media_kinds: tuple[str, ...] = ("image", "video", "audio"), seed: int | np.random.Generator | None = None) -> None:
        self.media_kinds = tuple(media_kinds)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        words = ["look", "listen", "which", "option", "why", "how", "many"]
        text = " ".join(self.np_random.choice(words, size=int(self.np_random.integers(1, 8))))
        return [Message(role="user", content=(TextPart(text),))]

    def contains(self, x: Any) -> bool:
        return self.problem(x) is None

    def problem(self, x: Any) -> str | None:
        """Why ``x`` is not in this space, naming the message and part (None when it is)."""
        if not isinstance(x, list):
            return f"an observation must be a list of Message, got {type(x).__name__}"
        for i, message in enumerate(x):
            if not isinstance(message, Message):
                return f"message {i} is a {type(message).__name__}, not a relax_gym.omni.Message"
            for j, part in enumerate(message.content):
                if part.kind != "text" and part.kind not in self.media_kinds:
                    return (f"message {i} ({message.role}), part {j}: an {part.kind} part, but the env declares "
                            f"media_kinds={self.media_kinds}; add {part.kind!r} to the env's media_kinds")
        return None

    def __repr__(self) -> str:
        return f"Conversation(media_kinds={self.media_kinds})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Conversation) and other.media_kinds == self.media_kinds
