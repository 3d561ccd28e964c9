"""The network rule, checked on the source: tests, benchmarks and scripts connect only to loopback (127.0.0.0/8, ::1)
or to namespaces they made themselves, so no file of theirs may name any other IP address. A sandbox's isolation
is shown from inside (its interfaces, a host loopback listener it cannot reach), never by trying a public address.

Every IPv4 literal (and IPv6 literal in a URL, ``//[addr]``) in those files must be loopback or unspecified
(0.0.0.0 / ``::``, a bind address). A line that names another address without connecting to it (a fake node
address in a URL-building test) says so with the marker ``not-a-connection-target`` and why."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "benchmarks", "scripts", ".ci")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".json", ""}
MARKER = "not-a-connection-target"
IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
IPV6_IN_URL = re.compile(r"//\[([0-9a-fA-F:]*:[0-9a-fA-F:.]*)\]")


def _files() -> list[Path]:
    out = []
    for top in SCANNED:
        root = REPO / top
        if root.is_dir():
            out += [p for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                    and "__pycache__" not in p.parts and p.stat().st_size < 1_000_000]
    return out


def _allowed(text: str) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return True  # not an address (e.g. 999.1.2.3)
    return address.is_loopback or address.is_unspecified


def offending_lines(text: str) -> list[tuple[int, str]]:
    """(line number, address) for each address a line names that is neither loopback nor unspecified."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if MARKER in line:
            continue
        for match in (*IPV4.finditer(line), *IPV6_IN_URL.finditer(line)):
            if not _allowed(match.group(1)):
                found.append((number, match.group(1)))
    return found


def test_the_scan_finds_what_it_must():
    # not-a-connection-target: the examples below are the scanner's own input
    examples = {
        "socket.create_connection(('1.1.1.1', 80))": [(1, "1.1.1.1")],  # not-a-connection-target
        "s.connect(('10.255.255.255', 1))\nhttp://[2001:db8::1]:80/": [(1, "10.255.255.255"), (2, "2001:db8::1")],  # not-a-connection-target
        "127.0.0.1 127.8.9.1 0.0.0.0 http://[::1]:8000 version 2.60.0 rows[::2]": [],
        f"lambda: '10.1.2.3'  # {MARKER}: a fake node address": [],  # not-a-connection-target
    }
    for text, expected in examples.items():
        assert offending_lines(text) == expected, text


@pytest.mark.parametrize("top", SCANNED)
def test_no_file_names_a_non_loopback_address(top):
    bad = [f"{path.relative_to(REPO)}:{number}: {address}" for path in _files() if path.parts[len(REPO.parts)] == top
           for number, address in offending_lines(path.read_text(errors="replace"))]
    assert not bad, ("tests, benchmarks and scripts may connect only to loopback; these lines name another address "
                     f"(mark a line that does not connect with '{MARKER}: why'):\n" + "\n".join(bad))
