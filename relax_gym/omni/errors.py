"""Errors raised by media handling. Each one names the file (or source) it is about."""

from __future__ import annotations


class MediaError(ValueError):
    """A media file or buffer could not be read or decoded.

    ``source`` is the path (or a short description of an in-memory source) so callers can point the
    user at the culprit without parsing the message.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"{source}: {reason}")
