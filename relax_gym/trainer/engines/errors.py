"""The errors an engine raises, with the HTTP status the server answers them with."""

from __future__ import annotations


class EngineRequestError(ValueError):
    """A request the engine refuses (HTTP 400): malformed, unsupported, or inconsistent with its media."""

    status_code = 400


class EngineClosedError(RuntimeError):
    """The engine was closed."""

    status_code = 503
