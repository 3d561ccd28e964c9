"""The README: its Python example runs as written; its shell commands work for a new user (the venv is activated
before the first bare `relax-gym` / `python` line, as docs/quickstart.md does); its figures are the current figures
of docs/benchmarks.md, quoted exactly, and those come from the dated runs below them."""

from __future__ import annotations

import re
from pathlib import Path

from .registry_state import restored_registry

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"
ACTIVATE = "source .venv/bin/activate"
# a reward (0.942, +0.653) or a measured time (292 s, 4.2 s; not the "1 s of audio" of an env's description)
FIGURE = re.compile(r"(?<![\d.])[+]?0\.\d{2,3}(?!\d)|\b(?:\d{2,}|\d+\.\d+) s\b")


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 12
    with restored_registry():  # the example registers "my-env"; discovery may first run inside it
        exec(compile(blocks[0], str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "(16, 64, 64, 3)" in out and "1.0 {'accuracy': 1.0, 'format': 1.0}" in out


def _words(text: str) -> str:
    return " ".join(text.split())


def current_figures(markdown: str) -> dict[str, str]:
    """The rows of the table under "## Current figures": figure -> value."""
    section = markdown.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| figure |")]
    return {cells[0]: cells[1] for cells in ([c.strip() for c in row.strip("|").split("|")] for row in rows)}


def test_benchmarks_md_opens_with_one_table_of_current_figures():
    text = BENCHMARKS.read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings[0] == "Current figures"
    section = text.split("## Current figures", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"^\|(?:---\|)+$", section, re.MULTILINE)) == 1  # one table
    assert len(current_figures(text)) >= 6


def test_the_readme_quotes_the_current_figures_exactly():
    figures = current_figures(BENCHMARKS.read_text(encoding="utf-8"))
    prose = _words(re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.DOTALL))
    missing = [f"{name}: {value}" for name, value in figures.items() if _words(value) not in prose]
    assert not missing, "README.md does not quote these current figures of docs/benchmarks.md: " + "; ".join(missing)
    quoted = set(FIGURE.findall(" ".join(figures.values())))
    strays = sorted(set(FIGURE.findall(prose)) - quoted)
    assert not strays, f"README.md gives figures that docs/benchmarks.md's current figures do not: {strays}"


def test_the_current_figures_come_from_the_dated_runs_below_them():
    text = BENCHMARKS.read_text(encoding="utf-8")
    log = text.split("## Current figures", 1)[1].split("\n## ", 1)[1]
    for name, value in current_figures(text).items():
        unlogged = [f for f in FIGURE.findall(value) if f.lstrip("+") not in log]
        assert not unlogged, f"{name}: {unlogged} appear in no dated run of docs/benchmarks.md"


def test_a_new_user_activates_the_venv_before_the_first_bare_command():
    text = README.read_text(encoding="utf-8")
    bare = re.compile(r"^(?:relax-gym|python) |`(?:relax-gym|python) ", re.MULTILINE)
    first = bare.search(text)
    assert ACTIVATE in text and first is not None and text.index(ACTIVATE) < first.start(), (
        f"README.md must say `{ACTIVATE}` before its first bare relax-gym / python command")
    assert ACTIVATE in (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")  # the same advice both places
    import sys

    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "relax-gym").exists() and (bin_dir / "python").exists()  # what activating puts on PATH
