"""The README's Python example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

from .registry_state import restored_registry

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 12
    with restored_registry():  # the example registers "my-env"; discovery may first run inside it
        exec(compile(blocks[0], str(README), "exec"), {})
    out = capsys.readouterr().out
    assert "(16, 64, 64, 3)" in out and "1.0 {'accuracy': 1.0, 'format': 1.0}" in out
