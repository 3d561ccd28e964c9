"""The env catalog (relax_gym/envs/catalog.py): docs/catalog.md is what the registry generates, every built-in
manifest declares its version, and the tools a manifest names are the tools the env gives."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import relax_gym
from relax_gym.cli import app
from relax_gym.envs.catalog import COLUMNS, catalog_markdown, catalog_rows
from relax_gym.envs.registry import builtin_registry_dir

DOC = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"
MANIFESTS = sorted(builtin_registry_dir().glob("*/env.toml"))


def test_docs_catalog_is_what_the_registry_generates():
    assert DOC.read_text() == catalog_markdown(), (
        "docs/catalog.md is stale: run `relax-gym envs catalog --write docs/catalog.md`")


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda p: p.parent.name)
def test_each_builtin_manifest_declares_its_version(manifest):
    assert isinstance(tomllib.loads(manifest.read_text()).get("version"), int), f"{manifest}: no version"


def _program_env(manifest: Path) -> bool:
    return "agent-program" in tomllib.loads(manifest.read_text()).get("tags", [])


@pytest.mark.parametrize("manifest", [m for m in MANIFESTS if not _program_env(m)], ids=lambda p: p.parent.name)
def test_the_tools_a_manifest_names_are_the_envs_own(manifest):
    data = tomllib.loads(manifest.read_text())
    env = relax_gym.make(data["id"])
    try:
        toolbox = getattr(env.unwrapped, "toolbox", None)
        given = sorted(toolbox.tools) if toolbox is not None else []
    finally:
        env.close()
    assert sorted(data.get("tools", [])) == given


def test_envs_list_shows_the_catalog_columns_with_exact_ids():
    rows = {r.id: r for r in catalog_rows()}
    programs = [tomllib.loads(m.read_text())["id"] for m in MANIFESTS if _program_env(m)]
    assert programs and all(rows[f"{p}-v1"].tools.endswith("(the program's own)") for p in programs)
    assert rows["nextqa-video-agent-v1"].tools == "watch, frame" and rows["tool-use-v1"].sandbox == "docker or bwrap"
    assert rows["nextqa-video-v1"].reward == "accuracy 0.9, format 0.1" and rows["nextqa-video-v1"].turns == "single"
    result = CliRunner().invoke(app, ["envs", "list"])
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header == [*COLUMNS, "source"] and "nextqa-video-agent-v1" in result.output
