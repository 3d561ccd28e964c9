"""Multiple-choice questions about media, answered by an agent that looks at the media through tools.

``McqAgentEnv`` is the dataset half of ``nextqa-video-agent`` and ``echo-ink-agent``: it reads the same layouts as
the single-turn data envs (``data_dir=`` for the real dataset, the bundled synthetic sample otherwise), picks one
record per episode (``options={"index": i}`` or the env RNG), and scores the final ``<answer>`` letter against the
record's answer. Subclasses decide what the agent sees first and which tools it gets:

- ``_open(sample) -> Opening parts`` (media and text put before the question), and
- ``_gold_calls(sample) -> list[str]`` (tool-call actions of the gold plan, one call each, used in order).

Everything else (tool calls, turns, the reminder, rewards, the call cost) is :class:`ToolEnv`'s. The answer's reward
context holds ``gold_letter``, ``options`` and ``question``. ``instructions``
replaces the first paragraph of the system prompt (the tool schemas follow it while tools are enabled).
``tools_enabled=False`` (``ToolEnv``'s no-tool baseline) also drops the tool sentence from the default instructions
and the tool line from the first observation: the agent answers from the first look alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax_gym.envs.datasets import DatasetError, DatasetSpec, McqSample
from relax_gym.envs.multiple_choice import load_samples, record_index
from relax_gym.envs.rewards import LETTERS, answer_letter
from relax_gym.envs.tool_env import Task, ToolEnv
from relax_gym.envs.tools import Tool
from relax_gym.omni import MediaError, TextPart
from relax_gym.omni.parts import Part


class McqAgentEnv(ToolEnv):
    system_prompt_head = (
        "Answer the multiple-choice question about the media. Think inside <think></think> before each action. "
        "Look closer with a tool call, or give the option letter as <think>...</think><answer>X</answer>."
    )
    no_tools_head = (
        "Answer the multiple-choice question about the media. Think inside <think></think>, then give the option "
        "letter as <think>...</think><answer>X</answer>."
    )

    def __init__(self, tools: list[Tool], *, dataset: DatasetSpec | dict[str, Any], data_dir: str | Path | None = None,
                 split: str | None = None, max_turns: int = 4, instructions: str | None = None, **kwargs: Any) -> None:
        self.dataset_spec = dataset if isinstance(dataset, DatasetSpec) else DatasetSpec.model_validate(dataset)
        self.samples = load_samples(self.dataset_spec, data_dir, split)
        super().__init__(tools, max_turns=max_turns, **kwargs)
        if instructions is not None:  # the system prompt's first paragraph; the tool schemas follow it
            self.system_prompt_head = instructions
        elif not self.tools_enabled:
            self.system_prompt_head = self.no_tools_head
        self.sample: McqSample | None = None
        self.options: tuple[str, ...] = ()

    # -- subclass hooks -----------------------------------------------------------------------------------

    def _open(self, sample: McqSample) -> list[Part]:
        """Decode what the episode needs and return the parts shown before the question."""
        raise NotImplementedError

    def _gold_calls(self, sample: McqSample) -> list[str]:
        raise NotImplementedError

    # -- ToolEnv ------------------------------------------------------------------------------------------

    def _make_task(self, options: dict[str, Any]) -> Task:
        index = record_index(options, len(self.samples), self.np_random)
        self.sample = sample = self.samples[index]
        self.options = sample.options
        try:
            opening = self._open(sample)
        except MediaError as exc:  # a broken record: name the file and where the record came from
            raise DatasetError(exc.source, f"{exc.reason} (record {sample.origin})") from exc
        lettered = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(sample.options))
        question = TextPart(f"\nQuestion: {sample.question}\nOptions:\n{lettered}")
        answer = sample.options[sample.answer_index]
        return Task(
            prompt=[*opening, question],
            gold_calls=self._gold_calls(sample),
            gold_answer=f"<think>I saw it: {answer}.</think><answer>{sample.answer_letter}</answer>",
            info={"sample_id": sample.uid, "sample_index": index, "origin": sample.origin},
            reward_context={"gold_letter": sample.answer_letter, "options": list(sample.options), "question": sample.question},
        )

    def _accuracy(self, answer: str) -> float:
        assert self.sample is not None
        return 1.0 if answer_letter(answer, self.options) == self.sample.answer_letter else 0.0


def call_action(name: str, arguments: dict[str, Any], thought: str) -> str:
    """One gold tool-call action: a short thought and a single ``<tool_call>``."""
    return f"<think>{thought}</think><tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
