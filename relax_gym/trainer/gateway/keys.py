"""Per-episode API keys for the OpenAI endpoint, and who a request speaks for.

An env worker that lets an agent loose in a sandbox gives it a key bound to the episode's session::

    key = api.keys.issue("episode-17")        # a random secret
    agent_env["OPENAI_API_KEY"] = key          # the agent's client sends "Authorization: Bearer <key>"
    ...                                        # every call of that agent is recorded into "episode-17"
    api.keys.revoke("episode-17")              # the agent is done; the session stays until it is read and dropped

The registry keeps only a hash of each key (a lookup never compares secrets byte by byte), one key per session:
issuing again for a session replaces its key. How the routes use a :class:`Caller` is described in
:mod:`~relax_gym.trainer.gateway.api`.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ADMIN", "ANONYMOUS", "Caller", "EpisodeKeys", "valid_session_id"]

KEY_PREFIX = "relax-ek-"
_SESSION_RE = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def valid_session_id(value: Any) -> bool:
    """A session id is 1-128 characters of letters, digits and ``. _ : @ -`` (it appears in URLs)."""
    return isinstance(value, str) and _SESSION_RE.match(value) is not None


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class EpisodeKeys:
    """Thread-safe registry of episode keys: session id ↔ (the hash of) one secret key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_digest: dict[str, str] = {}
        self._by_session: dict[str, str] = {}

    def issue(self, session_id: str) -> str:
        """A new random key for ``session_id`` (replacing the one it had). Requests that send it as
        ``Authorization: Bearer <key>`` are recorded into that session and may read and drop it."""
        if not valid_session_id(session_id):
            raise ValueError(f"session id {str(session_id)[:40]!r} must be 1-128 characters of letters, digits and . _ : @ -")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        digest = _digest(key)
        with self._lock:
            old = self._by_session.pop(session_id, None)
            if old is not None:
                self._by_digest.pop(old, None)
            self._by_session[session_id] = digest
            self._by_digest[digest] = session_id
        return key

    def revoke(self, session_id: str) -> bool:
        """Forget the session's key (its recorded calls stay); False when it had none."""
        with self._lock:
            digest = self._by_session.pop(session_id, None)
            if digest is None:
                return False
            self._by_digest.pop(digest, None)
            return True

    def session_of(self, key: str) -> str | None:
        """The session an issued key belongs to; None for any other string."""
        with self._lock:
            return self._by_digest.get(_digest(key))

    def has_key(self, session_id: str) -> bool:
        """Whether a key is issued for the session (then only that key or the admin token reach it)."""
        with self._lock:
            return session_id in self._by_session

    def sessions(self) -> set[str]:
        """The sessions that have a key."""
        with self._lock:
            return set(self._by_session)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_session)


@dataclass(frozen=True)
class Caller:
    """Who a request speaks for: ``"admin"`` (the server's token, or an in-process call), ``"key"`` (an episode
    key; ``session`` is its session) or ``"anonymous"`` (no token is configured and no key was sent)."""

    kind: Literal["admin", "key", "anonymous"]
    session: str | None = None


ADMIN = Caller("admin")
ANONYMOUS = Caller("anonymous")
