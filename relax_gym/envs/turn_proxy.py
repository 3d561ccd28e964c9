"""A loopback OpenAI chat endpoint that turns an agent program's model calls into gymnasium turns.

:class:`~relax_gym.envs.agent_program.AgentProgramEnv` plays a black-box agent turn by turn through this proxy:
each ``POST /v1/chat/completions`` the program makes is handed to the env as an event (the conversation the
model would see, only the messages that are new since the previous call), and the call waits until the env
answers it with the policy's action. The action's ``<tool_call>`` blocks become the response's ``tool_calls``.

One endpoint per process, on 127.0.0.1; every episode has its own API key, compared in constant time. A call with
a key of no open episode (a program left over from an earlier one) is refused with 401, and
:meth:`TurnProxy.close_episode` refuses the call in flight, so the program stops. Play is append-only: a call that
does not extend the previous one (the agent rewrote its history) is refused, and the env ends that episode as an
``env_error`` (the black-box path trains such agents).
"""

from __future__ import annotations

import hmac
import json
import queue
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from relax_gym.envs.agent_run import AgentEndpoint, ProgramRun
from relax_gym.omni import Message, TextPart, from_openai
from relax_gym.omni.openai_tools import (
    FunctionTool,
    conversation_dicts,
    reply_key,
    split_reply,
    tool_mode,
)
from relax_gym.omni.api_streams import ChatEvents, DoneCompletion, MessagesEvents, ResponsesEvents
from relax_gym.omni.messages_api import MessagesRequestError, message_object
from relax_gym.omni.messages_api import chat_body as messages_chat_body
from relax_gym.omni.messages_api import error_body as messages_error
from relax_gym.omni.messages_api import parse_request as parse_messages
from relax_gym.omni.responses_api import (
    ResponsesRequestError,
    continued_chat_body,
    conversation_after,
    response_object,
)
from relax_gym.omni.responses_api import parse_request as parse_responses


MAX_BODY_BYTES = 64 << 20


@dataclass
class CallEvent:
    """A model call: the messages new since the previous one."""

    messages: list[Message]


@dataclass
class ProgramExit:
    run: ProgramRun


@dataclass
class _Episode:
    key: str
    events: queue.Queue = field(default_factory=queue.Queue)
    pending: queue.Queue | None = None  # where the call in flight waits for its reply
    seen: list[Message] = field(default_factory=list)
    raw_replies: dict[tuple, str] = field(default_factory=dict)  # reply_key(content, tool_calls) -> the reply text
    closed: bool = False
    first_error: str | None = None  # the first request of this episode's key that was refused
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # Responses API id -> its conversation


class _Server:
    """The process's one loopback endpoint; episodes are told apart by their keys (see :class:`TurnProxy`)."""

    _instance: _Server | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.episodes: dict[str, _Episode] = {}
        server = self

        class Handler(_Handler):
            owner = server

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, name="turn-proxy", daemon=True).start()

    @classmethod
    def shared(cls) -> _Server:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def episode(self, key: str) -> _Episode | None:
        with self.lock:
            found = next((e for k, e in self.episodes.items() if hmac.compare_digest(k, key)), None)
        return found

    def note_refusal(self, key: str, status: int, method: str, path: str, message: str) -> None:
        """Keep the first refused request of an episode's key (what an agent that made no call tripped on)."""
        episode = self.episode(key) if key else None
        if episode is not None and episode.first_error is None:
            episode.first_error = f"{status} for {method} {path}: {message}"[:500]

    def call(self, key: str, body: Any) -> tuple[int, dict[str, Any]]:
        """One model call of the episode ``key`` names: handed to the env, answered with its reply."""
        episode = self.episode(key)
        if episode is None:
            return 401, _error("the API key does not belong to an episode in progress", "invalid_api_key")
        try:
            conversation, tools_listed = _conversation(body, episode.raw_replies)
        except (ValueError, ValidationError) as exc:  # ConversationFormatError is a ValueError
            return 400, _error(str(exc), "invalid_request_error", "messages")
        n = len(episode.seen)
        if conversation[:n] != episode.seen:
            # turn-by-turn play is append-only: an agent that rewrote its history cannot be played this way (the
            # black-box path, run_program, trains such agents; see trainer/rollout/program_episode.py)
            episode.events.put(HistoryRewritten())
            return 409, _error("the conversation does not extend the previous call's: turn-by-turn play needs an "
                               "append-only history", "history_rewritten")
        pending: queue.Queue = queue.Queue(maxsize=1)
        with self.lock:
            if episode.closed:
                return 503, _error("the episode ended before this call was answered", "episode_closed")
            if episode.pending is not None:
                return 409, _error("another model call of this episode is still waiting for its reply", "conflict")
            episode.pending = pending
        episode.events.put(CallEvent(conversation[n:]))
        text = pending.get()  # close_episode always answers a pending call (None), under the same lock
        if text is None:
            return 503, _error("the episode ended before this call was answered", "episode_closed")
        content, calls = split_reply(text) if tools_listed else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
            episode.raw_replies[reply_key(content, calls)] = text
        episode.seen = conversation + [Message(role="assistant", content=(TextPart(text),))]
        finish = "tool_calls" if calls else "stop"
        return 200, {"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": 0,
                     "model": str(body.get("model", "policy")), "system_fingerprint": None,
                     "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                     "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}


@dataclass
class HistoryRewritten:
    """The program sent a conversation that does not extend the previous call's (its call was refused)."""


class TurnProxy:
    """One env's handle on the process's endpoint (see the module doc): at most one open episode at a time. Every
    env shares the same port, so sandboxes of every env share one socket bridge and one pool spec."""

    def __init__(self) -> None:
        self._server = _Server.shared()
        self._episode: _Episode | None = None

    @property
    def base_url(self) -> str:
        return self._server.base_url

    def open_episode(self) -> AgentEndpoint:
        self.close_episode()
        episode = _Episode(key=f"turn-{secrets.token_hex(16)}")
        with self._server.lock:
            self._server.episodes[episode.key] = episode
        self._episode = episode
        return AgentEndpoint(self.base_url, episode.key)

    def next_event(self, timeout: float) -> CallEvent | ProgramExit | HistoryRewritten:
        """The program's next call, or its exit; TimeoutError when neither comes within ``timeout``."""
        episode = self._current()
        try:
            return episode.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"the agent program neither called the model nor exited within {timeout:g} s") from None

    def reply(self, text: str) -> None:
        """Answer the call in flight with ``text`` (the policy's action)."""
        episode = self._current()
        with self._server.lock:
            pending, episode.pending = episode.pending, None
        if pending is None:
            raise RuntimeError("no model call is waiting for a reply")
        pending.put(text)

    def first_error(self) -> str | None:
        """The open episode's first refused request (:meth:`_Server.note_refusal`), or None."""
        return self._episode.first_error if self._episode is not None else None

    def program_exited(self, key: str, run: ProgramRun) -> None:
        episode = self._server.episode(key)
        if episode is not None:
            episode.events.put(ProgramExit(run))

    def close_episode(self) -> None:
        episode, self._episode = self._episode, None
        if episode is None:
            return
        with self._server.lock:
            self._server.episodes.pop(episode.key, None)
            episode.closed = True
            pending, episode.pending = episode.pending, None
        if pending is not None:
            pending.put(None)

    def close(self) -> None:
        self.close_episode()

    def _current(self) -> _Episode:
        if self._episode is None:
            raise RuntimeError("no episode is open")
        return self._episode


def _conversation(body: dict[str, Any], raw_replies: dict[tuple, str]) -> tuple[list[Message], bool]:
    """The conversation the model sees for a request (tools rendered into the system message, as the trainer's
    endpoint renders them), and whether tools are listed (then the reply's tool calls are parsed)."""
    raw_tools = body.get("tools") or []
    if not isinstance(raw_tools, list):
        raise ValueError("tools must be a list")  # noqa: TRY004 - answered as a 400 with the other request errors
    tools = [FunctionTool.model_validate(t) for t in raw_tools]
    mode = tool_mode(tools, body.get("tool_choice"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    dicts = conversation_dicts(messages, tools, mode, raw_text=lambda calls, key: raw_replies.get(key))
    return from_openai(dicts), mode.listed


def _error(message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


class _Handler(BaseHTTPRequestHandler):
    owner: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "relax-gym"}]})
        else:
            self._send(404, _error(f"no route {self.path}", "not_found_error"))

    def do_POST(self) -> None:
        route = self.path.rstrip("/")
        if route not in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
            self._send(404, _error(f"no route {self.path} (this endpoint serves POST /v1/chat/completions, "
                                   f"/v1/responses and /v1/messages)", "not_found_error"))
            return
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            length = -1
        if length < 0:
            self._send(411, _error("a Content-Length header with the body's size is required", "invalid_request_error"))
            return
        if length > MAX_BODY_BYTES:
            self._send(413, _error(f"body of {length} bytes is larger than {MAX_BODY_BYTES}", "invalid_request_error"))
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            self._send(400, _error(f"invalid JSON: {exc}", "invalid_request_error"))
            return
        if not isinstance(body, dict):
            self._send(400, _error("the body must be a JSON object", "invalid_request_error"))
            return
        key = self._key()
        if route == "/v1/responses":
            self._send(*self._responses(key, body))
            return
        if route == "/v1/messages":
            self._send(*self._messages(key, body))
            return
        status, answer = self.owner.call(key, body)
        if status == 200 and body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._send(status, ChatEvents(DoneCompletion(answer), include_usage=include_usage))
            return
        self._send(status, answer)

    def _key(self) -> str:
        """The episode key: a bearer (OpenAI's clients) or ``x-api-key`` (Anthropic's)."""
        auth = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        return auth or (self.headers.get("x-api-key") or "").strip()

    def _messages(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Anthropic's Messages call as the chat call it means (:mod:`relax_gym.omni.messages_api`), its errors in
        Anthropic's shape."""
        try:
            req = parse_messages(body)
            chat = messages_chat_body(req)
        except MessagesRequestError as exc:
            return 400, messages_error(400, str(exc))
        status, answer = self.owner.call(key, chat)
        if status != 200:
            return status, messages_error(status, (answer.get("error") or {}).get("message", ""))
        if req.stream:
            return 200, MessagesEvents(DoneCompletion(answer), req)
        return 200, message_object(req, answer)

    def _responses(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The Responses API call as the chat call it means (:mod:`relax_gym.omni.responses_api`)."""
        episode = self.owner.episode(key)
        try:
            req = parse_responses(body)
            chat = continued_chat_body(req, episode.responses.get if episode is not None else lambda _: None,
                                       "this episode")
        except ResponsesRequestError as exc:
            return 400, _error(str(exc), "invalid_request_error", exc.param)
        status, answer = self.owner.call(key, chat)
        if status != 200:
            return status, answer

        def keep(response: dict[str, Any], completion: dict[str, Any]) -> None:
            if episode is not None:
                episode.responses[response["id"]] = conversation_after(req, chat, completion)

        if req.stream:
            return 200, ResponsesEvents(DoneCompletion(answer), req, on_done=keep)
        response = response_object(req, answer)
        keep(response, answer)
        return 200, response

    def _send(self, status: int, body: Any) -> None:
        if getattr(body, "live", False):  # an API's events (stream: true): the reply exists whole, sent as events
            self.send_response(status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for event in body:
                self.wfile.write(event)
            return
        if status >= 400:
            message = (body.get("error") or {}).get("message", "")
            self.owner.note_refusal(self._key(), status, self.command, self.path, message)
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)
