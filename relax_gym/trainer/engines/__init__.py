"""Rollout engines behind SGLang's HTTP protocol: inference only (the agents' OpenAI endpoint, its keys and session
recording are :mod:`relax_gym.trainer.gateway`).

- :mod:`~relax_gym.trainer.engines.protocol`: SGLang's ``/generate`` request and response schemas (pydantic);
  :mod:`~relax_gym.trainer.engines.media_items`: the media-item extension carrying relax sampling specs;
  :mod:`~relax_gym.trainer.engines.admin_protocol`: the weight / admin requests and the safetensors tensor codec;
  :mod:`~relax_gym.trainer.engines.validation`: validation errors as one line naming the fields.
- :mod:`~relax_gym.trainer.engines.embedded`: :class:`EmbeddedEngine`, a thread-safe, dynamically batching engine
  on a transformers model (CPU or GPU), with weight updates (tensors, disk, torch.distributed broadcast) and
  pause / continue.
- :mod:`~relax_gym.trainer.engines.http_server`: ``serve(engine)``, SGLang's native endpoints on the stdlib HTTP server
  (an agents' API handed in as ``openai=`` is served on ``/v1``).
- :mod:`~relax_gym.trainer.engines.client`: :class:`EngineClient` / :class:`AsyncEngineClient` (httpx), speaking
  only the HTTP protocol, so they drive a real SGLang server too.
- :mod:`~relax_gym.trainer.engines.serve_client`: :class:`HandleEngineClient`, the async engine's env workers'
  client: coalesced deployment-handle calls of the inference role (no HTTP, no JSON).
- :mod:`~relax_gym.trainer.engines.settings`: the ``inference:`` section of a recipe;
  :mod:`~relax_gym.trainer.engines.bearer`: the ``Authorization: Bearer`` header.
- :mod:`~relax_gym.trainer.engines.process`: ``spawn_engine``, an engine server in a child process.
- :mod:`~relax_gym.trainer.engines.sglang`: ``launch_sglang``, a real SGLang server as a child process group, and
  the request mapping that lets the same client drive it.
- :mod:`~relax_gym.trainer.engines.factory`: ``start_engine``, the engine ``inference.engine`` names.

Names are imported lazily (the engine pulls in transformers; the client does not).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EmbeddedEngine": "embedded",
    "EngineRequestError": "embedded",
    "serve": "http_server",
    "EngineServer": "http_server",
    "EngineClient": "client",
    "AsyncEngineClient": "client",
    "CoalescingClient": "coalesce",
    "HandleEngineClient": "serve_client",
    "GenerateOutput": "client",
    "EngineHTTPError": "client",
    "EngineConnectionError": "client",
    "EngineProcess": "process",
    "spawn_engine": "process",
    "SGLangServer": "sglang",
    "launch_sglang": "sglang",
    "start_engine": "factory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
