"""Where relax-gym keeps what it makes once and reuses (samples, env-server logs, foreign frameworks' venvs, ...):
``$RELAX_GYM_CACHE``, else ``~/.cache/relax-gym``. Imports nothing of relax_gym: any module may use it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """The cache's folder: ``$RELAX_GYM_CACHE`` (``~`` expanded), else ``~/.cache/relax-gym``."""
    cache = os.environ.get("RELAX_GYM_CACHE")
    return Path(cache).expanduser() if cache else Path.home() / ".cache" / "relax-gym"
