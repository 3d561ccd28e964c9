"""The house rules of DESIGN.md and docs/architecture.md, checked on the source: one direction of dependency between
packages, and inside the trainer between its subsystem folders.

Imports under ``if TYPE_CHECKING:`` are type hints only (no run-time dependency) and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "relax_gym"
TRAINER = PKG / "trainer"

# package -> relax_gym packages it must never import
FORBIDDEN = {
    "omni": {"envs", "sandbox", "trainer", "cli", "bench"},
    "sandbox": {"omni", "envs", "trainer", "cli", "bench"},
    "envs": {"trainer", "cli", "bench"},
    "trainer": {"cli", "bench"},
    "viewer": {"trainer", "envs", "sandbox", "cli", "bench"},  # reads a run directory's files only
}

# The trainer's units (a folder, or one of the root modules) and the units each may import. Read bottom-up:
# algorithms <- policy <- {engines, actors} <- {rollout, dcs, base} <- config <- rewards <- run <- {colocate, async_engine} <- train.
# Only async_engine uses the data bus (and plan, which runs it on a virtual clock); nothing imports tools (python -m
# entry points).
LOW = {"algorithms", "faults", "databus"}
ALLOWED: dict[str, set[str]] = {
    "algorithms": set(),
    "faults": set(),
    "databus": set(),
    "policy": {"algorithms"},
    # published checkpoints: their files as data, stand-ins written in code, the directory check, sizes per rank
    # (by the megatron backend's own sharding rules: actors/megatron/shard.py)
    "models": {"policy", "algorithms", "actors"},
    "engines": {"policy", "algorithms"},
    "actors": {"policy", "algorithms"},
    "rollout": {"policy", "algorithms", "engines"},  # the episode runner speaks the engine's protocol
    "dcs": {"policy", "algorithms", "actors"},  # never engines: engines get their receiving end injected
    "base": {"policy", "algorithms", "actors", "engines"},  # the base stage: a captioning SFT before any run
    "config": {"algorithms", "faults", "policy", "engines", "base"},
    # the judge (GenRM core), its engine in colocate mode and the judge models built in code
    "rewards": {"algorithms", "policy", "engines", "actors", "rollout", "config", "base"},
    "run": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "base", "rewards"},
    "colocate": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "base", "rewards"},
    "async_engine": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "databus",
                     "base", "rewards"},
    "train": {"config", "colocate", "async_engine", "base"},
    "tools": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "colocate", "base",
              "async_engine", "databus", "rewards", "models"},
    # the planner (relax-gym plan): the async controller, its scheduling pieces and the in-process bus on a virtual clock
    "plan": {"async_engine", "databus", "config", "rollout"},
}
# relax_gym packages outside the trainer each unit may use (only the episode-running and driving units meet envs)
ENVS_USERS = {"rollout", "run", "colocate", "async_engine", "tools", "base", "rewards"}
ROOT_UNITS = {"config_loader": "config"}  # root modules that belong to another unit


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside ``if TYPE_CHECKING:`` blocks."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                for inner in ast.walk(sub):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        lines.add(inner.lineno)
    return lines


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every ``relax_gym`` module ``path`` imports (at module level or inside functions)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] == "relax_gym"}


def relax_imports(path: Path) -> set[str]:
    return {m.split(".")[1] for m in imported_modules(path) if len(m.split(".")) > 1}


def unit_of_module(dotted: str) -> str | None:
    """The trainer unit a dotted module name belongs to (``relax_gym.trainer.dcs.client`` -> ``dcs``)."""
    parts = dotted.split(".")
    if parts[:2] != ["relax_gym", "trainer"] or len(parts) < 3:
        return None
    return ROOT_UNITS.get(parts[2], parts[2])


def unit_of_file(path: Path) -> str:
    rel = path.relative_to(TRAINER).parts
    name = rel[0][:-3] if len(rel) == 1 else rel[0]
    return ROOT_UNITS.get(name, name)


def trainer_violations(path: Path) -> list[str]:
    unit = unit_of_file(path)
    bad = []
    for module in sorted(imported_modules(path)):
        target = unit_of_module(module)
        if target is not None and target not in {unit, "__init__"} and target not in ALLOWED[unit]:
            bad.append(f"{module} ({unit} may not import {target})")
        if module.split(".")[1:2] == ["envs"] or module == "relax_gym" or module.startswith("relax_gym.make"):
            if unit not in ENVS_USERS:
                bad.append(f"{module} ({unit} may not use the environments)")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    files = sorted((PKG / package).rglob("*.py"))
    assert files, f"relax_gym/{package} has no modules"
    bad = {str(f.relative_to(PKG)): sorted(relax_imports(f) & FORBIDDEN[package]) for f in files}
    assert not {f: v for f, v in bad.items() if v}, f"{package} imports what it must not: {bad}"


def test_trainer_units_are_known():
    units = {unit_of_file(p) for p in TRAINER.rglob("*.py")} - {"__init__"}
    assert units <= set(ALLOWED), f"trainer units without a rule in tests/test_layout.py: {sorted(units - set(ALLOWED))}"
    root = sorted(p.name for p in TRAINER.glob("*.py"))
    assert len(root) <= 6, f"relax_gym/trainer/ holds at most six modules (subsystems live in folders): {root}"


@pytest.mark.parametrize("unit", sorted(ALLOWED))
def test_trainer_dependency_direction(unit):
    files = sorted(p for p in TRAINER.rglob("*.py") if unit_of_file(p) == unit)
    assert files, f"relax_gym/trainer has no {unit}"
    bad = {str(f.relative_to(PKG)): v for f in files if (v := trainer_violations(f))}
    assert not bad, f"{unit} imports what it must not: {bad}"


def test_nothing_imports_tools():
    users = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if not p.is_relative_to(TRAINER / "tools")
             and any(unit_of_module(m) == "tools" for m in imported_modules(p))]
    assert not users, f"tools/ holds python -m entry points; nothing imports them: {users}"


def test_checker_sees_violations(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from relax_gym.trainer import x\nimport relax_gym.envs.core\n")
    assert relax_imports(probe) == {"trainer", "envs"}


def test_trainer_checker_sees_violations(tmp_path, monkeypatch):
    """A planted import in each direction the rules forbid is found: inside a function, and an engines <-> dcs tie."""
    fake = tmp_path / "trainer"
    (fake / "engines").mkdir(parents=True)
    (fake / "dcs").mkdir()
    (fake / "policy").mkdir()
    (fake / "engines" / "embedded.py").write_text("def f():\n    from relax_gym.trainer.dcs.client import DCSClient\n")
    (fake / "dcs" / "client.py").write_text("import relax_gym.trainer.engines.client\n")
    (fake / "policy" / "tokenizer.py").write_text("def corpus():\n    import relax_gym\n    return relax_gym.make('x')\n")
    (fake / "dcs" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from relax_gym.trainer.engines import client\n")
    monkeypatch.setattr(__import__(__name__), "TRAINER", fake, raising=False)
    monkeypatch.setitem(globals(), "TRAINER", fake)
    assert trainer_violations(fake / "engines" / "embedded.py") == [
        "relax_gym.trainer.dcs.client (engines may not import dcs)",
        "relax_gym.trainer.dcs.client.DCSClient (engines may not import dcs)"]
    assert trainer_violations(fake / "dcs" / "client.py") == ["relax_gym.trainer.engines.client (dcs may not import engines)"]
    assert trainer_violations(fake / "policy" / "tokenizer.py") == ["relax_gym (policy may not use the environments)"]
    assert trainer_violations(fake / "dcs" / "typed.py") == []
