"""Which rollout engine a run hosts: ``inference.engine: embedded | sglang`` → one :class:`EngineHost`.

    host = start_engine(cfg.inference, cfg.model, build=lambda: (copy.deepcopy(model).eval(), processor),
                        names=checkpoint_names(model))
    host.url                      # SGLang's HTTP protocol (DCS pushes, agents in sandboxes)
    client = host.async_client()  # rollouts, the same AsyncEngineClient for both engines
    host.dispatch("POST", "/generate", body)   # one request answered in process (the inference role's handle calls)
    host.push_weights(state_dict, version)      # colocate mode; async mode pushes through the run's DCS
    host.close()

- ``embedded``: :class:`~relax_gym.trainer.engines.embedded.EmbeddedEngine` on the model ``build()`` returns, served
  on ``inference.host``; pushes are ``/update_weights_from_tensor`` (same process, safetensors payload).
- ``sglang``: ``python -m sglang.launch_server`` for ``inference.sglang.model_path`` (default ``model.path``), see
  :mod:`~relax_gym.trainer.engines.sglang`; ``build`` is never called. Pushes go through the DCS with
  ``inference.sglang.weight_sync`` (``nccl``, falling back to ``disk``; or ``disk``). For an MoE policy
  (``model.family: qwen3_omni_moe``) the server is launched with ``--enable-return-routed-experts``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from relax_gym.trainer.engines.client import AsyncEngineClient, EngineClient, EngineError

if TYPE_CHECKING:
    from relax_gym.trainer.config import InferenceSection
    from relax_gym.trainer.dcs.transports import Transport
    from relax_gym.trainer.policy import PolicyConfig

__all__ = ["EmbeddedHost", "EngineHost", "SGLangHost", "push_transport", "sglang_model_path", "start_engine",
           "weight_transport"]

Build = Callable[[], tuple[Any, Any]]
# SGLang records routed experts only when launched with this flag (the rollouts of an MoE policy ask for them)
ROUTED_EXPERTS_FLAG = "--enable-return-routed-experts"


class EngineHost(Protocol):
    kind: str
    url: str

    @property
    def alive(self) -> bool: ...

    def dispatch(self, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]: ...

    def async_client(self, **kwargs: Any) -> AsyncEngineClient: ...

    def weight_version(self) -> str | None: ...

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | str) -> Any: ...

    def close(self) -> None: ...


def sglang_model_path(inference: InferenceSection, policy: PolicyConfig) -> str:
    """The checkpoint SGLang serves: ``inference.sglang.model_path``, else ``model.path``."""
    path = inference.sglang.model_path or policy.path
    if path is None:
        raise ValueError("inference.engine=sglang needs a checkpoint to serve: set inference.sglang.model_path or model.path")
    return str(path)


def weight_transport(inference: InferenceSection) -> str:
    """The DCS transport name of a run's coordinator: ``tcp`` for embedded engines, ``inference.sglang.weight_sync``
    for SGLang."""
    return inference.sglang.weight_sync if inference.engine == "sglang" else "tcp"


def push_transport(name: str, *, disk_dir: str | None = None) -> str | Transport:
    """What a :class:`~relax_gym.trainer.dcs.client.DCSClient` pushes with for a coordinator whose transport is
    ``name``: ``nccl`` becomes NCCL with the disk fallback; other names are used as they are."""
    if name == "nccl":
        from relax_gym.trainer.dcs.fallback import NcclOrDiskTransport

        return NcclOrDiskTransport(disk_dir=disk_dir)
    return name


def start_engine(inference: InferenceSection, policy: PolicyConfig, *, build: Build | None = None,
                 names: Mapping[str, str] | None = None, log_dir: str | Path | None = None) -> EngineHost:
    """Start the engine ``inference.engine`` names. ``build``: returns ``(model, processor)`` for the embedded
    engine (default: ``build_policy(policy)``); ``names``: state_dict key → checkpoint name for SGLang pushes;
    ``log_dir``: where the SGLang server log goes (default a temporary file)."""
    if inference.engine == "sglang":
        return SGLangHost.launch(inference, policy, names=names, log_dir=log_dir)
    if inference.engine != "embedded":
        raise ValueError(f"unknown inference.engine {inference.engine!r} (choose embedded or sglang)")
    if build is None:
        from relax_gym.trainer.policy import build_policy

        def build() -> tuple[Any, Any]:
            return build_policy(policy)

    model, processor = build()
    return EmbeddedHost(model, processor, inference)


class EmbeddedHost:
    """The embedded engine and its loopback HTTP server."""

    kind = "embedded"

    def __init__(self, model: Any, processor: Any, inference: InferenceSection) -> None:
        from relax_gym.trainer.engines.embedded import EmbeddedEngine
        from relax_gym.trainer.engines.http_server import serve

        self.engine = EmbeddedEngine(model, processor, max_batch=inference.max_batch)
        try:
            self.server = serve(self.engine, host=inference.host, port=0)
        except BaseException:
            self.engine.close()  # its scheduler thread, and a model the caller no longer holds
            raise
        self.url = self.server.url
        self._sync: EngineClient | None = None
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return bool(self.engine.alive)

    def dispatch(self, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
        from relax_gym.trainer.engines.handle_transport import dispatch_http

        return dispatch_http(self.server, method, path, raw)

    def async_client(self, **kwargs: Any) -> AsyncEngineClient:
        return AsyncEngineClient(self.url, **kwargs)

    def weight_version(self) -> str | None:
        return self.engine.weight_version

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | str) -> Any:
        with self._lock:
            if self._sync is None:
                self._sync = EngineClient(self.url)
        return self._sync.update_weights_from_tensor(state_dict, weight_version=str(version))

    def close(self) -> None:
        try:
            if self._sync is not None:
                self._sync.close()
        finally:
            try:
                self.server.close()
            finally:
                self.engine.close()


class SGLangHost:
    """A launched SGLang server, the proxy that answers the inference role's calls, and (colocate mode) the DCS
    client that pushes weights to it."""

    kind = "sglang"

    def __init__(self, server: Any, tokens: Any, inference: InferenceSection, names: Mapping[str, str] | None) -> None:
        from relax_gym.trainer.engines.sglang import SGLangProxy

        self.server = server
        self.url = server.url
        self.tokens = tokens
        self.inference = inference
        self.names = names
        self.proxy = SGLangProxy(server.url, tokens)
        self._dcs: Any = None
        self._lock = threading.Lock()

    @classmethod
    def launch(cls, inference: InferenceSection, policy: PolicyConfig, *, names: Mapping[str, str] | None = None,
               log_dir: str | Path | None = None) -> SGLangHost:
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
        return cls(server, tokens, inference, names)

    @property
    def alive(self) -> bool:
        return self.server.alive

    def dispatch(self, method: str, path: str, raw: bytes) -> tuple[int, str, bytes]:
        return self.proxy.dispatch(method, path, raw)

    def async_client(self, **kwargs: Any) -> AsyncEngineClient:
        from relax_gym.trainer.engines.sglang import SGLangTransport

        return AsyncEngineClient(self.url, transport=SGLangTransport(self.tokens), **kwargs)

    def weight_version(self) -> str | None:
        with EngineClient(self.url, timeout=30.0, retries=1) as client:
            try:
                return client.get_weight_version()
            except EngineError:
                return None

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int | str) -> Any:
        """A DCS push (pause → load → flush → continue) to this server; returns the ``PushReport``."""
        with self._lock:
            if self._dcs is None:
                from relax_gym.trainer.dcs import DCSClient, DCSCoordinator

                transport = weight_transport(self.inference)
                coordinator = DCSCoordinator([self.url], transport=transport)
                self._dcs = DCSClient(coordinator, names=self.names,
                                      transport=push_transport(transport, disk_dir=self.inference.sglang.disk_dir),
                                      disk_dir=self.inference.sglang.disk_dir)
            return self._dcs.push(state_dict, version)

    def close(self) -> None:
        try:
            if self._dcs is not None:
                self._dcs.close()
        finally:
            self.proxy.close()
            self.server.close()
