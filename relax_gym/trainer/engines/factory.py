"""Which rollout engine a run hosts: ``inference.engine: embedded | sglang`` → one :class:`EngineHost`.

    host = start_engine(cfg.inference, cfg.model, build=lambda: (copy.deepcopy(model).eval(), processor))
    host.url                      # SGLang's HTTP protocol (DCS pushes, agents in sandboxes)
    client = host.async_client()  # rollouts, the same AsyncEngineClient for both engines
    host.generate(body)           # one /generate body (a dict) answered in process: the inference role's handle calls
    host.close()

Weights are pushed by the DCS (``make_pusher`` in ``trainer/dcs/push.py``), never by the host; this package
does not import the DCS. An embedded engine that must receive distributed pushes (the async engine's tcp
transport) is given the DCS's engine-side group code by whoever composes the two: ``start_engine(...,
weight_receiver=GroupReceiver())``.

- ``embedded``: :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine` on the model ``build()`` returns, served
  on ``inference.host`` (``host.engine`` is the engine object).
- ``sglang``: ``python -m sglang.launch_server`` for ``inference.sglang.model_path`` (default ``model.path``), see
  :mod:`~relax_gym.trainer.engines.sglang`; ``build`` is never called. For an MoE policy
  (``model.family: qwen3_omni_moe``) the server is launched with ``--enable-return-routed-experts``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from relax_gym.trainer.engines.client import AsyncEngineClient, EngineClient, EngineError, EngineHTTPError
from relax_gym.trainer.engines.settings import InferenceSection

if TYPE_CHECKING:
    from relax_gym.trainer.policy import PolicyConfig

__all__ = ["EmbeddedHost", "EngineHost", "SGLangHost", "sglang_model_path", "start_engine"]

Build = Callable[[], tuple[Any, Any]]
# SGLang records routed experts only when launched with this flag (the rollouts of an MoE policy ask for them)
ROUTED_EXPERTS_FLAG = "--enable-return-routed-experts"


class EngineHost(Protocol):
    kind: str
    url: str

    @property
    def alive(self) -> bool: ...

    def generate(self, body: Mapping[str, Any], on_token: Callable[[int], None] | None = None) -> Any: ...

    def async_client(self, **kwargs: Any) -> AsyncEngineClient: ...

    def weight_version(self) -> str | None: ...

    def close(self) -> None: ...


def sglang_model_path(inference: InferenceSection, policy: PolicyConfig) -> str:
    """The checkpoint SGLang serves: ``inference.sglang.model_path``, else ``model.path``."""
    path = inference.sglang.model_path or policy.path
    if path is None:
        raise ValueError("inference.engine=sglang needs a checkpoint to serve: set inference.sglang.model_path or model.path")
    return str(path)


def start_engine(inference: InferenceSection, policy: PolicyConfig, *, build: Build | None = None,
                 log_dir: str | Path | None = None, weight_receiver: Any = None) -> EngineHost:
    """Start the engine ``inference.engine`` names. ``build``: returns ``(model, processor)`` for the embedded
    engine (default: ``build_policy(policy)``); ``log_dir``: where the SGLang server log goes (default a temporary
    file); ``weight_receiver``: the embedded engine's end of distributed weight pushes (the DCS's
    ``GroupReceiver``; without one it takes tensor and disk updates only)."""
    if inference.engine == "sglang":
        return SGLangHost.launch(inference, policy, log_dir=log_dir)
    if inference.engine != "embedded":
        raise ValueError(f"unknown inference.engine {inference.engine!r} (choose embedded or sglang)")
    if build is None:
        from relax_gym.trainer.policy import build_policy

        def build() -> tuple[Any, Any]:
            return build_policy(policy)

    model, processor = build()
    return EmbeddedHost(model, processor, inference, weight_receiver=weight_receiver)


class EmbeddedHost:
    """The embedded engine and its loopback HTTP server."""

    kind = "embedded"

    def __init__(self, model: Any, processor: Any, inference: InferenceSection, *, weight_receiver: Any = None) -> None:
        from relax_gym.trainer.engines.embedded import EmbeddedEngine
        from relax_gym.trainer.engines.http_server import serve

        self.engine = EmbeddedEngine(model, processor, max_batch=inference.max_batch, weight_receiver=weight_receiver)
        try:
            self.server = serve(self.engine, host=inference.host, port=0)
        except BaseException:
            self.engine.close()  # its scheduler thread, and a model the caller no longer holds
            raise
        self.url = self.server.url

    @property
    def alive(self) -> bool:
        return bool(self.engine.alive)

    def generate(self, body: Mapping[str, Any], on_token: Callable[[int], None] | None = None) -> Any:
        """One ``/generate`` body answered in process: the response dict (a list for a batch request). A request
        the engine refuses raises :class:`~relax_gym.trainer.engines.client.EngineHTTPError` (400). ``on_token``
        (one request): each token id as the engine samples it (from its scheduler thread)."""
        from relax_gym.trainer.engines.embedded import EngineRequestError

        try:
            out = self.engine.generate(body, on_token=on_token)  # looked up per call: fault injection wraps it
        except EngineRequestError as exc:
            raise EngineHTTPError(400, str(exc), "/generate") from None
        return [o.to_json() for o in out] if isinstance(out, list) else out.to_json()

    def async_client(self, **kwargs: Any) -> AsyncEngineClient:
        return AsyncEngineClient(self.url, **kwargs)

    def weight_version(self) -> str | None:
        return self.engine.weight_version

    def close(self) -> None:
        try:
            self.server.close()
        finally:
            self.engine.close()


class SGLangHost:
    """A launched SGLang server and the proxy that answers the inference role's calls over its HTTP protocol."""

    kind = "sglang"

    def __init__(self, server: Any, tokens: Any, inference: InferenceSection) -> None:
        from relax_gym.trainer.engines.sglang import SGLangProxy

        self.server = server
        self.url = server.url
        self.tokens = tokens
        self.inference = inference
        self.proxy = SGLangProxy(server.url, tokens)

    @classmethod
    def launch(cls, inference: InferenceSection, policy: PolicyConfig, *, log_dir: str | Path | None = None) -> SGLangHost:
        from relax_gym.trainer.engines.sglang import MediaTokens, launch_sglang

        s = inference.sglang
        path = sglang_model_path(inference, policy)
        tokens = MediaTokens.from_checkpoint(path)  # also checks the checkpoint exists before launching
        log_path = None
        if log_dir is not None:
            import os

            log_path = Path(log_dir) / f"sglang-{os.getpid()}.log"
        extra_args = list(s.extra_args)
        if policy.family == "qwen3_omni_moe" and ROUTED_EXPERTS_FLAG not in extra_args:
            extra_args.append(ROUTED_EXPERTS_FLAG)  # MoE rollouts ask every request for its routed experts
        server = launch_sglang(path, host=inference.host, port=s.port, tp_size=s.tp_size,
                               mem_fraction_static=s.mem_fraction_static, extra_args=extra_args, python=s.python,
                               startup_timeout_s=s.startup_timeout_s, log_path=log_path)
        return cls(server, tokens, inference)

    @property
    def alive(self) -> bool:
        return self.server.alive

    def generate(self, body: Mapping[str, Any], on_token: Callable[[int], None] | None = None) -> Any:
        """One ``/generate`` body, forwarded to the server over loopback HTTP (mapped for SGLang); its answer
        decoded. An error answer raises :class:`~relax_gym.trainer.engines.client.EngineHTTPError`. ``on_token``
        is not called: the proxy answers once (the tokens come with the answer)."""
        status, _, raw = self.proxy.dispatch("POST", "/generate", json.dumps(body).encode())
        try:
            data = json.loads(raw)
        except ValueError:
            data = raw.decode(errors="replace")
        if status >= 400:
            message = data.get("message", data) if isinstance(data, Mapping) else data
            raise EngineHTTPError(status, str(message), "/generate", data)
        return data

    def async_client(self, **kwargs: Any) -> AsyncEngineClient:
        from relax_gym.trainer.engines.sglang import SGLangTransport

        return AsyncEngineClient(self.url, transport=SGLangTransport(self.tokens), **kwargs)

    def weight_version(self) -> str | None:
        with EngineClient(self.url, timeout=30.0, retries=1) as client:
            try:
                return client.get_weight_version()
            except EngineError:
                return None

    def close(self) -> None:
        try:
            self.proxy.close()
        finally:
            self.server.close()
