"""NeMo-Gym resources servers as relax-gym envs: ``relax_gym.make("nemo-gym:http://HOST:PORT", data_file=...)``.

NeMo-Gym is not on the package index (it installs from its repository, Python 3.12), so nothing of it is imported:
this adapter speaks the resources server's HTTP protocol as NeMo-Gym's docs describe it, from the trainer's own
process (it needs only httpx). A resources server holds an environment's tools and its verifier:

- ``POST /seed_session``: starts a session (the server keeps its state under a session cookie);
- ``POST /<tool name>`` with the call's JSON arguments: the tool's JSON result, within that session;
- ``POST /verify`` with ``{"responses_create_params": <the task>, "response": <the rollout as a Responses API
  response>, ...the task row's other fields}``: ``{"reward": ...}``.

Tasks are rows of a JSONL file in NeMo-Gym's layout: ``{"responses_create_params": {"input": [messages], "tools":
[{"type": "function", "name", "description", "parameters"}]}, ...}``. What maps to what:

- reset picks a row (``pick``), opens a cookie session and seeds it with the row (as NeMo-Gym's agents do); the
  opening is the row's ``input`` (Responses API messages: ``input_text``, ``input_image`` data URLs and
  ``input_audio`` become our parts, :mod:`relax_gym.omni.responses_api`) with its tools written into the
  system message (the policy calls them as ``<tool_call>`` blocks, as with our own tools);
- a step whose action calls tools posts each call to its route: the results are tool messages (not terminal, reward
  0); a step without a tool call is the final answer: the rollout (each call as a ``function_call`` and its
  ``function_call_output``, the answer as an assistant ``message``) goes to ``/verify``, whose ``reward`` ends the
  episode (the response's other numbers land in ``reward_breakdown``);
- the gold actions come from ``gold``, ``str.format`` templates over the row's fields other than the task, one per
  turn (a tool call, then the answer; the last one serves later turns).

A route that fails (an HTTP error, a refused connection, a reply that is not JSON, a reward that is not a number)
ends the episode as an ``env_error`` naming NeMo-Gym, the server and the call. Lost: the Responses API model server
and agent server of a NeMo-Gym setup (the trainer is both); MCP tool access.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from relax_gym.envs.core import Opening, Outcome
from relax_gym.envs.interop.adapter import ForeignAgentEnv, TaskFileError, TaskPicker, fill_gold
from relax_gym.envs.remote.wire import encode_value
from relax_gym.omni import Message, TextPart, from_openai
from relax_gym.omni.openai_tools import split_reply
from relax_gym.omni.responses_api import ResponsesRequestError, chat_messages
from relax_gym.omni.tool_calls import tools_instructions


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The task rows of a NeMo-Gym JSONL file, each with ``responses_create_params.input``."""
    if not path.is_file():
        raise TaskFileError(f"{path}: no such task file")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}, line {n}: not JSON ({exc.msg})") from None
        params = row.get("responses_create_params") if isinstance(row, dict) else None
        if not isinstance(params, dict) or not isinstance(params.get("input"), (list, str)) or not params["input"]:
            raise TaskFileError(f"{path}, line {n}: field 'responses_create_params.input' must be a message list or text")
        rows.append(row)
    if not rows:
        raise TaskFileError(f"{path}: no rows")
    return rows


class NemoGymEnv(ForeignAgentEnv):
    framework_title = "NeMo-Gym"
    media_kinds = ("image", "audio")  # Responses API input: input_image, input_audio (a video comes as frames)

    def __init__(self, env_id: str, *, data_file: str, gold: str | list[str] | None = None, pick: str = "random",
                 reward_bounds: tuple[float, float] = (0.0, 1.0), max_turns: int = 8, call_timeout_s: float = 300.0,
                 **kwargs: Any) -> None:
        super().__init__(env_id, call_timeout_s=call_timeout_s, max_turns=max_turns, **kwargs)
        self.base_url, self.data_file = env_id.rstrip("/"), Path(data_file)
        self.rows, self.picker = read_rows(self.data_file), TaskPicker(pick)
        self.gold_templates = [gold] if isinstance(gold, str) else list(gold or [])
        self.reward_range_ = tuple(reward_bounds)
        self._http: httpx.Client | None = None
        self._row: dict[str, Any] = {}
        self._index = 0  # the row's index in the task file
        self._output: list[dict[str, Any]] = []  # the rollout so far, as Responses API output items

    def _reset(self, options: dict[str, Any]) -> Opening:
        index = self.picker.next(len(self.rows), self.np_random)
        self._row, self._output = self.rows[index], []
        if self._http is None:  # one client for the env's life (making one costs ~10 ms: its TLS context)
            self._http = httpx.Client(base_url=self.base_url, timeout=self.call_timeout_s)
        self._http.cookies.clear()  # a new episode is a new session
        self._post("seed_session", self._row)  # the whole row, as NeMo-Gym's agents send it
        params = self._row["responses_create_params"]
        items = params["input"] if isinstance(params["input"], list) else [{"role": "user", "content": params["input"]}]
        try:
            conversation = chat_messages(items)
        except ResponsesRequestError as exc:
            raise TaskFileError(f"{self.data_file}, line {index + 1}: responses_create_params.{exc}") from None
        tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
                 for t in params.get("tools") or [] if t.get("type") == "function"]
        if tools:
            text = tools_instructions(tools)
            if conversation and conversation[0]["role"] == "system" and isinstance(conversation[0]["content"], str):
                conversation[0] = {"role": "system", "content": conversation[0]["content"] + "\n\n" + text}
            else:
                conversation.insert(0, {"role": "system", "content": text})
        self._index = index
        return Opening(from_openai(conversation), self._gold_for(0), {"task_index": index})

    def _gold_for(self, turn: int) -> str:
        """The gold action of turn ``turn``: its template (the last one for later turns) over the row's fields."""
        if not self.gold_templates:
            return ""
        template = self.gold_templates[min(turn, len(self.gold_templates) - 1)]
        fields = {k: v for k, v in self._row.items() if k != "responses_create_params"}
        return fill_gold(template, fields, where=self._where(f"gold ({self.data_file}, line {self._index + 1})"))

    def _step(self, action: str) -> Outcome:
        _, calls = split_reply(action)
        if calls:
            results = []
            for call in calls:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                result = self._post(name, json.loads(arguments))
                output = json.dumps(result, ensure_ascii=False)
                self._output += [{"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"], "name": name,
                                  "arguments": arguments, "status": "completed"},
                                 {"type": "function_call_output", "call_id": call["id"], "output": output}]
                results.append(Message("tool", (TextPart(output),), name=name, tool_call_id=call["id"]))
            return Outcome(results, 0.0, False, {}, gold=self._gold_for(self._turn))
        self._output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex[:12]}", "role": "assistant",
                             "status": "completed", "content": [{"type": "output_text", "text": action, "annotations": []}]})
        verdict = self._post("verify", {**self._row, "response": self._response()})
        if not isinstance(verdict, dict) or "reward" not in verdict:
            raise self._malformed("verify", f"{type(verdict).__name__} without a 'reward'")
        reward = self._reward("verify", verdict["reward"])
        numbers = {k: float(v) for k, v in verdict.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "reward"}
        return Outcome([], reward, True, {"verify": reward, **numbers},
                       info={"nemo_gym_verify": encode_value({k: v for k, v in verdict.items() if k not in ("response",
                                                                                                 "responses_create_params")})})

    def _response(self) -> dict[str, Any]:
        """The rollout as a Responses API response object."""
        params = self._row["responses_create_params"]
        return {"id": f"resp_{uuid.uuid4().hex[:12]}", "object": "response", "created_at": int(time.time()),
                "model": "relax-gym-policy", "status": "completed", "output": list(self._output),
                "tools": params.get("tools") or [], "tool_choice": params.get("tool_choice", "auto"),
                "parallel_tool_calls": bool(params.get("parallel_tool_calls", True))}

    def _post(self, route: str, body: dict[str, Any]) -> Any:
        assert self._http is not None
        call = f"POST /{route}"

        def request() -> Any:
            reply = self._http.post(f"/{route}", json=body)
            reply.raise_for_status()
            return reply.json()

        return self._call(call, request)

    def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            http.close()
        super().close()
