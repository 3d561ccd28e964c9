"""The agents' routes on an engine's own HTTP server: one port for SGLang's native endpoints and the OpenAI ones.

    server = serve_with_agents(engine)      # /generate, /health, ... and /v1/chat/completions, /v1/relax/sessions
    key = server.openai.keys.issue("episode-17")

The engine server (:mod:`relax_gym.trainer.engines.http_server`) is inference only; the ``/v1`` routes are an
:class:`~relax_gym.trainer.gateway.api.OpenAIAPI` over the same engine object, mounted on it here.
"""

from __future__ import annotations

from typing import Any

from relax_gym.trainer.engines.http_server import EngineServer, serve
from relax_gym.trainer.gateway.api import OpenAIAPI

__all__ = ["serve_with_agents"]


def serve_with_agents(engine: Any, host: str = "127.0.0.1", port: int = 0, *, close_engine: bool = False,
                      model_name: str | None = None, token: str | None = None) -> EngineServer:
    """:func:`~relax_gym.trainer.engines.http_server.serve` with an :class:`OpenAIAPI` over ``engine`` on ``/v1``
    (``model_name``: the name ``/v1/models`` lists); ``.openai`` is that API."""
    return serve(engine, host, port, close_engine=close_engine, openai=OpenAIAPI(engine, model_name=model_name),
                 token=token)
