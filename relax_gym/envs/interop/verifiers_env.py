"""verifiers environments (``pip install verifiers``; its classic ``vf.Environment`` stack) as relax-gym envs:
``relax_gym.make("verifiers:vf-my-env", env_args={...})``.

Runs inside the verifiers venv (:mod:`relax_gym.envs.interop.venvs`). ``vf.load_environment(id, **env_args)``
imports the env's module (an Environments Hub package installed in that venv, or a module given with
``imports=`` / on the path) and gives an ``Environment`` that plays its rollouts itself, calling a model client.
The adapter turns that around: each episode runs verifiers' own ``run_rollout`` (its turn loop, ``env_response``,
stop conditions and rubric) on an event loop of its own, with a client that hands every model call to this env as
an observation and answers it with the policy's action. What maps to what:

- reset picks a row of the env's dataset (``split="train"``: ``get_dataset()``, ``"eval"``: ``get_eval_dataset()``)
  with this env's seeded generator (or in turn, ``pick="cycle"``) and starts the rollout; the first model call's
  prompt is the opening;
- each step answers the pending call with the action; the next call's messages that are new (the env's response)
  are the step's observation (reward 0), or the rollout ends: the step is terminal and its reward is the rubric's,
  each reward function's score a component of ``reward_breakdown`` (verifiers' ``metrics``);
- tools (a ``vf.ToolEnv``'s functions, handed to the model call as ``tools``): written into the opening's system
  message in our tool-call text format (the one our own tool envs use); the policy's ``<tool_call>`` blocks become
  the response's ``tool_calls`` (the rest of the text its content), so verifiers runs the tools itself and its
  ``tool`` messages come back as the next observation;
- the gold action comes from ``gold``, ``str.format`` templates over the row's ``answer`` and ``info`` fields
  (default ``"{answer}"``), one per turn (a list: e.g. a tool call, then the answer; the last serves later turns):
  right for envs that compare the reply to the answer, set it for a parser's format;
- reward bounds: ``reward_bounds`` (default [0, 1]).

Lost: group-level scoring (``score_group``: each episode is scored alone), the response's token ids (the trainer
records its own).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from relax_gym.envs.core import Opening, Outcome
from relax_gym.envs.interop.adapter import ForeignAgentEnv, ForeignEnvError, TaskPicker, fill_gold
from relax_gym.envs.remote.wire import encode_value
from relax_gym.omni import Message, from_openai
from relax_gym.omni.openai_tools import split_reply
from relax_gym.omni.tool_calls import tools_instructions

MODEL_NAME = "relax-gym-policy"
_LOADED: dict[str, Any] = {}  # (env id, env args) -> the verifiers Environment (see VerifiersEnv._load)
_LOADED_LOCK = threading.Lock()


class VerifiersEnv(ForeignAgentEnv):
    framework_title = "verifiers"

    def __init__(self, env_id: str, *, env_args: dict[str, Any] | None = None, split: str = "train", pick: str = "random",
                 gold: str | list[str] | None = "{answer}", reward_bounds: tuple[float, float] = (0.0, 1.0), max_turns: int = 16,
                 call_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(env_id, call_timeout_s=call_timeout_s, max_turns=max_turns, **kwargs)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.picker = TaskPicker(pick)
        import verifiers.legacy as vf  # the classic stack (`import verifiers as vf` in env packages reaches it too)

        self._vf = vf
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="verifiers-loop", daemon=True).start()
        self.vf_env = self._load(env_id, dict(env_args or {}))
        data = self._call(f"get_{'eval_' if split == 'eval' else ''}dataset",
                          lambda: self.vf_env.get_dataset() if split == "train" else self.vf_env.get_eval_dataset())
        self.rows = [dict(row) for row in data]
        if not self.rows:
            raise self._malformed(f"get_{'eval_' if split == 'eval' else ''}dataset", "no rows")
        self.gold_templates = [gold] if isinstance(gold, str) else list(gold or [])
        self.reward_range_ = tuple(reward_bounds)
        self._events: asyncio.Queue | None = None
        self._rollout: Any = None  # the running rollout's concurrent future
        self._pending: asyncio.Future | None = None  # the model call waiting for the policy's action
        self._seen = 0  # messages of the rollout's conversation already given to the trainer
        self._tools_shown = False  # the tools' instructions went into this rollout's opening
        self._fields: dict[str, Any] = {}  # the row's fields the gold templates read
        self._where_gold = ""

    def _load(self, env_id: str, env_args: dict[str, Any]) -> Any:
        """The process's one ``Environment`` for these arguments: verifiers sets signal handlers when it builds one,
        which only the main thread may do, and the env server makes its first env there (its start-up probe); the
        sessions it opens later, on its request threads, share that one (a rollout keeps its state in its own
        ``State``)."""
        key = json.dumps([env_id, env_args], sort_keys=True, default=repr)
        with _LOADED_LOCK:
            if key not in _LOADED:
                try:
                    _LOADED[key] = self._vf.load_environment(env_id, **env_args)
                except Exception as exc:
                    raise ForeignEnvError(f"{self._where('load_environment')} raised {type(exc).__name__}: {exc}") from exc
            return _LOADED[key]

    # -- one episode = one verifiers rollout ---------------------------------------------------------------------

    def _reset(self, options: dict[str, Any]) -> Opening:
        self._stop_rollout()
        index = self.picker.next(len(self.rows), self.np_random)
        row = self.rows[index]
        info = row.get("info") or {}
        rollout_input = {"prompt": row["prompt"], "example_id": row.get("example_id", index),
                         "answer": row.get("answer", ""), "info": info}
        self._events = self._call("rollout", lambda: self._start(rollout_input))
        self._stuck = False
        kind, payload = self._call("rollout", self._next_event)
        if kind != "call":
            raise self._malformed("rollout", f"no model call before it ended ({self._ending(payload)})")
        messages = self._new_messages(payload)
        self._fields = {**(info if isinstance(info, dict) else {}), "answer": row.get("answer", "")}
        self._where_gold = self._where(f"gold (dataset row {index})")
        return Opening(messages, self._gold_for(0), {"example_id": rollout_input["example_id"], "task_index": index})

    def _gold_for(self, turn: int) -> str:
        if not self.gold_templates:
            return ""
        template = self.gold_templates[min(turn, len(self.gold_templates) - 1)]
        return fill_gold(template, self._fields, where=self._where_gold)

    def _step(self, action: str) -> Outcome:
        pending, self._pending = self._pending, None
        if pending is None:
            raise ForeignEnvError(self._where("rollout has no model call waiting for this action"))
        self._loop.call_soon_threadsafe(pending.set_result, action)
        kind, payload = self._call("rollout", self._next_event)
        if kind == "call":
            return Outcome(self._new_messages(payload), 0.0, False, {}, gold=self._gold_for(self._turn))
        if kind == "error":
            raise ForeignEnvError(self._where(f"rollout raised {type(payload).__name__}: {payload}"))
        error = payload.get("error")
        if error:
            raise ForeignEnvError(self._where(f"rollout ended with an error: {encode_value(error)}"))
        reward = self._reward("rubric", payload.get("reward"))
        metrics = {k: float(v) for k, v in (payload.get("metrics") or {}).items() if isinstance(v, (int, float))}
        return Outcome([], reward, True, metrics, info={"stop_condition": payload.get("stop_condition")})

    # -- the event loop side ----------------------------------------------------------------------------------

    def _start(self, rollout_input: dict[str, Any]) -> asyncio.Queue:
        async def begin() -> asyncio.Queue:
            events: asyncio.Queue = asyncio.Queue()
            client = _bridge_client(self._vf, events)

            async def play() -> None:
                try:
                    out = await self.vf_env.run_rollout(rollout_input, client, MODEL_NAME, {})
                    await events.put(("done", dict(out)))
                except BaseException as exc:  # noqa: BLE001 - handed to the step that waits for it
                    await events.put(("error", exc))

            self._rollout = asyncio.ensure_future(play())
            return events

        self._seen, self._tools_shown = 0, False
        return asyncio.run_coroutine_threadsafe(begin(), self._loop).result()

    def _next_event(self) -> tuple[str, Any]:
        kind, *rest = asyncio.run_coroutine_threadsafe(self._events.get(), self._loop).result()
        if kind == "call":
            prompt, self._pending, tools = rest
            return kind, (prompt, tools)
        return kind, rest[0]

    def _new_messages(self, call: tuple[list[Any], Any]) -> list[Message]:
        """The messages of a model call's prompt the trainer has not seen (the actions it sent left out), the
        call's tools written into the first system message the first time."""
        prompt, tools = call
        dicts = [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in prompt]
        new = [{k: d[k] for k in ("role", "content", "tool_call_id", "name") if d.get(k) is not None}
               for d in dicts[self._seen:] if d.get("role") != "assistant"]
        self._seen = len(dicts)
        if tools and not self._tools_shown:
            self._tools_shown = True
            text = tools_instructions([{"type": "function", "function": _tool_dict(t)} for t in tools])
            if new and new[0]["role"] == "system" and isinstance(new[0].get("content"), str):
                new[0] = {**new[0], "content": new[0]["content"] + "\n\n" + text}
            else:
                new.insert(0, {"role": "system", "content": text})
        try:
            return from_openai([{**d, "content": d.get("content") or ""} for d in new])
        except (ValueError, TypeError, KeyError) as exc:
            raise self._malformed("rollout", f"a prompt that is not chat messages ({exc})") from None

    @staticmethod
    def _ending(payload: Any) -> str:
        if isinstance(payload, BaseException):
            return f"{type(payload).__name__}: {payload}"
        return f"error {encode_value(payload.get('error'))}" if isinstance(payload, dict) else repr(payload)

    def _stop_rollout(self) -> None:
        task, self._rollout, self._pending = self._rollout, None, None
        if task is not None:
            self._loop.call_soon_threadsafe(task.cancel)

    def close(self) -> None:
        self._stop_rollout()
        self._loop.call_soon_threadsafe(self._loop.stop)
        super().close()


def _tool_dict(tool: Any) -> dict[str, Any]:
    """A verifiers tool (``vf.Tool`` or its dict) as an OpenAI function: name, description, parameters."""
    data = tool.model_dump() if hasattr(tool, "model_dump") else dict(tool)
    data = data.get("function", data)
    return {k: data[k] for k in ("name", "description", "parameters") if k in data}


def _bridge_client(vf: Any, events: asyncio.Queue) -> Any:
    """A verifiers ``Client`` whose every model call waits for the trainer's action (put on ``events`` as
    ``("call", prompt, future)``)."""

    class BridgeClient(vf.Client):
        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any, tools: Any = None, **kwargs: Any) -> Any:
            reply = asyncio.get_running_loop().create_future()
            await events.put(("call", prompt, reply, tools))
            return await reply

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            text, calls = split_reply(response)
            tool_calls = [vf.ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                          for c in calls]
            message = vf.ResponseMessage(content=text if tool_calls else response, tool_calls=tool_calls or None,
                                         finish_reason="tool_calls" if tool_calls else "stop", is_truncated=False)
            return vf.Response(id="relax-gym", created=int(time.time()), model=MODEL_NAME, message=message)

        async def close(self) -> None:
            return None

    return BridgeClient(object())
