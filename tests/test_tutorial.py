"""docs/writing-an-env.md runs as written.

The tutorial marks its steps in the fences' info strings (GitHub renders them as ordinary code blocks):

- ```` ```python tutorial file=PATH ```` / ```` ```toml tutorial file=PATH ````: save the block as PATH;
- ```` ```python tutorial ````: run it with the project's python, in the tutorial folder;
- ```` ```bash tutorial ````: run it with bash (``-euo pipefail``), the project's ``bin/`` first on PATH;
- ```` ```text tutorial-output ````: every line must appear in what the step just before it printed
  (whitespace-insensitive, so rich's line wrapping does not matter).

Blocks without ``tutorial`` are illustrations and are not run. All steps run in order in one empty folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TUTORIAL = REPO / "docs" / "writing-an-env.md"
EXAMPLE_MODULE = REPO / "examples" / "relax-gym-example-env" / "src" / "relax_gym_example_env" / "lamp_panel.py"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    lang: str
    tags: frozenset[str]
    file: str | None
    body: str
    line: int  # 1-based line of the opening fence in the markdown

    @property
    def where(self) -> str:
        return f"{TUTORIAL.name}:{self.line} ({self.lang} block)"


def parse_blocks(text: str) -> list[Block]:
    blocks = []
    for m in FENCE.finditer(text):
        words = m.group(1).split()
        if not words:
            continue
        attrs = dict(w.split("=", 1) for w in words[1:] if "=" in w)
        tags = frozenset(w for w in words[1:] if "=" not in w)
        blocks.append(Block(words[0], tags, attrs.get("file"), m.group(2), text.count("\n", 0, m.start()) + 1))
    return blocks


def tutorial_steps() -> list[Block]:
    return [b for b in parse_blocks(TUTORIAL.read_text(encoding="utf-8")) if b.tags & {"tutorial", "tutorial-output"}]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RELAX_GYM_ENV_PATH")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["COLUMNS"] = "200"
    return env


def _run(block: Block, index: int, folder: Path) -> str:
    if block.lang == "python":
        script = folder / f"_step{index}.py"
        script.write_text(block.body)
        cmd = [sys.executable, str(script)]
    elif block.lang == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", block.body]
    else:
        raise AssertionError(f"{block.where}: a runnable tutorial block must be python or bash")
    proc = subprocess.run(cmd, cwd=folder, env=_env(), capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{block.where} failed with exit code {proc.returncode}:\n{output[-4000:]}"
    return output


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_tutorial_blocks_are_well_formed():
    steps = tutorial_steps()
    kinds = {("file" if b.file else "output" if "tutorial-output" in b.tags else "run", b.lang) for b in steps}
    assert {("file", "python"), ("file", "toml"), ("run", "python"), ("run", "bash"), ("output", "text")} <= kinds, kinds
    assert steps[0].file, "the first step must save the environment's module"
    for prev, block in zip([None, *steps], steps):
        if "tutorial-output" in block.tags:
            assert prev is not None and not prev.file and "tutorial-output" not in prev.tags, \
                f"{block.where}: an output block must follow a step that runs"


def test_tutorial_module_is_the_example_package_module():
    """The tutorial's lamp_panel.py and the example package's copy must not drift apart."""
    (module,) = [b for b in tutorial_steps() if b.file == "lamp_panel.py"]
    assert module.body == EXAMPLE_MODULE.read_text(encoding="utf-8"), (
        f"the lamp_panel.py block in {TUTORIAL.name} differs from {EXAMPLE_MODULE.relative_to(REPO)}; update both")


@pytest.mark.slow(reason="runs every command of the tutorial in order, training included")
@pytest.mark.timeout(900)
def test_tutorial_runs_in_order(tmp_path):
    last_output: str | None = None
    ran = 0
    for index, block in enumerate(tutorial_steps()):
        if block.file:
            target = tmp_path / block.file
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body)
            last_output = None
        elif "tutorial-output" in block.tags:
            assert last_output is not None, f"{block.where}: no step output to compare with"
            for line in filter(None, map(str.strip, block.body.splitlines())):
                assert _squash(line) in _squash(last_output), (
                    f"{block.where}: expected {line!r} in the output of the step before it, which printed:\n"
                    f"{last_output[-4000:]}")
        else:
            last_output = _run(block, index, tmp_path)
            ran += 1
    assert ran >= 5


def test_parser_reads_info_strings_and_catches_a_missing_line():
    text = "x\n```python tutorial file=a/b.py\nprint(1)\n```\n```bash\nls\n```\n```text tutorial-output\nnope\n```\n"
    blocks = parse_blocks(text)
    assert [(b.lang, b.file, sorted(b.tags), b.line) for b in blocks] == [
        ("python", "a/b.py", ["tutorial"], 2), ("bash", None, [], 5), ("text", None, ["tutorial-output"], 8)]
    assert _squash("nope") not in _squash("a different\noutput")
