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

from .errors import LimitExceeded, MalformedMetadata

INDEX_FILE = "data.txt"


# A remote data.txt is capped at this many bytes unless the board says otherwise (`max_index_bytes=`):
# 16 MiB holds an index of ~40,000 pins (libyaml: ~3 s per MB on a busy 2-core machine, once per change).
MAX_INDEX_BYTES = 16 << 20
# YAML aliases may repeat a node; the document may grow by at most this many nodes through them.
# A 1 KB "billion laughs" document expands to 10**9 nodes; legitimate metadata hardly uses aliases.
ALIAS_BUDGET = 10_000

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster on big indexes


class _UntrustedLoader(_Base):
    """PyYAML's safe loader, except that unknown tags (R's `!expr`, ...) load as inert strings, and
    aliases may not expand the document past `ALIAS_BUDGET` extra nodes.

    A board index comes from whoever serves it; a tag must never run anything, an alias bomb must not
    exhaust memory, but one odd entry should not make the whole board unreadable either.
    """

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose tree expansion (what construction builds) exceeds the budget.

    Aliases make the composed graph share nodes; the expanded size is counted per distinct node,
    memoised, so the check itself is linear in the document. Recursive aliases are refused.
    """
    expanded: dict[int, int] = {}
    distinct = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            expanded[key] = 1 + sum(expanded[id(c)] for c in children)
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise yaml.constructor.ConstructorError(None, None, "a recursive alias", node.start_mark)
        distinct += 1
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise yaml.constructor.ConstructorError(None, None, "a recursive alias", child.start_mark)
            if id(child) not in expanded:
                stack.append((child, False))
    total = expanded.get(id(root), 0)
    if total > distinct + ALIAS_BUDGET:
        raise _AliasBomb(total, distinct)


class _AliasBomb(yaml.YAMLError):
    def __init__(self, total: int, distinct: int):
        super().__init__(f"YAML aliases expand {distinct} nodes to {total} (more than {ALIAS_BUDGET} extra); "
                         "refused as an alias bomb")


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def _inert(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node)
    return loader.construct_mapping(node)


_UntrustedLoader.add_multi_constructor("!", _inert)
_UntrustedLoader.add_multi_constructor("tag:", _inert)


def load_yaml(text: str | bytes, *, source: str, max_bytes: int | None = None) -> Any:
    """Load YAML that may come from anyone: no object construction, no tag evaluation, bounded
    alias expansion, and at most `max_bytes` bytes (None: no cap; callers pass the board's cap)."""
    if max_bytes is not None and len(text) > max_bytes:
        raise LimitExceeded(f"{source}: {len(text)} bytes, more than the {max_bytes}-byte cap on metadata "
                            "(max_index_bytes=)")
    try:
        return yaml.load(text, Loader=_UntrustedLoader)  # noqa: S506 - a SafeLoader subclass
    except _AliasBomb as e:
        raise LimitExceeded(f"{source}: {e}") from e
    except yaml.YAMLError as e:
        raise MalformedMetadata(f"{source}: not valid YAML ({e})") from e
    except RecursionError as e:
        raise LimitExceeded(f"{source}: YAML nested too deeply") from e


def parse_index(text: str | bytes, *, source: str = INDEX_FILE, max_bytes: int | None = None) -> list[dict]:
    """Entries of a board index with R's defaults filled in (name = basename(path), type = files)."""
    raw = load_yaml(text, source=source, max_bytes=max_bytes)
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


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated objects out in full: readers (ours included) may refuse aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    # PyYAML folds NEL (U+0085) inside single-quoted scalars, and libyaml reads it back as a line break:
    # such strings go double-quoted, where NEL is escaped, so the index round-trips exactly.
    if "\x85" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return dumper.represent_str(data)


_NoAliasDumper.add_representer(str, _represent_str)


def dump_index(entries: list[dict]) -> str:
    return yaml.dump(sorted(entries, key=lambda e: e["name"]), Dumper=_NoAliasDumper, sort_keys=False,
                     allow_unicode=True)


def merge_entry(entries: list[dict], entry: dict | None, *, name: str) -> list[dict]:
    """`entries` with the one for `name` replaced by `entry` (or removed when `entry` is None)."""
    kept = [e for e in entries if e.get("name") != name]
    return kept + ([entry] if entry is not None else [])
