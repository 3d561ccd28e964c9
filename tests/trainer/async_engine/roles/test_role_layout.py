"""DESIGN.md's rule for the async engine: a role module never imports another role module."""

from __future__ import annotations

import ast
from pathlib import Path

ROLES = Path(__file__).resolve().parents[4] / "relax_gym" / "trainer" / "async_engine" / "roles"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_roles_do_not_import_each_other():
    modules = sorted(p for p in ROLES.glob("*.py") if p.name != "__init__.py")
    assert {p.stem for p in modules} >= {"env_worker", "inference", "reference", "advantages", "actor"}
    for path in modules:
        others = {f"relax_gym.trainer.async_engine.roles.{p.stem}" for p in modules if p != path}
        bad = imported_modules(path) & (others | {"relax_gym.trainer.async_engine.roles"})
        assert not bad, f"{path.name} imports another role: {sorted(bad)}"
