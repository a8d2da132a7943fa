"""The board-level `data.txt` index, in R legacy pins' format.

Every writable board keeps this YAML list at its root so that the folder or bucket, served by any
static web server, is readable as a `datatxt` board with no credentials. Entries have `path`
(relative to the board URL, or an absolute URL), `name`, `description`, `type` and any other
metadata; pinstorm adds `version`, `versions` and `title`. Missing fields get R's defaults.
"""

from __future__ import annotations

import json
import posixpath
import re
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
# An integer longer than this (sign and '_' aside) loads as its text, like an unknown tag: Python
# refuses to convert more than 4,300 digits (a bare ValueError naming no board), and converts more in
# quadratic time where that limit is lifted. 100 digits keep every integer real metadata holds (sizes
# and counts are then checked where they are used: `meta._count`).
MAX_INT_DIGITS = 100

_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster on big indexes


class _UntrustedLoader(_Base):
    """PyYAML's safe loader, except that unknown tags (R's `!expr`, ...) load as inert strings, and
    aliases may not expand the document past `ALIAS_BUDGET` extra nodes.

    A board index comes from whoever serves it; a tag must never run anything, an alias bomb must not
    exhaust memory, but one odd entry should not make the whole board unreadable either.
    """

    anchored = True   # whether the text may define an anchor (`load_yaml` knows): without one, no alias

    def get_single_node(self):
        node = super().get_single_node()
        if node is not None and self.anchored:
            _check_expansion(node)
        return node


def _bounded_int(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    text = loader.construct_scalar(node)
    if _long_int(text):
        return text
    return loader.construct_yaml_int(node)


def _long_int(text: str) -> bool:
    return len(text.lstrip("+-").replace("_", "")) > MAX_INT_DIGITS


def _lenient_timestamp(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    """A YAML timestamp, or its text when it names no real time (`2024-13-45`: a bare ValueError
    in PyYAML)."""
    try:
        return loader.construct_yaml_timestamp(node)
    except (ValueError, OverflowError):
        return loader.construct_scalar(node)


_UntrustedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)
_UntrustedLoader.add_constructor("tag:yaml.org,2002:timestamp", _lenient_timestamp)


# A lone surrogate (U+D800-DFFF alone) is no text: UTF-8 cannot encode it, so printing it or putting it
# in a DataFrame raises UnicodeEncodeError. Decoded UTF-8 never holds one; JSON (and pure-Python YAML)
# makes one from a `\ud800` escape, so only JSON text with such an escape needs the walk below.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\(?:u|U0000)[dD][89a-fA-F]")


def may_hold_surrogates(text: str | bytes) -> bool:
    """Whether loading `text` (YAML or JSON) can give a string with a lone surrogate."""
    if isinstance(text, bytes):
        return _SURROGATE_ESCAPE.search(text.decode("latin-1")) is not None
    return _SURROGATE_ESCAPE.search(text) is not None or _SURROGATE.search(text) is not None


def refuse_surrogates(value: Any, *, source: str) -> None:
    """MalformedMetadata naming `source` when any string in `value` (keys included) holds a lone
    surrogate: a name that cannot be printed or stored is refused where it is read."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                raise MalformedMetadata(f"{source}: {item[:40]!r} holds a lone surrogate "
                                        f"(\\u{ord(found.group()):04x}), which is not text")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):  # YAML's !!omap and !!set too
            stack.extend(item)


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
        loader = _UntrustedLoader(text)
        # an alias needs an anchor, and an anchor an `&`: a data.txt without one skips the expansion walk
        # (a third of reading a cached pin's data.txt)
        loader.anchored = ("&" if isinstance(text, str) else b"&") in text
        try:
            loaded = loader.get_single_data()
        finally:
            loader.dispose()
    except _AliasBomb as e:
        raise LimitExceeded(f"{source}: {e}") from e
    except yaml.YAMLError as e:
        raise MalformedMetadata(f"{source}: not valid YAML ({e})") from e
    except RecursionError as e:
        raise LimitExceeded(f"{source}: YAML nested too deeply") from e
    except (ValueError, TypeError, OverflowError) as e:  # a constructor's own error: name the document
        raise MalformedMetadata(f"{source}: not valid YAML metadata ({type(e).__name__}: {e})") from e
    refuse_surrogates(loaded, source=source)  # linear, and small beside the YAML parse itself
    return loaded


def parse_index(text: str | bytes, *, source: str = INDEX_FILE, max_bytes: int | None = None) -> list[dict]:
    """Entries of a board index with R's defaults filled in (name = basename(path), type = files)."""
    if max_bytes is not None and len(text) > max_bytes:
        load_yaml(text, source=source, max_bytes=max_bytes)  # raises LimitExceeded, naming the cap
    raw = _parse_flow_lines(text)
    if raw is None:
        raw = load_yaml(text, source=source, max_bytes=max_bytes)
    elif may_hold_surrogates(text):
        refuse_surrogates(raw, source=source)
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


# libyaml's emitter when present (~4x faster than PyYAML's on a 1,000-entry index); the representer stays
# PyYAML's, so the aliases and NEL rules below hold either way.
_DumperBase = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _NoAliasDumper(_DumperBase):
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


def dump_yaml(data: Any, *, sort_keys: bool = False) -> str:
    """Block-style YAML (what R's yaml::write_yaml writes too), no aliases, unicode as is: the one way
    pinstorm writes YAML metadata."""
    return yaml.dump(data, Dumper=_NoAliasDumper, sort_keys=sort_keys, default_flow_style=False,
                     allow_unicode=True)


# ---- the fast path: one JSON flow mapping per entry ---------------------------------------------------
# A 21,841-entry index (ImageNet-21k) is ~6 MB of YAML: PyYAML's safe constructor takes ~12 s to load it and
# its emitter ~2 s to dump it, even over libyaml, once per write. So pinstorm writes each entry as one line
# `- {"path": "...", ...}`: a YAML block sequence of flow mappings whose scalars are JSON strings, which
# every YAML reader (R's yaml, libyaml, PyYAML) loads as the same list, and which pinstorm reads back with
# `json` line by line (~0.2 s at 21,841). Anything else (another tool's index, a value JSON and YAML 1.1
# would read differently, such as a float) goes through the bounded YAML loader as before.

# Characters JSON leaves raw that YAML forbids or reads as line breaks inside a quoted scalar.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")
_FLOW_LINE = "- {"


def _json_plain(value: Any, depth: int = 0) -> bool:
    """Whether `value` is made of what JSON and YAML 1.1 read alike: str, int, bool, None, lists, maps."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if depth > 8:
        return False
    if kind is list:
        return all(type(v) is str or _json_plain(v, depth + 1) for v in value)
    if kind is dict:
        return all(type(k) is str and (type(v) is str or _json_plain(v, depth + 1)) for k, v in value.items())
    return False


def _entry_line(entry: dict) -> str:
    text = json.dumps(entry, ensure_ascii=False, separators=(", ", ": "))
    return _FLOW_LINE + _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text[1:]) + "\n"


def _parse_flow_lines(text: str | bytes) -> list | None:
    """The entries of an index written one JSON flow mapping per line, or None when it is not one."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            return None
    lines = text.splitlines()
    if not lines or not all(line.startswith(_FLOW_LINE) and line.endswith("}") for line in lines):
        return None
    out = []
    try:
        for line in lines:
            item = json.loads(line[2:], parse_int=_json_int)
            if not isinstance(item, dict):
                return None
            out.append(item)
    except (ValueError, RecursionError):
        return None  # the YAML loader decides, and names what is wrong
    return out


def _json_int(text: str) -> int | str:
    """A JSON integer as the YAML loader reads it: its text when longer than `MAX_INT_DIGITS`."""
    return text if _long_int(text) else int(text)


def dump_index(entries: list[dict]) -> str:
    """The index text of `entries`, sorted by name: one JSON flow line per plain entry, block YAML else."""
    if not entries:
        return "[]\n"
    return "".join(_entry_line(e) if _json_plain(e) else dump_yaml([e])
                   for e in sorted(entries, key=lambda e: e["name"]))


