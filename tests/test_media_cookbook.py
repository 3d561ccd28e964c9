"""docs/media-cookbook.md's code runs as written: every ``python`` block, in order, in one namespace, in a
temporary folder (the blocks write their own media)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "media-cookbook.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_every_block_of_the_cookbook_runs(tmp_path, monkeypatch):
    blocks = BLOCK.findall(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 4, "the cookbook lost its code blocks"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "cookbook"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"{DOC.name} block {i}", "exec"), namespace)  # noqa: S102 - our own documentation
    assert (tmp_path / "bar.mp4").is_file()
