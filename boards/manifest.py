"""`_pins.yaml`, the board manifest of pins 1.x: how `board_url()` finds the pins behind a URL.

R pins 1.x's `write_board_manifest()` writes it at the board root: a YAML mapping from each pin name
to the relative paths of its version folders, oldest first, each ending in `/`:

    iris:
    - iris/20221215T180351Z-c3943/
    - iris/20221216T090002Z-8a1b2/

A static web server or public bucket has no listing, so this file is the only way an HTTP client
learns the versions. pinstorm writes it byte-for-byte as R does (yaml::write_yaml and PyYAML's block
style agree for these shapes) on every pin and remove; pins-python (0.9) reserves the name but
writes no manifest, and reads one only when the caller passes its mapping to `board_url()`.

Read from a server, the manifest is untrusted: safe YAML with an alias budget and a size cap, and
every path must be a relative folder inside the board (see `paths.check_relative`).
"""

from __future__ import annotations

import posixpath
import re

import yaml


from .errors import MalformedMetadata
from .index import dump_yaml, load_yaml
from .safety.paths import check_relative, check_segment

MANIFEST_FILE = "_pins.yaml"
MAX_MANIFEST_BYTES = 16 << 20


def make_manifest(stored: dict[str, list[str]]) -> dict[str, list[str]]:
    """The manifest of pins `stored` (pin -> versions, oldest first), in R's shape."""
    return {pin: [f"{pin}/{v}/" for v in versions] for pin, versions in sorted(stored.items()) if versions}


# Pin names and version paths that YAML writes plain (unquoted): the manifest lines are then formatted
# directly, ~50x faster than the emitter at 21,841 pins; anything else goes through `dump_yaml`.
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*/?")
_STR_TAG = "tag:yaml.org,2002:str"


def _plain(text: str) -> bool:
    return _PLAIN.fullmatch(text) is not None and \
        _Resolver.resolve(yaml.ScalarNode, text, (True, False)) == _STR_TAG


_Resolver = yaml.resolver.Resolver()


def dump_manifest(manifest: dict[str, list[str]]) -> str:
    """YAML text as R's `yaml::write_yaml()` writes the manifest."""
    if not manifest:
        return "{}\n"
    out = []
    for pin, paths in manifest.items():
        if paths and len(pin) < 100 and _plain(pin) and all(_plain(p) for p in paths):  # longer: a '? ' key
            out.append(f"{pin}:\n" + "".join(f"- {p}\n" for p in paths))
        else:
            out.append(dump_yaml({pin: paths}))
    return "".join(out)


def parse_manifest(text: str | bytes, *, source: str = MANIFEST_FILE,
                   max_bytes: int = MAX_MANIFEST_BYTES) -> dict[str, list[str]]:
    """pin -> relative version folder paths (each ending in `/`), checked; MalformedMetadata or
    UnsafePath (naming `source`) for anything else."""
    raw = load_yaml(text, source=source, max_bytes=max_bytes)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedMetadata(f"{source}: a board manifest must map pin names to version paths, "
                                f"got {type(raw).__name__}")
    out: dict[str, list[str]] = {}
    for name, paths in raw.items():
        if not isinstance(name, str) or not name:
            raise MalformedMetadata(f"{source}: pin name {name!r} is not a string")
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
            raise MalformedMetadata(f"{source}: pin {name!r} must list its version paths as strings")
        checked = []
        for p in paths:
            folder = check_relative(p.rstrip("/"), what="version path", pin=name, board=source)
            check_segment(posixpath.basename(folder), what="version", pin=name, board=source)
            checked.append(folder + "/")
        out[name] = checked
    return out


def sync_manifest(storage, stored: dict[str, list[str]]) -> bool:
    """Make `_pins.yaml` on `FsStorage` `storage` list exactly `stored`; True when it was rewritten."""
    return storage.sync_text(MANIFEST_FILE, dump_manifest(make_manifest(stored)))


def write_board_manifest(board) -> dict[str, list[str]]:
    """Write `_pins.yaml` for a writable folder / S3 / GCS board now, as R's `write_board_manifest()`;
    pinstorm also does it on every pin and remove. Returns the manifest written."""
    from .errors import ReadOnlyBoard

    storage = getattr(board, "storage", board)
    if not hasattr(storage, "stored_versions"):
        raise ReadOnlyBoard(f"board {board.name!r} ({board.kind}) cannot hold a manifest (read-only)")
    stored = storage.stored_versions()
    sync_manifest(storage, stored)
    return make_manifest(stored)
