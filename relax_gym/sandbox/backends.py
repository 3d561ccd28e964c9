"""Backend lookup and selection. ``RELAX_GYM_SANDBOX=docker|bwrap|auto`` (default auto): auto takes docker when an
engine answers, else bwrap, else raises one error saying what to install."""

from __future__ import annotations

import importlib
import os

from relax_gym.sandbox.base import Backend, SandboxUnavailable

ENV_VAR = "RELAX_GYM_SANDBOX"
_BACKENDS = {"docker": "relax_gym.sandbox.docker:DockerBackend", "bwrap": "relax_gym.sandbox.bwrap:BwrapBackend"}
_instances: dict[str, Backend] = {}


def backend_names() -> tuple[str, ...]:
    return tuple(_BACKENDS)


def get_backend(name: str) -> Backend:
    """The (shared) backend object for ``name``; does not check that it works here."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(_BACKENDS)} or auto")
    if name not in _instances:
        module, cls = _BACKENDS[name].split(":")
        _instances[name] = getattr(importlib.import_module(module), cls)()
    return _instances[name]


def select_backend(name: str | None = None) -> Backend:
    """Resolve ``name`` (default: $RELAX_GYM_SANDBOX, else auto) to a backend that works here."""
    choice = (name or os.environ.get(ENV_VAR) or "auto").strip().lower()
    if choice != "auto":
        backend = get_backend(choice)
        problem = backend.check()
        if problem:
            raise SandboxUnavailable(f"sandbox backend {choice!r} ({ENV_VAR}) cannot run here: {problem}")
        return backend
    reasons = []
    for candidate in _BACKENDS:
        backend = get_backend(candidate)
        problem = backend.check()
        if problem is None:
            return backend
        reasons.append(f"{candidate}: {problem}")
    raise SandboxUnavailable(
        "no sandbox backend works on this machine. " + "; ".join(reasons)
        + ". Install and start Docker (apt-get install docker.io; dockerd) or install bubblewrap (apt-get install bubblewrap)."
    )


def doctor() -> dict[str, str | None]:
    """{backend: None if it works, else why not} — what `relax-gym sandbox doctor` prints."""
    return {name: get_backend(name).check() for name in _BACKENDS}
