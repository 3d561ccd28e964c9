"""``openai-agent``: the tool-use puzzles, solved by an agent program that only knows an OpenAI endpoint.

The agent (:mod:`relax_gym.envs.agents.python_tool_agent`) is a plain script on the official ``openai`` client
with a ``python`` tool it implements itself (the tool's programs see the task's text as the variable ``task``).
The env writes it and the question into the episode's working directory, runs it (see
:class:`~relax_gym.envs.agent_program.AgentProgramEnv`), and scores the final message it leaves in ``answer.txt``:
0.9 accuracy (math-verify against the known answer) + 0.1 format (``<think>…</think><answer>…</answer>``).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from relax_gym.envs.agent_program import (
    PYTHON,
    AgentProgramEnv,
    ProgramRun,
    ProgramTask,
)
from relax_gym.envs.rewards import extract_answer, math_answer, think_answer_format
from relax_gym.envs.tool_use import generate_task

AGENT_FILE = "python_tool_agent.py"

# The gold programs read the numbers from the agent's `task` variable, so a kind of puzzle has one program whatever
# its numbers: the policy learns which program a question needs, and to copy what it prints into the answer.
_NUMBERS = "import re\nn = [int(x) for x in re.findall(r'\\d+', task)]\n"
SOLUTIONS = {
    "What is the sum of the decimal digits": _NUMBERS + "print(sum(int(d) for d in str(n[-2] ** n[-1])))",
    "How many prime numbers": _NUMBERS + "print(sum(all(k % p for p in range(2, int(k ** 0.5) + 1)) for k in range(2, n[-1])))",
    "With F(0)=0 and F(1)=1": _NUMBERS + "a, b = 0, 1\nfor _ in range(n[-2]):\n    a, b = b, (a + b) % n[-1]\nprint(a)",
    "What is the sum of i^2": _NUMBERS + "print(sum(i * i for i in range(1, n[-2] + 1) if i % n[-1] == 0))",
}


def solution_code(question: str) -> str:
    """The gold program for a puzzle (it reads its numbers from ``task``)."""
    for start, code in SOLUTIONS.items():
        if question.startswith(start):
            return code
    raise ValueError(f"no solution program for the puzzle {question[:60]!r}")


def agent_source() -> str:
    return resources.files("relax_gym.envs.agents").joinpath(AGENT_FILE).read_text(encoding="utf-8")


class OpenAIAgentEnv(AgentProgramEnv):
    def __init__(self, *, accuracy_weight: float = 0.9, format_weight: float = 0.1, max_calls: int = 3,
                 max_tokens: int = 96, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if accuracy_weight < 0 or format_weight < 0 or accuracy_weight + format_weight <= 0:
            raise ValueError("reward weights must be >= 0 with a positive sum")
        self.weights = (accuracy_weight, format_weight)
        self.max_calls, self.max_tokens = int(max_calls), int(max_tokens)
        self.answer: int | None = None

    def _make_task(self, options: dict[str, Any]) -> ProgramTask:
        question, _, answer = generate_task(self.np_random)
        self.answer = answer
        call = json.dumps({"name": "python", "arguments": {"code": solution_code(question)}})
        return ProgramTask(
            prompt=question,
            argv=["env", f"AGENT_MAX_CALLS={self.max_calls}", f"AGENT_MAX_TOKENS={self.max_tokens}", PYTHON, AGENT_FILE],
            files={AGENT_FILE: agent_source(), "task.txt": question + "\n"},
            gold_replies=[f"<think>I will compute it.</think><tool_call>{call}</tool_call>",
                          f"<think>The program printed {answer}.</think><answer>{answer}</answer>"],
            outputs=("answer.txt",),
            info={"question": question},
        )

    def _score(self, run: ProgramRun) -> tuple[float, dict[str, float]]:
        final = run.outputs.get("answer.txt", "")
        answer = extract_answer(final)
        accuracy = math_answer(f"<answer>{answer}</answer>", str(self.answer)) if answer is not None else 0.0
        fmt = think_answer_format(final) if final else 0.0
        w_acc, w_fmt = self.weights
        return (w_acc * accuracy + w_fmt * fmt) / (w_acc + w_fmt), {"accuracy": accuracy, "format": fmt}
