"""The documentation's links hold: every relative link in README.md and docs/*.md names a file or folder that
exists, and a ``#fragment`` into a markdown file names one of its headings (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lowercase, punctuation dropped except '-' and '_', spaces to '-'."""
    found = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", markdown), re.MULTILINE):
        found.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return found


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))
            if not re.match(r"^[a-z]+:", t)]  # http:, https:, mailto:


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {Path(t.partition("#")[0]).name for t in links(REPO / "README.md")}
    missing = [p.name for p in PAGES[1:] if p.name not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"


def test_anchor_rules():
    assert anchors("## Trainer modes (`benchmarks/modes.py`)\n## pip downloads a CUDA torch\n") == {
        "trainer-modes-benchmarksmodespy", "pip-downloads-a-cuda-torch"}
