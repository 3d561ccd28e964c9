"""The ``Authorization: Bearer <token>`` header: reading it, and comparing it with a server's token in constant time.
Used by the engine's HTTP server and by the agents' gateway (:mod:`relax_gym.trainer.gateway.keys`)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

__all__ = ["bearer_of", "token_matches"]


def bearer_of(headers: Mapping[str, str] | Any) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    if headers is None:
        return None
    value = headers.get("Authorization")
    if value is None and isinstance(headers, Mapping):
        value = next((v for k, v in headers.items() if str(k).lower() == "authorization"), None)
    if not value:
        return None
    scheme, _, token = str(value).strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


def token_matches(sent: str | None, token: str | None) -> bool:
    """Constant-time check of a sent bearer against the admin token."""
    return sent is not None and token is not None and hmac.compare_digest(sent.encode(), token.encode())
