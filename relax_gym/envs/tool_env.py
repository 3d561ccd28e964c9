"""Multi-turn environments where the agent calls tools before answering.

Each turn the agent writes either tool calls (``<tool_call>{...}</tool_call>``, at most ``max_calls_per_turn``)
or a final ``<answer>…</answer>``. Tool results come back as ``tool`` messages with ``<tool_response>`` bodies
(text and media parts); a turn with neither gets a short reminder. A malformed call is answered with an error
message and the episode continues. The final answer is scored by the subclass (accuracy) plus the format reward,
combined like the rubric parts ``accuracy`` and ``format`` (:func:`~relax_gym.envs.rubric.combine`); the answer's
step reports the task's ``reward_context`` (for a rubric that replaces this reward). Running out of turns ends the
episode truncated with reward 0.

Tools may return media parts (see :mod:`relax_gym.envs.tools`); ``media_role`` says whether they ride inside the
``tool`` message (default) or in a ``user`` message after it. ``call_cost`` charges each tool call beyond the first
``free_calls`` against the final reward (never below 0; ``reward_breakdown["call_cost"]`` is the amount taken), so an
agent can be taught to look only where it needs to; the gold plan stays within ``free_calls`` so it keeps the
maximum reward.

``tool_latency`` (a :class:`~relax_gym.envs.latency.ToolLatency` or its dict) adds a simulated, seeded wait to every
tool call, for long-tail agentic workloads; the turn's total wait is reported in ``info["tool_latency_s"]``.

``tools_enabled=False`` turns the same task into its no-tool baseline: the system prompt lists no tools, the gold
plan answers at once, and a tool call is not run but answered with an error (counted in ``tool_calls`` and
``tool_errors``), so the agent has to answer from what the first observation shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax_gym.envs.core import AgentEnv, Opening, Outcome
from relax_gym.envs.latency import ToolLatency
from relax_gym.envs.rewards import extract_answer, think_answer_format
from relax_gym.envs.rubric import combine
from relax_gym.envs.tools import (MediaRole, Tool, ToolBox, ToolCall, ToolOutput, parse_tool_calls, tool_messages,
                                  tools_system_prompt)
from relax_gym.omni import Message, TextPart

TOOLS_OFF = ToolOutput(text="Error: no tools in this episode; answer with <think>...</think><answer>...</answer>.", is_error=True)
REMINDER = "Call a tool with <tool_call>{...}</tool_call>, or give your final answer as <think>...</think><answer>...</answer>."


@dataclass
class Task:
    """One episode's problem: the user message, a checker for the answer, and the gold plan (tool-call actions
    that lead to the answer, then the answer action)."""

    prompt: list[Any]  # parts of the opening user message
    gold_calls: list[str]
    gold_answer: str
    info: dict[str, Any] = field(default_factory=dict)
    reward_context: dict[str, Any] | None = None  # what a rubric scores the answer against (JSON-able): gold, options, ...


class ToolEnv(AgentEnv):
    system_prompt_head = "Solve the task. Think inside <think></think> before each action."

    def __init__(self, tools: list[Tool], *, max_turns: int = 6, max_calls_per_turn: int = 4,
                 accuracy_weight: float = 0.9, format_weight: float = 0.1,
                 tool_latency: ToolLatency | dict[str, Any] | None = None, media_role: MediaRole = "tool",
                 call_cost: float = 0.0, free_calls: int = 0, tools_enabled: bool = True, **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        if media_role not in ("tool", "user"):
            raise ValueError(f"media_role must be 'tool' or 'user', got {media_role!r}")
        if call_cost < 0 or free_calls < 0:
            raise ValueError(f"call_cost and free_calls must be >= 0, got {call_cost} and {free_calls}")
        self.media_role = media_role
        self.tools_enabled = bool(tools_enabled)
        self.call_cost = float(call_cost)
        self.free_calls = int(free_calls)
        self.tool_latency = ToolLatency.model_validate(tool_latency) if isinstance(tool_latency, dict) else tool_latency
        self._latency_rng = None
        self._unseeded_resets = 0
        if accuracy_weight < 0 or format_weight < 0 or accuracy_weight + format_weight <= 0:
            raise ValueError("reward weights must be >= 0 with a positive sum")
        self.toolbox = ToolBox(tools)
        self.max_calls_per_turn = max_calls_per_turn
        self.weights = (accuracy_weight, format_weight)
        self.task: Task | None = None
        self.tool_calls = 0
        self.tool_errors = 0
        self.tool_crashes = 0  # tool errors that were a tool raising (an env bug), not a bad call

    # -- subclass hooks -----------------------------------------------------------------------------------

    def _make_task(self, options: dict[str, Any]) -> Task:
        raise NotImplementedError

    def _accuracy(self, answer: str) -> float:
        raise NotImplementedError

    def _end_episode(self) -> None:
        """Release per-episode resources (sandboxes); called at the end, on reset and on close."""

    # -- AgentEnv ----------------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.tool_latency is not None:  # its own RNG, so the tasks are those of the same env without latency
            self._unseeded_resets += seed is None
            self._latency_rng = self.tool_latency.rng(seed if seed is not None else -self._unseeded_resets)
        return super().reset(seed=seed, options=options)

    def _reset(self, options: dict[str, Any]) -> Opening:
        self._end_episode()
        self.task = self._make_task(options)
        self.tool_calls = self.tool_errors = self.tool_crashes = 0
        system = f"{self.system_prompt_head}\n\n{tools_system_prompt(self.toolbox)}" if self.tools_enabled else self.system_prompt_head
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
            breakdown = {"accuracy": accuracy, "format": fmt}
            reward = combine({"accuracy": w_acc, "format": w_fmt}, breakdown)
            if self.call_cost > 0:
                charged = min(reward, self.call_cost * max(0, self.tool_calls - self.free_calls))
                reward -= charged
                breakdown["call_cost"] = charged
            self._end_episode()
            context = dict(self.task.reward_context) if self.task.reward_context is not None else None
            return Outcome([], reward, True, breakdown, info=self._counts(), reward_context=context)
        if not calls:
            return Outcome([Message(role="user", content=(TextPart(REMINDER),))], 0.0, False, {}, gold=self._next_gold(), info=self._counts())
        messages = []
        waited = 0.0
        tracebacks = []
        for call in calls[: self.max_calls_per_turn]:
            output = self.toolbox.run(call, ctx=self) if self.tools_enabled else TOOLS_OFF
            if self.tools_enabled and self.tool_latency is not None and self._latency_rng is not None and isinstance(call, ToolCall):
                delay = self.tool_latency.draw(self._latency_rng)
                self.tool_latency.wait(delay)
                waited += delay
            self.tool_calls += 1
            self.tool_errors += output.is_error
            if output.traceback:
                self.tool_crashes += 1
                tracebacks.append(output.traceback)
            messages.extend(tool_messages(output, call, media_role=self.media_role))
        if len(calls) > self.max_calls_per_turn:
            messages.append(Message(role="user", content=(TextPart(f"Only the first {self.max_calls_per_turn} tool calls of a turn are run."),)))
        info = self._counts()
        if tracebacks:  # for check/play and the env author; the model only saw "Error: tool ... failed"
            info["tool_traceback"] = "\n".join(tracebacks)
        if self.tool_latency is not None:
            info["tool_latency_s"] = waited
        return Outcome(messages, 0.0, False, {}, gold=self._next_gold(), info=info)

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
        if self.tools_enabled and done < len(self.task.gold_calls):
            return self.task.gold_calls[done]
        return self.task.gold_answer

    def _counts(self) -> dict[str, int]:
        return {"tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "tool_crashes": self.tool_crashes}
