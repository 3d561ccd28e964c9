"""Who may talk to an env server: the token's environment variable and the loopback test (a server without a token
binds loopback only; a client of a loopback server reads media by reference). Shared by the server, its clients and
the launcher."""

from __future__ import annotations

import ipaddress

TOKEN_VAR = "RELAX_GYM_ENV_TOKEN"  # the token, for servers and clients that are not given one explicitly


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
