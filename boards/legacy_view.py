"""The view of a pins 1.x version that R pins 0.4.5 (legacy `board_register_datatxt`) can read.

R legacy reads `<board>/<entry path>/data.txt`, takes its `path:` list as the files (relative to the
entry path) and loads the pin by its `type`, which it knows only as `files`, `table` (a data frame
read from a local `data.csv` or `data.rds`) and `default` (an R object in `data.rds`). A pins 1.x
version's own data.txt cannot serve both clients: pins-python and R 1.x need `type: file` / `csv`
there. So every version gets a small second manifest in a subfolder, `<pin>/<version>/r-legacy/`,
and the root index entry points there. pins 1.x clients never see it (they read only the files their
data.txt lists); R legacy sees a legacy pin:

    path: [../iris.csv#/data.csv]
    type: table

Two properties of R legacy's download (httr/libcurl) make this work on any static server or bucket:
dot segments are removed before the request (`r-legacy/../iris.csv` fetches `<version>/iris.csv`),
and a URL fragment is never sent but does name the local file (R saves a download under
`basename(url)`), so a csv table lands as the `data.csv` that `pin_load.table` reads. Other pins
are `files` (R returns their paths, unzipping with `extract = TRUE`).
"""

from __future__ import annotations

import posixpath
from urllib.parse import quote

from .index import dump_yaml
from .meta import PinMeta

LEGACY_DIR = "r-legacy"
# pins 1.x types R legacy can turn into a data frame: a csv file under the local name data.csv.
_TABLE_TYPES = {"csv"}


def entry_path(name: str, version: str) -> str:
    """The root index `path` of a pin: its latest version's legacy view (no trailing slash: R
    would fetch `…//data.txt`)."""
    return f"{name}/{version}/{LEGACY_DIR}"


def pin_folder(entry: dict) -> str:
    """The pin folder (relative or absolute) of a versioned root index entry, whatever form its
    `path` has: `<pin>/<version>/`, `<pin>/<version>/r-legacy`, or `<pin>` (older writers)."""
    parts = str(entry.get("path") or "").rstrip("/").split("/")
    if parts and parts[-1] == LEGACY_DIR:
        parts = parts[:-1]
    version = str(entry.get("version") or "")
    versions = {str(v) for v in entry.get("versions") or []} | ({version} if version else set())
    if parts and (parts[-1] in versions or _looks_like_version(parts[-1])):
        parts = parts[:-1]
    return "/".join(parts)


def _looks_like_version(segment: str) -> bool:
    from .meta import parse_version

    return parse_version(segment) is not None


def legacy_manifest(meta: PinMeta) -> dict:
    """The data.txt R legacy reads for one version (see the module docstring)."""
    files = [quote(f, safe="/") for f in meta.file]  # URLs: a space or '#' in a file name stays data
    if meta.type in _TABLE_TYPES and len(files) == 1:
        paths, kind = [f"../{files[0]}#/data.csv"], "table"
    else:
        paths, kind = [f"../{f}" for f in files], "files"
    out = {"path": paths, "type": kind, "description": meta.description or "",
           "title": meta.title or "", "pins_type": meta.type}
    if meta.created:
        out["created"] = meta.created
    return out


def legacy_yaml(meta: PinMeta) -> str:
    return dump_yaml(legacy_manifest(meta))


def legacy_file(name: str, version: str) -> str:
    """Path of the legacy view's data.txt, relative to the board root."""
    return posixpath.join(name, version, LEGACY_DIR, "data.txt")


def version_view(meta: PinMeta) -> tuple[str, str] | None:
    """(path inside the version folder, text) of a version's legacy view, or None for a pin with a file of
    its own under `r-legacy/`, which the view must never overwrite. Written with the version itself, so
    publishing the index needs no extra read or write per pin."""
    if any(f == LEGACY_DIR or f.startswith(LEGACY_DIR + "/") for f in meta.file):
        return None
    return posixpath.join(LEGACY_DIR, "data.txt"), legacy_yaml(meta)


def publish_entry(storage, entry: dict, *, written: bool = False) -> dict:
    """Write the legacy view of the version a root index `entry` of `FsStorage` `storage` points at
    (unless it is there already) and return the entry pointing at it. `written`: the version was
    stored with its view (`version_view`) by this process, so nothing needs reading. Called only when
    the index is written, never on reads (a reader may lack write access). The entry must carry `name`,
    `version`, `file` and `type`, as FsStorage's entries do; others are returned unchanged, as is a pin
    with a file of its own under `r-legacy/`, which the view must never overwrite."""
    name, version, files = entry.get("name"), entry.get("version"), entry.get("file")
    if not (name and version and files and entry.get("type")):
        return entry
    files = [files] if isinstance(files, str) else [str(f) for f in files]
    if any(f == LEGACY_DIR or f.startswith(LEGACY_DIR + "/") for f in files):
        return entry
    if written:
        return {**entry, "path": entry_path(name, version)}
    meta = PinMeta(file=files, file_size=[], pin_hash="", type=str(entry["type"]), title=entry.get("title"),
                   description=entry.get("description"), created=entry.get("created"))
    storage.sync_text(legacy_file(name, version), legacy_yaml(meta))
    return {**entry, "path": entry_path(name, version)}
