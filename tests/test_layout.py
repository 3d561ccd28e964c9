"""The house rules of DESIGN.md, checked on the source: one direction of dependency between packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "relax_gym"
# package -> relax_gym packages it must never import
FORBIDDEN = {
    "omni": {"envs", "sandbox", "trainer", "cli"},
    "sandbox": {"omni", "envs", "trainer", "cli"},
    "envs": {"trainer", "cli"},
    "trainer": {"cli"},
}


def relax_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "relax_gym" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    files = sorted((PKG / package).rglob("*.py"))
    assert files, f"relax_gym/{package} has no modules"
    bad = {str(f.relative_to(PKG)): sorted(relax_imports(f) & FORBIDDEN[package]) for f in files}
    assert not {f: v for f, v in bad.items() if v}, f"{package} imports what it must not: {bad}"


def test_checker_sees_violations(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from relax_gym.trainer import x\nimport relax_gym.envs.core\n")
    assert relax_imports(probe) == {"trainer", "envs"}
