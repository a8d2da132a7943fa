"""The board-level `data.txt` index, in R legacy pins' format.

Every writable board keeps this YAML list at its root so that the folder or bucket, served by any
static web server, is readable as a `datatxt` board with no credentials. Entries have `path`
(relative to the board URL, or an absolute URL), `name`, `description`, `type` and any other
metadata; pinstorm adds `version`, `versions` and `title`. Missing fields get R's defaults.
"""

from __future__ import annotations

import posixpath
from typing import Any

import yaml

from .errors import MalformedMetadata

INDEX_FILE = "data.txt"


class _UntrustedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that unknown tags (R's `!expr`, ...) load as inert strings.

    A board index comes from whoever serves it; a tag must never run anything, but one odd entry
    should not make the whole board unreadable either.
    """


def _inert(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)


_UntrustedLoader.add_multi_constructor("!", _inert)
_UntrustedLoader.add_multi_constructor("tag:", _inert)


def load_yaml(text: str | bytes, *, source: str) -> Any:
    """Load YAML that may come from anyone: no object construction, no tag evaluation."""
    try:
        return yaml.load(text, Loader=_UntrustedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise MalformedMetadata(f"{source}: not valid YAML ({e})") from e


def parse_index(text: str | bytes, *, source: str = INDEX_FILE) -> list[dict]:
    """Entries of a board index with R's defaults filled in (name = basename(path), type = files)."""
    raw = load_yaml(text, source=source)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise MalformedMetadata(f"{source}: a board index must be a YAML list of entries, got {type(raw).__name__}")
    entries = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not item.get("path"):
            raise MalformedMetadata(f"{source}: entry {i + 1} has no 'path'")
        entry = dict(item)
        entry["path"] = str(entry["path"])
        entry.setdefault("name", posixpath.basename(entry["path"].rstrip("/")))
        entry["name"] = str(entry["name"])
        entry.setdefault("type", "files")
        if entry.get("description") is None:
            entry["description"] = ""
        entries.append(entry)
    return entries


def dump_index(entries: list[dict]) -> str:
    return yaml.safe_dump(sorted(entries, key=lambda e: e["name"]), sort_keys=False, allow_unicode=True)


def merge_entry(entries: list[dict], entry: dict | None, *, name: str) -> list[dict]:
    """`entries` with the one for `name` replaced by `entry` (or removed when `entry` is None)."""
    kept = [e for e in entries if e.get("name") != name]
    return kept + ([entry] if entry is not None else [])
