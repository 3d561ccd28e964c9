"""A random policy that plays by an env's own rules, for ``relax-gym envs play --policy random`` and smoke tests:
it answers with one of the options the prompt lists (``A. ...`` lines; A–E when it lists none), and in a tool env
it calls one of the env's tools about half the time, with arguments drawn from the tool's JSON schema (integers
and numbers in their bounds, enum values, short strings), so that a random episode exercises the tools too.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

from relax_gym.omni import Message

__all__ = ["RandomPolicy", "listed_options"]

_OPTION = re.compile(r"^\s*\(?([A-J])[.)]\s+\S", re.MULTILINE)
DEFAULT_LETTERS = "ABCDE"


def listed_options(messages: Sequence[Message]) -> list[str]:
    """The option letters the latest user message that lists any (``A. left`` / ``(B) right``) offers, in order."""
    for message in reversed(messages):
        if message.role == "user":
            found = list(dict.fromkeys(_OPTION.findall(message.text)))
            if found:
                return found
    return []


class RandomPolicy:
    """Draws actions from ``rng`` (a numpy Generator: the caller seeds it)."""

    def __init__(self, rng: np.random.Generator, tool_probability: float = 0.5) -> None:
        self.rng = rng
        self.tool_probability = tool_probability

    def act(self, env: Any, conversation: Sequence[Message]) -> str:
        toolbox = getattr(getattr(env, "unwrapped", env), "toolbox", None)
        schemas = toolbox.schemas() if toolbox is not None else []
        if schemas and self.rng.random() < self.tool_probability:
            spec = schemas[int(self.rng.integers(len(schemas)))]["function"]
            call = {"name": spec["name"], "arguments": self.arguments(spec.get("parameters", {}))}
            return f"<think>trying {spec['name']}</think><tool_call>{json.dumps(call)}</tool_call>"
        letters = listed_options(conversation) or list(DEFAULT_LETTERS)
        return f"<think>guessing</think><answer>{letters[int(self.rng.integers(len(letters)))]}</answer>"

    def arguments(self, schema: dict[str, Any]) -> dict[str, Any]:
        props = schema.get("properties", {})
        return {name: self.value(prop) for name, prop in props.items()}

    def value(self, prop: dict[str, Any]) -> Any:
        if "enum" in prop:
            return prop["enum"][int(self.rng.integers(len(prop["enum"])))]
        kind = prop.get("type")
        low = prop.get("minimum", prop.get("exclusiveMinimum", 0))
        high = prop.get("maximum", prop.get("exclusiveMaximum", max(low, 0) + 100))
        if kind == "integer":
            return int(self.rng.integers(int(low), int(high) + 1))
        if kind == "number":
            return round(float(self.rng.uniform(low, high)), 2)
        if kind == "boolean":
            return bool(self.rng.integers(2))
        if kind == "array":
            return [self.value(prop.get("items", {})) for _ in range(int(self.rng.integers(1, 4)))]
        if kind == "object":
            return self.arguments(prop)
        return "".join(self.rng.choice(list(string.ascii_lowercase), size=int(self.rng.integers(1, 9))))
