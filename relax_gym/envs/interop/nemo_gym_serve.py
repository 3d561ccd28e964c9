"""A relax-gym env served as a NeMo-Gym resources server: ``relax-gym envs serve ID --protocol nemo-gym``.

NeMo-Gym's agents (its ``simple_agent``: seed the session with the task row, call the model, post each function call
to the resources server, send the rollout to ``/verify``) play our envs through the routes a resources server has:

- ``POST /seed_session`` with the task row: a new episode of the env, reset with the row's ``relax_seed``, kept
  under a session cookie (``relax_gym_session``);
- ``POST /<tool>`` with the call's JSON arguments: the env's step with that call as its action (our
  ``<tool_call>`` text); the reply is ``{"output": the new messages' text, "media": their media as Responses API
  parts, "reward": the step's reward, "done": ...}`` (``done`` is what NeMo-Gym's ``use_done_flag`` reads);
- ``POST /verify`` with the row and the rollout (``response``, a Responses API response): the last assistant
  message's text is the env's final step (if the episode is still open); the reply is the request with
  ``reward`` (the episode's return), ``relax_status`` and ``relax_reward_breakdown`` added, and the session ends;
- ``GET /health``.

Task rows (:func:`task_rows`, ``--rows FILE``): one per seed, ``responses_create_params.input`` the env's opening as
Responses API messages with every medium decoded and inline (:func:`relax_gym.omni.responses_api.to_responses_input`),
``tools`` the env's tools as Responses API function tools, and ``relax_env``, ``relax_seed`` and ``relax_gold`` (the
gold action of each turn of a gold play).

Lost: per-step rewards are summed into the one ``reward``; a tool result's media reach the model only as data URLs
inside the function call's output text (a function call output is a string); the opening's system message still
carries our text instructions for tool calls beside the native ``tools``. Sessions are in memory (at most
``max_sessions``, the oldest dropped when full); loopback only (a resources server has no token).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import relax_gym
from relax_gym.omni import Message
from relax_gym.omni.responses_api import to_responses_input
from relax_gym.omni.tool_calls import format_tool_call

COOKIE = "relax_gym_session"


def _tools(env: Any) -> list[dict[str, Any]]:
    """The env's tools as Responses API function tools (none for an env without a toolbox)."""
    toolbox = getattr(env.unwrapped, "toolbox", None)
    return [{"type": "function", **schema["function"]} for schema in (toolbox.schemas() if toolbox else [])]


def _text(messages: list[Message]) -> str:
    return "\n".join(part.text for m in messages for part in m.content if part.kind == "text")


def _media(messages: list[Message]) -> list[dict[str, Any]]:
    return [p for item in to_responses_input([Message(m.role, tuple(x for x in m.content if x.kind != "text"))
                                              for m in messages]) for p in item["content"]]


def task_rows(env_id: str, episodes: int, *, first_seed: int = 0, kwargs: dict[str, Any] | None = None,
              max_turns: int = 32) -> list[dict[str, Any]]:
    """``episodes`` task rows in NeMo-Gym's layout, seeds ``first_seed`` onwards (see the module's doc)."""
    env = relax_gym.make(env_id, **(kwargs or {}))
    rows = []
    try:
        for seed in range(first_seed, first_seed + episodes):
            obs, info = env.reset(seed=seed)
            row = {"responses_create_params": {"input": to_responses_input(obs), "tools": _tools(env)},
                   "relax_env": env_id, "relax_seed": seed}
            golds = []
            for _ in range(max_turns):
                golds.append(info.get("gold", ""))
                _, _, terminated, truncated, info = env.step(golds[-1])
                if terminated or truncated:
                    break
            rows.append({**row, "relax_gold": golds})
    finally:
        env.close()
    return rows


class _Session:
    def __init__(self, env: Any, seed: int | None) -> None:
        self.env, self.episode_return, self.done = env, 0.0, False
        self.lock = threading.Lock()  # one agent a session, but a retried request may overlap
        env.reset(seed=seed)
        self.info: dict[str, Any] = {}

    def step(self, action: str) -> tuple[list[Message], float]:
        obs, reward, terminated, truncated, self.info = self.env.step(action)
        self.episode_return += float(reward)
        self.done = bool(terminated or truncated)
        return obs, float(reward)


def build_app(env_id: str, kwargs: dict[str, Any] | None = None, max_sessions: int = 64) -> Starlette:
    """The resources server's app for ``env_id`` (made with ``kwargs`` for every session)."""
    kwargs = dict(kwargs or {})
    sessions: OrderedDict[str, _Session] = OrderedDict()
    guard = threading.Lock()
    probe = relax_gym.make(env_id, **kwargs)
    tool_names = {t["name"] for t in _tools(probe)}
    probe.close()

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def session_of(request: Request) -> _Session | None:
        with guard:
            return sessions.get(request.cookies.get(COOKIE, ""))

    def seed_session(request: Request, row: dict[str, Any]) -> JSONResponse:
        seed = row.get("relax_seed")
        if seed is not None and not isinstance(seed, int):
            return error(422, f"relax_seed must be an integer, got {seed!r}")
        session = _Session(relax_gym.make(env_id, **kwargs), seed)
        key = uuid.uuid4().hex
        with guard:
            old = sessions.pop(request.cookies.get(COOKIE, ""), None)
            sessions[key] = session
            dropped = [sessions.popitem(last=False)[1] for _ in range(max(0, len(sessions) - max_sessions))]
        for s in [old, *dropped]:
            if s is not None:
                s.env.close()
        reply = JSONResponse({})
        reply.set_cookie(COOKIE, key, httponly=True, samesite="strict")
        return reply

    def verify(request: Request, body: dict[str, Any]) -> JSONResponse:
        session = session_of(request)
        if session is None:
            return error(400, "no session: POST /seed_session first (and send its cookie)")
        output = (body.get("response") or {}).get("output") or []
        answers = [item for item in output if isinstance(item, dict) and item.get("type") == "message"
                   and item.get("role") == "assistant"]
        text = "".join(p.get("text", "") for p in (answers[-1].get("content") or []) if isinstance(p, dict)) \
            if answers else ""
        with session.lock:
            if not session.done:
                session.step(text)
            info = session.info
        with guard:
            sessions.pop(request.cookies.get(COOKIE, ""), None)
        session.env.close()
        return JSONResponse({**body, "reward": session.episode_return, "relax_status": info.get("status", "ok"),
                             "relax_reward_breakdown": info.get("reward_breakdown", {})})

    def call_tool(request: Request, name: str, arguments: dict[str, Any]) -> JSONResponse:
        if name not in tool_names:
            return error(404, f"no tool {name!r} here (tools: {', '.join(sorted(tool_names)) or 'none'})")
        session = session_of(request)
        if session is None:
            return error(400, "no session: POST /seed_session first (and send its cookie)")
        with session.lock:
            if session.done:
                return error(409, "the episode has ended: POST /verify")
            obs, reward = session.step(format_tool_call(name, arguments))
        return JSONResponse({"output": _text(obs), "media": _media(obs), "reward": reward, "done": session.done})

    async def route(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        try:
            body = await request.json()
        except ValueError:
            return error(400, f"POST /{name}: the body is not JSON")
        if not isinstance(body, dict):
            return error(400, f"POST /{name}: the body must be a JSON object")
        handler = {"seed_session": seed_session, "verify": verify}.get(name)
        if handler is not None:
            return await run_in_threadpool(handler, request, body)
        return await run_in_threadpool(call_tool, request, name, body)

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "env": env_id, "sessions": len(sessions)})

    return Starlette(routes=[Route("/health", health, methods=["GET"]), Route("/{name}", route, methods=["POST"])])


def write_rows(path: str, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
