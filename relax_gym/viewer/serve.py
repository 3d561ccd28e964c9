"""Serving the viewer: uvicorn on a socket bound here, so port 0 (any free port) works and the URL printed is the
real one (a test, or a person, reads it from the first line)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

__all__ = ["bind", "serve"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6 by the address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    return sock


def serve(run_dir: str | Path, *, host: str = "127.0.0.1", port: int = 0,
          announce: Callable[[str], None] = print) -> None:
    """Serve ``run_dir`` until interrupted; ``announce`` gets the URL once the socket listens."""
    import uvicorn

    from relax_gym.viewer.app import make_app

    sock = bind(host, port)
    bound_port = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(make_app(run_dir), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    announce(f"http://{shown}:{bound_port}/")
    server.run(sockets=[sock])
