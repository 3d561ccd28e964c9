"""A small agent written against the official ``openai`` client: it answers a question with a python tool.

It knows nothing of relax-gym: it reads the question from ``task.txt``, talks to whatever model
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` name, runs the ``python`` tool calls the model makes
itself (a child interpreter with a time limit), and writes the model's final message to ``answer.txt``.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=k python python_tool_agent.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from openai import OpenAI

SYSTEM = ("Solve the task. Think inside <think></think> before each action. Use the python tool to compute what "
          "you need (its programs can read the task's text as the string variable `task`), then give the final "
          "answer as <think>...</think><answer>NUMBER</answer>.")
TOOLS = [{
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run a Python 3 program and return what it prints (stdout, then stderr). The variable `task` "
                       "holds the task's text.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program; print the values you need"}},
            "required": ["code"],
        },
    },
}]
MAX_CALLS = int(os.environ.get("AGENT_MAX_CALLS", "3"))
MAX_TOKENS = int(os.environ.get("AGENT_MAX_TOKENS", "96"))
CODE_TIMEOUT_S = float(os.environ.get("AGENT_CODE_TIMEOUT_S", "10"))
MAX_TOOL_OUTPUT = 2_000


def run_python(arguments: str, task: str) -> str:
    """The tool: run the call's ``code`` in a child interpreter, with the task's text in the variable ``task``;
    every failure is text for the model."""
    try:
        code = json.loads(arguments)["code"]
        if not isinstance(code, str):
            raise TypeError("code must be a string")
    except (ValueError, KeyError, TypeError) as exc:
        return f"Error: the arguments must be a JSON object with a string 'code' ({exc})"
    try:
        done = subprocess.run([sys.executable, "-c", f"task = {task!r}\n{code}"], capture_output=True, text=True, timeout=CODE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"Error: the program ran longer than {CODE_TIMEOUT_S:g} s"
    text = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.stderr else "")
    if done.returncode:
        text += f"\n[exit code {done.returncode}]"
    return (text.strip() or "(no output)")[:MAX_TOOL_OUTPUT]


def main() -> int:
    with open("task.txt", encoding="utf-8") as f:
        question = f.read().strip()
    client = OpenAI(max_retries=0, timeout=600)
    model = os.environ.get("OPENAI_MODEL", "policy")
    messages: list = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    final = ""
    for _ in range(MAX_CALLS):
        response = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            final = message.content or ""
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_python(call.function.arguments, question)})
    with open("answer.txt", "w", encoding="utf-8") as f:
        f.write(final)
    print(json.dumps({"calls": sum(m["role"] == "assistant" for m in messages), "final": final}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
