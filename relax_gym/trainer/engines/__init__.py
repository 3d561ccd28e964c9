"""Rollout engines behind SGLang's HTTP protocol.

- :mod:`~relax_gym.trainer.engines.protocol`: SGLang's ``/generate`` and weight/admin request and response schemas
  (pydantic), the media-item extension carrying relax sampling specs, the safetensors tensor codec.
- :mod:`~relax_gym.trainer.engines.embedded`: :class:`EmbeddedEngine`, a thread-safe, dynamically batching engine
  on a transformers model (CPU or GPU), with weight updates (tensors, disk, torch.distributed broadcast) and
  pause / continue.
- :mod:`~relax_gym.trainer.engines.http_server`: ``serve(engine)``, SGLang's native endpoints on the stdlib HTTP server.
- :mod:`~relax_gym.trainer.engines.client`: :class:`EngineClient` / :class:`AsyncEngineClient` (httpx), speaking
  only the HTTP protocol, so they drive a real SGLang server too.
- :mod:`~relax_gym.trainer.engines.weight_sync`: the trainer side of the distributed weight update.
- :mod:`~relax_gym.trainer.engines.openai_api`: the OpenAI-compatible chat endpoint and its session recorder.
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
    "GenerateOutput": "client",
    "EngineHTTPError": "client",
    "EngineConnectionError": "client",
    "WeightUpdateGroup": "weight_sync",
    "OpenAIAPI": "openai_api",
    "SessionRecorder": "openai_api",
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
