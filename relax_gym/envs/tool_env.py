"""Multi-turn environments where the agent calls tools before answering.

Each turn the agent writes either tool calls (``<tool_call>{...}</tool_call>``, at most ``max_calls_per_turn``)
or a final ``<answer>…</answer>``. Tool results come back as ``tool`` messages with ``<tool_response>`` bodies
(text and media parts); a turn with neither gets a short reminder. A malformed call is answered with an error
message and the episode continues. The final answer is scored by the subclass (accuracy) plus the format reward;
running out of turns ends the episode truncated with reward 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.rewards import extract_answer, think_answer_format
from relax_gym.envs.tools import Tool, ToolBox, parse_tool_calls, tool_message, tools_system_prompt
from relax_gym.omni import Message, TextPart

REMINDER = "Call a tool with <tool_call>{...}</tool_call>, or give your final answer as <think>...</think><answer>...</answer>."


@dataclass
class Task:
    """One episode's problem: the user message, a checker for the answer, and the gold plan (tool-call actions
    that lead to the answer, then the answer action)."""

    prompt: list[Any]  # parts of the opening user message
    gold_calls: list[str]
    gold_answer: str
    info: dict[str, Any] = field(default_factory=dict)


class ToolEnv(AgentEnv):
    system_prompt_head = "Solve the task. Think inside <think></think> before each action."

    def __init__(self, tools: list[Tool], *, max_turns: int = 6, max_calls_per_turn: int = 4,
                 accuracy_weight: float = 0.9, format_weight: float = 0.1, **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        if accuracy_weight < 0 or format_weight < 0 or accuracy_weight + format_weight <= 0:
            raise ValueError("reward weights must be >= 0 with a positive sum")
        self.toolbox = ToolBox(tools)
        self.max_calls_per_turn = max_calls_per_turn
        self.weights = (accuracy_weight, format_weight)
        self.task: Task | None = None
        self.tool_calls = 0
        self.tool_errors = 0

    # -- subclass hooks -----------------------------------------------------------------------------------

    def _make_task(self, options: dict[str, Any]) -> Task:
        raise NotImplementedError

    def _accuracy(self, answer: str) -> float:
        raise NotImplementedError

    def _end_episode(self) -> None:
        """Release per-episode resources (sandboxes); called at the end, on reset and on close."""

    # -- AgentEnv ----------------------------------------------------------------------------------------

    def _reset(self, options: dict[str, Any]) -> Opening:
        self._end_episode()
        self.task = self._make_task(options)
        self.tool_calls = self.tool_errors = 0
        system = f"{self.system_prompt_head}\n\n{tools_system_prompt(self.toolbox)}"
        messages = [Message(role="system", content=(TextPart(system),)), Message(role="user", content=tuple(self.task.prompt))]
        return Opening(messages=messages, gold=self._next_gold(), info=dict(self.task.info))

    def _step(self, action: str) -> Outcome:
        assert self.task is not None
        answer = extract_answer(action)
        calls = parse_tool_calls(action)
        if answer is not None and not calls:
            accuracy = self._accuracy(answer)
            fmt = think_answer_format(action)
            w_acc, w_fmt = self.weights
            reward = (w_acc * accuracy + w_fmt * fmt) / (w_acc + w_fmt)
            self._end_episode()
            return Outcome([], reward, True, {"accuracy": accuracy, "format": fmt}, info=self._counts())
        if not calls:
            return Outcome([Message(role="user", content=(TextPart(REMINDER),))], 0.0, False, {}, gold=self._next_gold(), info=self._counts())
        messages = []
        for call in calls[: self.max_calls_per_turn]:
            output = self.toolbox.run(call, ctx=self)
            self.tool_calls += 1
            self.tool_errors += output.is_error
            messages.append(tool_message(output, call))
        if len(calls) > self.max_calls_per_turn:
            messages.append(Message(role="user", content=(TextPart(f"Only the first {self.max_calls_per_turn} tool calls of a turn are run."),)))
        return Outcome(messages, 0.0, False, {}, gold=self._next_gold(), info=self._counts())

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated or truncated:
            self._end_episode()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._end_episode()
        super().close()

    # -- helpers ------------------------------------------------------------------------------------------

    def _next_gold(self) -> str:
        assert self.task is not None
        done = self.tool_calls - self.tool_errors  # successful calls so far
        if done < len(self.task.gold_calls):
            return self.task.gold_calls[done]
        return self.task.gold_answer

    def _counts(self) -> dict[str, int]:
        return {"tool_calls": self.tool_calls, "tool_errors": self.tool_errors}
