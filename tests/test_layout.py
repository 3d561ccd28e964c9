"""The house rules of DESIGN.md and docs/architecture.md, checked on the source: one direction of dependency between
packages, inside the trainer between its subsystem folders, and no import circle between any two files.

Every import counts: at module level, inside a function, and under ``if TYPE_CHECKING:`` (a type hint is a
dependency too: a factory typed with the config tree above it ties the two folders as surely as a call does; a
lower folder declares a Protocol of what it reads instead)."""

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
# Only async_engine uses the data bus (plan reaches it only through async_engine, whose controller it runs on a
# virtual clock); nothing imports tools (python -m entry points).
LOW = {"algorithms", "faults", "databus", "cluster"}
ALLOWED: dict[str, set[str]] = {
    "algorithms": set(),
    "faults": set(),
    "databus": set(),
    "cluster": set(),  # bringing up Ray (a local instance that survives a busy machine)
    "policy": {"algorithms"},
    # published checkpoints: their files as data, stand-ins written in code, the directory check, sizes per rank
    # (by the megatron backend's own sharding rules: actors/megatron/shard.py)
    "models": {"policy", "algorithms", "actors"},
    "engines": {"policy", "algorithms"},  # inference only
    # the agents' OpenAI endpoint over an engine (its protocol, HTTP server, errors); the engines never import it
    "gateway": {"policy", "algorithms", "engines"},
    "actors": {"policy", "algorithms", "cluster"},
    # the episode runner speaks the engine's protocol; an agent program's episode records through a gateway
    "rollout": {"policy", "algorithms", "engines", "gateway"},
    "dcs": {"policy", "algorithms", "actors"},  # never engines: engines get their receiving end injected
    "base": {"policy", "algorithms", "actors", "engines"},  # the base stage: a captioning SFT before any run
    # the config tree holds the sections the subsystems below it own (actors/settings.py, engines/settings.py, ...)
    "config": {"algorithms", "faults", "policy", "engines", "actors", "base"},
    # the judge (GenRM core), its engine in colocate mode and the judge models built in code
    "rewards": {"algorithms", "policy", "engines", "actors", "rollout", "config", "base"},
    "run": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "base", "rewards"},
    "colocate": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "base", "rewards"},
    "async_engine": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "databus",
                     "base", "rewards", "cluster"},
    "train": {"config", "colocate", "async_engine", "base"},
    "tools": {"algorithms", "faults", "policy", "engines", "actors", "rollout", "dcs", "config", "run", "colocate", "base",
              "async_engine", "databus", "rewards", "models", "cluster"},
    # the planner (relax-gym plan): the async controller, its scheduling pieces and the in-process bus on a virtual clock
    "plan": {"async_engine", "config", "rollout"},
}
# relax_gym packages outside the trainer each unit may use (only the episode-running and driving units meet envs)
ENVS_USERS = {"rollout", "run", "colocate", "async_engine", "tools", "base", "rewards"}
ROOT_UNITS = {"config_loader": "config"}  # root modules that belong to another unit


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every ``relax_gym`` module ``path`` imports (anywhere in the file), and of every name it
    imports from one (``from a.b import c`` gives ``a.b`` and ``a.b.c``: ``c`` may be a module)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
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
    assert trainer_violations(fake / "dcs" / "typed.py") == [  # a type hint ties the folders too
        "relax_gym.trainer.engines (dcs may not import engines)",
        "relax_gym.trainer.engines.client (dcs may not import engines)"]


# ---------------------------------------------------------------------------------------------- file-level circles


def module_files(root: Path) -> dict[str, Path]:
    """Every module under ``root`` (a ``relax_gym`` folder) by dotted name; a package by its ``__init__.py``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def file_graph(root: Path) -> dict[str, set[str]]:
    """Which module file imports which, counting every import as :func:`imported_modules` does. ``import a.b`` is an
    edge to ``a/b.py`` (or ``a/b/__init__.py``); ``from a.b import c`` to ``a/b/c.py`` when ``c`` is a module, else
    to ``a/b``'s file (the package that a submodule is imported from is its parent, already being imported: no edge)."""
    files = module_files(root)

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in files:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for module, path in files.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else resolve(node.module)
                            for a in node.names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_files():
    found = circles(file_graph(PKG))
    assert not found, "files that import each other (move the shared piece to a lower module): " + "; ".join(
        " <-> ".join(group) for group in found)


def test_circle_checker_sees_a_circle_through_a_function_and_a_type_hint(tmp_path):
    pkg = tmp_path / "relax_gym"
    (pkg / "envs").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "envs" / "__init__.py").write_text("")
    (pkg / "envs" / "a.py").write_text("def f():\n    from relax_gym.envs.b import B\n")
    (pkg / "envs" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from relax_gym.envs import c\n")
    (pkg / "envs" / "c.py").write_text("import relax_gym.envs.a\n")
    (pkg / "envs" / "d.py").write_text("from relax_gym.envs import a, b\n")  # imports the circle, is not in it
    assert circles(file_graph(pkg)) == [["relax_gym.envs.a", "relax_gym.envs.b", "relax_gym.envs.c"]]


def slow_markers_without_reason(tests_root: Path) -> list[str]:
    """`pytest.mark.slow` used bare or without reason=... (a test over a minute says why it needs that long)."""
    found = []
    for path in sorted(tests_root.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            target = node.func if isinstance(node, ast.Call) else node
            if not (isinstance(target, ast.Attribute) and target.attr == "slow" and isinstance(target.value, ast.Attribute)
                    and target.value.attr == "mark"):
                continue
            if isinstance(node, ast.Call) and any(k.arg == "reason" for k in node.keywords):
                continue
            if not isinstance(node, ast.Call) and _is_called(node, path):
                continue
            found.append(f"{path.relative_to(tests_root)}:{node.lineno}")
    return found


def _is_called(attr: ast.Attribute, path: Path) -> bool:
    """Whether this bare `pytest.mark.slow` attribute is the func of a call (checked as that call instead)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.lineno == attr.lineno
               and n.func.col_offset == attr.col_offset and n.func.attr == "slow" for n in ast.walk(tree))


def test_every_slow_marker_gives_its_reason():
    assert slow_markers_without_reason(PKG.parent / "tests") == []


def test_slow_marker_check_sees_a_bare_marker(tmp_path):
    (tmp_path / "test_x.py").write_text("import pytest\n\n@pytest.mark.slow\ndef test_a(): pass\n\n"
                                        "@pytest.mark.slow(reason='builds a model')\ndef test_b(): pass\n")
    assert slow_markers_without_reason(tmp_path) == ["test_x.py:3"]


# tests/ mirrors relax_gym/: a test file lives in the folder of the package it tests. Checked from its imports: every
# test folder is a package folder of relax_gym (but integration/ and fuzz/, which cut across packages); a file whose
# relax_gym imports all lie inside one deeper package belongs in that package's folder; and a file in a package's
# folder imports something from that package, or from the package root (the CLI and relax_gym.make reach anything).
CROSS_CUTTING_TEST_FOLDERS = {"integration", "fuzz", "data"}
MIRROR_EXCEPTIONS = {  # file -> why it sits where its imports do not say
    "sandbox/test_injected_hang.py": "the sandboxes under the trainer's hang hook; uses the sandbox backends' fixtures",
    "trainer/policy/test_processor.py": "the policy's processor, through tests/trainer/policy's fixtures",
    "trainer/policy/test_encode_cache.py": "the policy's media cache, through tests/trainer/policy's fixtures",
    "trainer/gateway/test_openai_continuation.py": "the gateway answering the official client, through its fixtures",
}


def _package_folders(pkg_root: Path) -> set[str]:
    folders = {p.relative_to(pkg_root).as_posix() for p in pkg_root.rglob("*") if (p / "__init__.py").is_file()}
    return folders | {""}


def _imported_folders(path: Path, folders: set[str]) -> list[str]:
    """The relax_gym package folder of every relax_gym module the file imports ('' for the package root)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("relax_gym"):
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("relax_gym")]
        for name in names:
            parts = name.split(".")[1:]
            found.append(next("/".join(parts[:k]) for k in range(len(parts), -1, -1) if "/".join(parts[:k]) in folders))
    return found


def _inside(folder: str, parent: str) -> bool:
    return parent == "" or folder == parent or folder.startswith(parent + "/")


def mirror_problems(tests_root: Path, pkg_root: Path, exceptions: dict[str, str]) -> list[str]:
    folders, problems = _package_folders(pkg_root), []
    for path in sorted(tests_root.rglob("test_*.py")):
        rel = path.relative_to(tests_root).as_posix()
        here = path.parent.relative_to(tests_root).as_posix().replace(".", "")
        if here.split("/")[0] in CROSS_CUTTING_TEST_FOLDERS or rel in exceptions:
            continue
        if here not in folders:
            problems.append(f"{rel}: tests/{here} mirrors no package folder of relax_gym")
            continue
        imported = [f for f in _imported_folders(path, folders)]
        if not imported or "" in imported:
            continue
        deepest = imported[0]
        while not all(_inside(f, deepest) for f in imported):
            deepest = deepest.rpartition("/")[0]
        if deepest != here and _inside(deepest, here):
            problems.append(f"{rel}: imports only relax_gym/{deepest}: move it to tests/{deepest}/")
        elif not any(_inside(f, here) for f in imported):
            problems.append(f"{rel}: imports nothing from relax_gym/{here}")
    return problems


def test_tests_mirror_the_package():
    assert mirror_problems(PKG.parent / "tests", PKG, MIRROR_EXCEPTIONS) == []
    stale = [f for f in MIRROR_EXCEPTIONS if not (PKG.parent / "tests" / f).is_file()]
    assert not stale, f"exceptions naming no test file: {stale}"


def test_mirror_check_sees_misplaced_tests(tmp_path):
    pkg, tests = tmp_path / "relax_gym", tmp_path / "tests"
    for folder in ("a", "a/b", "c"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    for folder in ("a", "zzz"):
        (tests / folder).mkdir(parents=True)
    (tests / "test_shallow.py").write_text("from relax_gym.a.b import x\n")
    (tests / "a" / "test_elsewhere.py").write_text("from relax_gym.c import y\n")
    (tests / "a" / "test_ok.py").write_text("from relax_gym.a.b import x\nfrom relax_gym.c import y\n")
    (tests / "zzz" / "test_orphan.py").write_text("")
    assert mirror_problems(tests, pkg, {}) == [
        "a/test_elsewhere.py: imports nothing from relax_gym/a",
        "test_shallow.py: imports only relax_gym/a/b: move it to tests/a/b/",
        "zzz/test_orphan.py: tests/zzz mirrors no package folder of relax_gym",
    ]
