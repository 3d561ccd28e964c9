"""``tool-use``: arithmetic puzzles that need computation, solved with a ``python`` tool run in the episode's sandbox.

Tasks are generated from the seed with known answers (digit sums of large powers, prime counts, Fibonacci
residues, sums of squares of multiples), sized so that mental arithmetic fails and code succeeds. The final
``<answer>`` is checked with math-verify; reward = 0.9 accuracy + 0.1 format. The answer's reward context: ``gold``
(the number, as text) and ``question``.
"""

from __future__ import annotations

import json
from typing import Any

from relax_gym.envs.episode_sandbox import EpisodeSandbox
from relax_gym.envs.rewards import math_answer
from relax_gym.envs.tool_env import Task, ToolEnv
from relax_gym.envs.tools import ToolOutput, tool
from relax_gym.omni import TextPart
from relax_gym.sandbox.spec import SandboxSpec

MAX_CODE_CHARS = 20_000


@tool
def python(ctx: ToolUseEnv, code: str) -> ToolOutput:
    """Run a Python 3 program in a fresh sandbox and return what it prints (stdout, then stderr).

    Args:
        code: the program's source; print the values you need.
    """
    if len(code) > MAX_CODE_CHARS:
        return ToolOutput(text=f"Error: code longer than {MAX_CODE_CHARS} characters.", is_error=True)
    ctx.sandbox.write_file("main.py", code)
    result = ctx.sandbox.exec("python3 main.py", timeout=ctx.code_timeout_s)
    text = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
    if result.timed_out:
        text += f"\n[killed: ran longer than {ctx.code_timeout_s:g} s]"
    elif result.oom_killed:
        text += "\n[killed: out of memory]"
    elif result.rc != 0:
        text += f"\n[exit code {result.rc}]"
    return ToolOutput(text=text.strip() or "(no output)", is_error=not result.ok)


def _primes_below(n: int) -> int:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    return sum(sieve)


def _fib_mod(n: int, m: int) -> int:
    a, b = 0, 1
    for _ in range(n):
        a, b = b, (a + b) % m
    return a


def generate_task(rng) -> tuple[str, str, int]:
    """(question, solution code, answer) for one puzzle drawn from ``rng`` (a numpy Generator)."""
    kind = int(rng.integers(4))
    if kind == 0:
        a, b = int(rng.integers(2, 10)), int(rng.integers(60, 300))
        return (f"What is the sum of the decimal digits of {a}^{b}?", f"print(sum(int(d) for d in str({a}**{b})))", sum(int(d) for d in str(a**b)))
    if kind == 1:
        n = int(rng.integers(2_000, 60_000))
        code = f"n = {n}\nprint(sum(1 for k in range(2, n) if all(k % p for p in range(2, int(k ** 0.5) + 1))))"
        return (f"How many prime numbers are smaller than {n}?", code, _primes_below(n))
    if kind == 2:
        n, m = int(rng.integers(200, 2_000)), int(rng.integers(1_000, 100_000))
        code = f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, (a + b) % {m}\nprint(a)"
        return (f"With F(0)=0 and F(1)=1, what is the Fibonacci number F({n}) modulo {m}?", code, _fib_mod(n, m))
    n, k = int(rng.integers(500, 5_000)), int(rng.integers(3, 13))
    answer = sum(i * i for i in range(1, n + 1) if i % k == 0)
    return (f"What is the sum of i^2 over all integers 1 <= i <= {n} that are divisible by {k}?",
            f"print(sum(i * i for i in range(1, {n} + 1) if i % {k} == 0))", answer)


class ToolUseEnv(ToolEnv):
    media_kinds = ()

    def __init__(self, *, sandbox: SandboxSpec | dict[str, Any] | None = None, backend: str | None = None,
                 code_timeout_s: float = 10.0, episode_timeout_s: float = 300.0, max_turns: int = 4, **kwargs: Any) -> None:
        super().__init__([python], max_turns=max_turns, **kwargs)
        spec = sandbox if isinstance(sandbox, SandboxSpec) else SandboxSpec.model_validate(sandbox or {})
        self.code_timeout_s = code_timeout_s
        self.sandbox = EpisodeSandbox(spec, backend=backend, episode_timeout_s=episode_timeout_s)
        self.answer: int | None = None

    def _make_task(self, options: dict[str, Any]) -> Task:
        question, code, answer = generate_task(self.np_random)
        self.answer = answer
        call = json.dumps({"name": "python", "arguments": {"code": code}})
        return Task(
            prompt=[TextPart(f"{question} Use the python tool to compute it, then answer with the number.")],
            gold_calls=[f"<think>I will compute it.</think><tool_call>{call}</tool_call>"],
            gold_answer=f"<think>The program printed {answer}.</think><answer>{answer}</answer>",
            info={"question": question},
            reward_context={"gold": str(answer), "question": question},
        )

    def _accuracy(self, answer: str) -> float:
        return math_answer(f"<answer>{answer}</answer>", str(self.answer))

    def _end_episode(self) -> None:
        self.sandbox.release()

    def close(self) -> None:
        """End the episode and close the sandbox: when no other env of this process holds the shared pool, its
        containers are removed before this returns."""
        try:
            super().close()
        finally:
            self.sandbox.close()
