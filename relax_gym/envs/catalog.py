"""The env catalog: one row per registered env — exact id and version, modalities, turns, tools, sandbox, dataset
layout, reward parts — read from the registry and the manifests (nothing is built), for ``relax-gym envs list`` and
for docs/catalog.md, which is generated from it (``relax-gym envs catalog --write docs/catalog.md``; a test fails
when the file is stale).

Where a manifest says nothing the row says what it can without making the env: turns from the ``single-turn`` /
``multi-turn`` tags (else ``max_turns``), the sandbox from the ``sandbox`` tag, the dataset layout from the
manifest's ``[dataset]`` (or the env class's ``DEFAULT_DATASET``), the reward from ``[reward]`` (weights or rubric
parts, else "the env's own").
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from relax_gym.envs.registry import EnvSpec, list_envs, spec, versions

__all__ = ["CatalogRow", "catalog_markdown", "catalog_rows"]

COLUMNS = ("id", "version", "modalities", "turns", "tools", "sandbox", "dataset", "reward")


@dataclass(frozen=True)
class CatalogRow:
    id: str  # the exact id (``nextqa-video-v1``)
    version: str  # "1" (with older ones: "2 (also 1)"); "-" for an unversioned env
    modalities: str
    turns: str
    tools: str
    sandbox: str
    dataset: str
    reward: str
    description: str
    source: str

    def cells(self) -> tuple[str, ...]:
        return tuple(getattr(self, c) for c in COLUMNS)


def catalog_rows() -> list[CatalogRow]:
    """Every registered env, by id."""
    return [_row(spec(env_id)) for env_id in list_envs()]


def _row(s: EnvSpec) -> CatalogRow:
    m = s.manifest
    tags = set(m.tags) if m is not None else set()
    older = [v for v in versions(s.id) if v != s.version]
    version = "-" if s.version is None else str(s.version) + (f" (also {', '.join(map(str, older))})" if older else "")
    if "multi-turn" in tags:
        turns = "multi"
    elif "single-turn" in tags:
        turns = "single"
    else:
        max_turns = s.kwargs.get("max_turns")
        turns = "-" if max_turns is None else ("single" if int(max_turns) == 1 else f"up to {max_turns}")
    tools = ", ".join(m.tools) if m is not None and m.tools else "-"
    if m is not None and "agent-program" in tags and m.tools:
        tools += " (the program's own)"
    sandbox = "docker or bwrap" if "sandbox" in tags else "-"
    return CatalogRow(id=s.versioned_id, version=version, modalities=", ".join(s.resolved_modalities()) or "-",
                      turns=turns, tools=tools, sandbox=sandbox, dataset=_dataset(s), reward=_reward(s),
                      description=s.description, source=s.source)


def _dataset(s: EnvSpec) -> str:
    data = s.kwargs.get("dataset")
    if data is None:
        data = _class_attr(s.entry_point, "DEFAULT_DATASET")
    if not isinstance(data, dict) or not data.get("format"):
        return "-"
    sample = data.get("sample")
    return f"{data['format']}" + (f" (synthetic sample '{sample}' by default)" if sample else "")


def _reward(s: EnvSpec) -> str:
    m = s.manifest
    table = m.reward if m is not None else None
    if table is not None and table.parts is not None:
        return ", ".join(f"{p.name} {p.weight:g}" for p in table.parts)
    if table is not None:
        weights = table.weights_reward()
        return f"accuracy {weights.accuracy:g}, format {weights.format:g}"
    rubric = _class_attr(s.entry_point, "DESCRIBE_RUBRIC")  # a module whose env scores by a rubric of its own
    if rubric is not None and getattr(rubric, "parts", None):
        return ", ".join(f"{p.name} {p.weight:g}" for p in rubric.parts)
    weights = _constructor_defaults(s.entry_point, ("accuracy_weight", "format_weight"))
    if len(weights) == 2:
        extra = ", minus call_cost per call past free_calls" if _constructor_defaults(s.entry_point, ("call_cost",)) else ""
        return f"accuracy {weights['accuracy_weight']:g}, format {weights['format_weight']:g}{extra}"
    return "the env's own"


def _class_attr(entry_point: str, name: str) -> object:
    module, _, _ = entry_point.partition(":")
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001 - the catalog lists envs it cannot import here too
        return None


def _constructor_defaults(entry_point: str, names: tuple[str, ...]) -> dict[str, object]:
    """The defaults of ``names`` among the env class's constructor parameters (its bases' too)."""
    module, _, name = entry_point.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - as above
        return {}
    found: dict[str, object] = {}
    for klass in getattr(cls, "__mro__", ()):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name in names and p.name not in found and p.default is not inspect.Parameter.empty:
                found[p.name] = p.default
    return found


def catalog_markdown() -> str:
    """docs/catalog.md: the table and each env's description."""
    rows = catalog_rows()
    lines = ["# Environment catalog", "",
             "Generated from the registry by `relax-gym envs catalog --write docs/catalog.md` (a test fails when this",
             "file is stale). An id names its latest version (`nextqa-video` is `nextqa-video-v1`); runs record the",
             "exact id. Versioning rule: any change to an env's observation, action parsing or reward is a new",
             "version; old versions stay constructible while their code exists (`relax_gym.make(\"<id>-v<N>\")`).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    lines += ["", "## What each env is", ""]
    lines += [f"- **`{r.id}`**: {r.description}" for r in rows]
    return "\n".join(lines) + "\n"
