"""Agent programs written as their users write them, on five clients, each solving the same task with one tool.

The task: "What number is next to NAME in the notebook?"; the program implements a ``lookup`` tool (the notebook is
its own), calls the model, runs the tool call it gets back, and writes the model's final answer to ``answer.txt``.
The clients (``openai`` 3.60 for the first two), all from one venv the code makes (their ``openai`` pins are not ours: the Agents SDK needs
``openai>=3``), with their packages copied into the sandbox from there:

- ``openai-chat``: the official ``openai`` client on Chat Completions, ``tools`` and ``tool`` messages;
- ``openai-responses``: the official ``openai`` client on the Responses API, continuing with ``previous_response_id``
  (its first call streamed: ``responses.stream``);
- ``anthropic``: Anthropic's client on Messages, ``tool_use`` / ``tool_result`` blocks, streamed (``messages.stream``);
- ``agents-sdk``: the OpenAI Agents SDK, its default (Responses) model class, a ``@function_tool``,
  ``Runner.run_streamed``;
- ``langchain``: LangChain's ``ChatOpenAI`` (Chat Completions) with ``bind_tools`` and a ``@tool``, streamed
  (``llm.stream``, the chunks added up).

Each reads the endpoint the way its users would point it at a server: the OpenAI client and the Agents SDK from
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` by themselves, ``ChatOpenAI`` and Anthropic's client from arguments.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax_gym.envs.agent_program import PYTHON, AgentProgramEnv, ProgramRun, ProgramTask
from relax_gym.envs.interop.venvs import client_venv

SDKS = ("anthropic==2.17.0", "openai-agents==0.24.0", "langchain-openai==1.8.1")
PACKAGES = ("openai", "anthropic", "agents", "langchain_openai")  # import names: pyruntime finds the distributions
NOTEBOOK = {"amber": "17", "basil": "23", "cedar": "41", "dill": "58"}
INSTRUCTIONS = "Look the name up with the lookup tool, then answer with the number only."
DOC = "The number written next to a name in the notebook."

COMMON = f"""
import json, os
NOTEBOOK = {NOTEBOOK!r}
INSTRUCTIONS = {INSTRUCTIONS!r}
TASK = open("task.txt").read()
SCHEMA = {{"type": "object", "properties": {{"name": {{"type": "string"}}}}, "required": ["name"]}}
def lookup(name):
    return NOTEBOOK.get(name, "no such name")
"""

PROGRAMS = {
    "openai-chat": COMMON + f"""
from openai import OpenAI
client = OpenAI(max_retries=0)
tools = [{{"type": "function", "function": {{"name": "lookup", "description": {DOC!r}, "parameters": SCHEMA}}}}]
messages = [{{"role": "system", "content": INSTRUCTIONS}}, {{"role": "user", "content": TASK}}]
for _ in range(4):
    reply = client.chat.completions.create(model=os.environ["OPENAI_MODEL"], messages=messages, tools=tools,
                                           max_tokens=64).choices[0].message
    messages.append(reply.model_dump(exclude_none=True))
    if not reply.tool_calls:
        break
    messages += [{{"role": "tool", "tool_call_id": c.id, "content": lookup(**json.loads(c.function.arguments))}}
                 for c in reply.tool_calls]
open("answer.txt", "w").write(reply.content or "")
""",
    "openai-responses": COMMON + f"""
from openai import OpenAI
client = OpenAI(max_retries=0)
tools = [{{"type": "function", "name": "lookup", "description": {DOC!r}, "parameters": SCHEMA}}]
# the first call streamed (the SDK's helper puts the events together), the later ones plain
with client.responses.stream(model=os.environ["OPENAI_MODEL"], instructions=INSTRUCTIONS, input=TASK, tools=tools,
                             max_output_tokens=64) as stream:
    reply = stream.get_final_response()
for _ in range(3):
    calls = [item for item in reply.output if item.type == "function_call"]
    if not calls:
        break
    results = [{{"type": "function_call_output", "call_id": c.call_id, "output": lookup(**json.loads(c.arguments))}}
               for c in calls]
    # a previous response's instructions are not carried over (the Responses API's rule): they are sent again
    reply = client.responses.create(model=os.environ["OPENAI_MODEL"], previous_response_id=reply.id, input=results,
                                    instructions=INSTRUCTIONS, tools=tools, max_output_tokens=64)
open("answer.txt", "w").write(reply.output_text)
""",
    "anthropic": COMMON + f"""
import anthropic
client = anthropic.Anthropic(base_url=os.environ["OPENAI_BASE_URL"].removesuffix("/v1"),
                             api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
tools = [{{"name": "lookup", "description": {DOC!r}, "input_schema": SCHEMA}}]
messages = [{{"role": "user", "content": TASK}}]
for _ in range(4):
    with client.messages.stream(model=os.environ["OPENAI_MODEL"], max_tokens=64, system=INSTRUCTIONS, tools=tools,
                                messages=messages) as stream:  # streamed: Anthropic's events put together
        reply = stream.get_final_message()
    uses = [block for block in reply.content if block.type == "tool_use"]
    if not uses:
        break
    messages.append({{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in reply.content]}})
    messages.append({{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": u.id, "content": lookup(**u.input)}}
                                              for u in uses]}})
open("answer.txt", "w").write("".join(block.text for block in reply.content if block.type == "text"))
""",
    "agents-sdk": COMMON + f"""
from agents import Agent, Runner, function_tool

@function_tool
def lookup(name: str) -> str:
    {DOC!r}
    return NOTEBOOK.get(name, "no such name")

agent = Agent(name="clerk", instructions=INSTRUCTIONS, tools=[lookup], model=os.environ["OPENAI_MODEL"])

async def main():  # streamed: the Responses API's events, as Runner.run_streamed consumes them
    result = Runner.run_streamed(agent, TASK, max_turns=4)
    async for _ in result.stream_events():
        pass
    return result.final_output

import asyncio
open("answer.txt", "w").write(str(asyncio.run(main())))
""",
    "langchain": COMMON + f"""
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

@tool
def lookup(name: str) -> str:
    {DOC!r}
    return NOTEBOOK.get(name, "no such name")

llm = ChatOpenAI(model=os.environ["OPENAI_MODEL"], base_url=os.environ["OPENAI_BASE_URL"],
                 api_key=os.environ["OPENAI_API_KEY"], max_retries=0, max_tokens=64).bind_tools([lookup])
messages = [SystemMessage(INSTRUCTIONS), HumanMessage(TASK)]
for _ in range(4):
    reply = None
    for chunk in llm.stream(messages):  # streamed: the chunks (tool-call chunks too) added up
        reply = chunk if reply is None else reply + chunk
    messages.append(reply)
    if not reply.tool_calls:
        break
    messages.extend(lookup.invoke(call) for call in reply.tool_calls)
open("answer.txt", "w").write(reply.content if isinstance(reply.content, str) else json.dumps(reply.content))
""",
}
CLIENTS = tuple(PROGRAMS)


def sdk_venv() -> Path:
    """The venv every client here comes from (made once, cached)."""
    return client_venv("agent-sdks", SDKS).parent.parent


class NotebookAgentEnv(AgentProgramEnv):
    """The notebook task played by ``client``'s program, or, with ``client=None``, by the client the episode's seed
    picks: ``CLIENTS[(seed + 2 * (seed // 1000)) % 5]`` (the trainer's seeds are ``1000 * step + prompt``, so the
    clients rotate with the prompt and two places a step: 3 steps of 2 prompts train all five)."""

    def __init__(self, client: str | None = None, **kwargs: Any) -> None:
        if client is not None and client not in PROGRAMS:
            raise ValueError(f"client {client!r}: one of {', '.join(CLIENTS)}")
        self.client = client
        self.episode_seed: int | None = None
        super().__init__(python_packages=PACKAGES, python_venv=str(sdk_venv()), **kwargs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.episode_seed = seed
        return super().reset(seed=seed, options=options)

    def run_program(self, *, seed: int | None, endpoint, options: dict[str, Any] | None = None):
        self.episode_seed = seed
        return super().run_program(seed=seed, endpoint=endpoint, options=options)

    def _make_task(self, options: dict[str, Any]) -> ProgramTask:
        seed = self.episode_seed or 0
        client = self.client or CLIENTS[(seed + 2 * (seed // 1000)) % len(CLIENTS)]
        name = sorted(NOTEBOOK)[int(self.np_random.integers(len(NOTEBOOK)))]
        self.answer = NOTEBOOK[name]
        self.task_client = client
        call = json.dumps({"name": "lookup", "arguments": {"name": name}})
        return ProgramTask(prompt=f"notebook ({client})", argv=[PYTHON, "agent.py"], outputs=("answer.txt",),
                           files={"agent.py": PROGRAMS[client], "task.txt": f"What number is next to {name}?"},
                           gold_replies=[f"<tool_call>{call}</tool_call>", self.answer])

    def _score(self, run: ProgramRun) -> tuple[float, dict[str, float]]:
        ok = run.outputs.get("answer.txt", "").strip() == self.answer
        return float(ok), {"accuracy": float(ok)}
