"""One cache rule for the library, `make train` and the test suite: ``$RELAX_GYM_CACHE``, else
``~/.cache/relax-gym``. The suite does not pick a cache of its own (it used to put samples in ``./.cache`` while
`make train` used ``~/.cache``); CI chooses one by setting the variable in .ci/run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_suite_leaves_the_cache_to_the_callers_environment():
    env = {k: v for k, v in os.environ.items() if k != "RELAX_GYM_CACHE"}
    probe = "import os, tests.conftest; print(os.environ.get('RELAX_GYM_CACHE'))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


def test_ci_sets_the_cache_and_make_does_not_override_it():
    assert 'export RELAX_GYM_CACHE="$PWD/.cache/relax-gym"' in (REPO / ".ci" / "run").read_text()
    assert "RELAX_GYM_CACHE" not in (REPO / "Makefile").read_text()  # make test and make train: the same rule


def test_the_rule_is_written_where_a_new_user_reads():
    for page in ("README.md", "docs/quickstart.md"):
        text = " ".join((REPO / page).read_text(encoding="utf-8").split())
        assert "`make test` and `make train` share one cache" in text, page
