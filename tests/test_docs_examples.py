"""The examples of the user guide run as written: each section's fenced Python blocks, in order, in
one namespace, in a fresh folder with its own board, cache and config (the autouse fixture).

A changed API then breaks a test, not a reader. Sections are listed by their heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"

SECTIONS = [
    ("boards.md", "ImageNet-sized boards"),
    ("boards.md", "Large files"),
    ("boards.md", "Verified bytes, a lossless index, no garbage"),
    ("boards.md", "pins-python's API"),
]


def python_blocks(doc: str, heading: str) -> list[str]:
    """The ```python blocks under `## heading` (up to the next heading of the same level)."""
    text = (DOCS / doc).read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, f"{doc} has no section {heading!r}"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), flags=re.M | re.S)


@pytest.mark.parametrize("doc,heading", SECTIONS, ids=[h for _, h in SECTIONS])
def test_the_examples_of_a_section_run_as_written(doc, heading, tmp_path, monkeypatch):
    blocks = python_blocks(doc, heading)
    assert blocks, f"{doc} § {heading} has no Python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{doc} § {heading} (example {i + 1})", "exec"), namespace)  # noqa: S102
