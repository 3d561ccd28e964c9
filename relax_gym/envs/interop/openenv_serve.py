"""A relax-gym env served to OpenEnv clients by OpenEnv's own server: ``relax-gym envs serve ID --protocol openenv``.

Runs inside the OpenEnv venv (:mod:`relax_gym.envs.interop.venvs`, ``openenv-core``): OpenEnv's
``create_fastapi_app`` gives the routes its clients speak (``POST /reset``, ``POST /step``, ``GET /state``,
``GET /schema``, ``GET /health``, ``WS /ws``), around an OpenEnv ``Environment`` that holds one of our envs per
session. What maps to what:

- the action is ``{"text": "..."}`` (:class:`TextAction`): the assistant's text for the turn;
- the observation (:class:`OmniObservation`) is ``messages``, the turn's new messages as OpenAI chat messages with
  every medium inline (an image as an ``image_url`` data URL, audio as ``input_audio`` base64 WAV or an
  ``audio_url`` data URL of its file, video as a ``video_url`` data URL of the clip's file, each with its
  ``sampling`` spec: frames, fps, span), ``info`` (the env's, as JSON: ``gold``, ``status``, ``reward_breakdown``,
  ...), OpenEnv's ``reward`` and ``done`` (terminated or truncated);
- ``reset(seed=...)`` is the env's; ``state`` is OpenEnv's (``episode_id``, ``step_count``).

Lost: OpenEnv's MCP tool routes are not used (an env's tools are called through the action text, as the policy
calls them); the Gradio web page is not served.

``python -m relax_gym.envs.interop.openenv_serve ID --port P [--kwargs-file F] [--max-sessions N]``; the launcher
(:func:`relax_gym.envs.interop.serve.serve_openenv`) starts it with this checkout on the path.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any

from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

import relax_gym
from relax_gym.envs.remote.wire import encode_messages, encode_value


class TextAction(Action):
    """The assistant's text for the turn (what ``env.step`` takes)."""

    text: str = Field(description="the assistant's reply for this turn")


class OmniObservation(Observation):
    """The turn's new messages, OpenAI-style with media inline, and the env's info."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="new messages, OpenAI chat format")
    info: dict[str, Any] = Field(default_factory=dict, description="the env's info: gold, status, reward_breakdown, ...")


class RelaxOpenEnv(Environment):
    """One relax-gym env (one OpenEnv session) behind OpenEnv's Environment interface."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.env = relax_gym.make(env_id, **kwargs)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> OmniObservation:
        messages, info = self.env.reset(seed=seed)
        self._state = State(episode_id=episode_id or info.get("episode_id"), step_count=0)
        return OmniObservation(messages=encode_messages(messages, "inline"), info=encode_value(info), done=False,
                               reward=None)

    def step(self, action: TextAction, timeout_s: float | None = None, **kwargs: Any) -> OmniObservation:
        messages, reward, terminated, truncated, info = self.env.step(action.text)
        self._state = State(episode_id=self._state.episode_id, step_count=self._state.step_count + 1)
        return OmniObservation(messages=encode_messages(messages, "inline"), info=encode_value(info),
                               done=bool(terminated or truncated), reward=float(reward))

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.env.close()


def make_app(env_id: str, kwargs: dict[str, Any], max_sessions: int = 64) -> Any:
    """OpenEnv's FastAPI app serving ``env_id`` (made with ``kwargs``), one env per session."""
    relax_gym.spec(env_id)  # an unknown id fails here, before the server listens
    return create_fastapi_app(lambda: RelaxOpenEnv(env_id, kwargs), TextAction, OmniObservation,
                              max_concurrent_envs=max_sessions)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="Serve a relax-gym env to OpenEnv clients")
    parser.add_argument("env_id")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--kwargs-file", help="a JSON object of constructor kwargs for every session")
    parser.add_argument("--max-sessions", type=int, default=64)
    parser.add_argument("--ready-file", help="written with {'url': ...} once the server accepts connections")
    args = parser.parse_args(argv)
    kwargs = json.loads(open(args.kwargs_file).read()) if args.kwargs_file else {}
    app = make_app(args.env_id, kwargs, args.max_sessions)
    # bound and listening before uvicorn starts: connections wait in the backlog, so the URL is good from now on
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(128)
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    print(f"serving {args.env_id} to OpenEnv clients at {url}", flush=True)
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"url": url}, f)
        os.replace(tmp, args.ready_file)
    uvicorn.run(app, fd=sock.fileno(), log_level="warning")


if __name__ == "__main__":
    main()
