"""A stand-in model for agent-program tests: a loopback OpenAI chat endpoint that answers from a script."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from relax_gym.omni.openai_tools import split_reply


class ScriptedModel:
    """Answers each ``/v1/chat/completions`` call with ``reply(request_body, call_index)`` (tool-call blocks become
    ``tool_calls`` when the request lists tools); keeps every request body in ``requests``."""

    def __init__(self, reply: Callable[[dict[str, Any], int], str]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.keys: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner._lock:
                    index = len(owner.requests)
                    owner.requests.append(body)
                    owner.keys.append(self.headers.get("Authorization", ""))
                text = reply(body, index)
                content, calls = split_reply(text) if body.get("tools") else (text, [])
                message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
                raw = json.dumps({"id": f"c{index}", "object": "chat.completion", "created": 0, "model": "m",
                                  "choices": [{"index": 0, "message": message, "logprobs": None,
                                               "finish_reason": "tool_calls" if calls else "stop"}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def gold_replies(env_cls: type, seed: int, **kwargs: Any) -> list[str]:
    """The gold replies of ``seed``'s task, drawn the way the env draws it (without running its program)."""
    import gymnasium

    env = env_cls(runner="local", **kwargs)
    gymnasium.Env.reset(env, seed=seed)
    return env._make_task({}).gold_replies
