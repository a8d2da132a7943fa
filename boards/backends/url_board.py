"""The read-only board behind any URL: a `data.txt` index (R legacy, pinstorm) or, failing that, a
pins 1.x `_pins.yaml` manifest (R pins 1.x's `write_board_manifest()`, pinstorm).

R legacy boards written with `versions = TRUE` keep older copies of each pin in `<pin>/_versions/<sha1>/`
and list them (newest first) in the pin's own data.txt; this board lists them too, oldest first and
before `legacy` (the current copy, what `pin_get` returns by default), and fetches them as immutable
versions (a version prefix such as R's 7-character short form selects one).

A board that R 1.x or pins-python wrote and someone published on a static server or bucket has no
data.txt; its manifest lists each pin's version folders, whose `data.txt` are ordinary pins 1.x
metadata. Turned into index entries (`path`, `version`, `versions`), they are read by the same
machinery as pinstorm's own versioned data.txt boards: immutable versions cached once, verified,
served offline. An http(s) URL given to `board_register` becomes this board; it asks for data.txt
first and remembers which of the two the server has.
"""

from __future__ import annotations

import posixpath
import time
from pathlib import Path

from ..cache import Cache
from .datatxt_board import LEGACY, DatatxtStorage, IndexEntries
from ..errors import DownloadError, MalformedMetadata, PinNotFound
from ..index import load_yaml
from ..manifest import MANIFEST_FILE, dump_manifest, parse_manifest
from ..meta import PinMeta, parse_version
from ..safety.paths import check_relative, check_segment

DATATXT, MANIFEST = "datatxt", "manifest"


class UrlStorage(DatatxtStorage):
    """A read-only board behind a URL: data.txt, else `_pins.yaml`, or the pins a user lists."""

    kind = "url"

    def __init__(self, name: str, url: str, *, cache: str | Path | Cache | None = None,
                 headers: dict | None = None, index_max_age: float = 0, index: str = "auto",
                 pins: dict[str, str | list[str]] | None = None, **options):
        """`index`: "auto" (data.txt, else _pins.yaml), "datatxt" or "manifest". `pins`: pin name ->
        its version folder(s) under `url` (pins-python's `board_url(path, pin_paths)`), instead of
        an index read from the server."""
        if index not in ("auto", DATATXT, MANIFEST):
            raise ValueError(f"url board {name!r}: index must be 'auto', 'datatxt' or 'manifest', got {index!r}")
        stripped = url.rstrip("/")
        if stripped.endswith("/" + MANIFEST_FILE):
            url, index = stripped[: -len(MANIFEST_FILE) - 1], MANIFEST
        super().__init__(name, url, cache=cache, headers=headers, index_max_age=index_max_age, **options)
        self._mode = MANIFEST if pins is not None else None if index == "auto" else index
        self._pins = None
        if pins is not None:  # checked like a downloaded manifest: names, relative paths, no '..'
            listed = {str(k): [v] if isinstance(v, str) else list(v) for k, v in dict(pins).items()}
            self._pins = parse_manifest(dump_manifest(listed).encode(), source=f"pins given for board {name!r}",
                                        max_bytes=self.max_index_bytes)

    @property
    def manifest_url(self) -> str:
        return f"{self.url}/{MANIFEST_FILE}"

    def describe(self) -> str:
        return self.manifest_url if self._mode == MANIFEST else self.url

    def list_entries(self) -> list[dict]:
        if self._mode != MANIFEST:
            try:
                entries = super().list_entries()
                self._mode = DATATXT
                return entries
            except DownloadError as e:
                if self._mode == DATATXT:
                    raise
                cached = self.cache.url_path(self.name, self.manifest_url).is_file()
                if e.status != 404 and not cached:  # unreachable, and nothing to fall back on
                    raise
        return self._manifest_entries()

    def _entry(self, name: str, *, revalidate: bool = True) -> dict:
        try:
            return super()._entry(name, revalidate=revalidate)
        except PinNotFound:
            if self._mode == MANIFEST:
                raise PinNotFound(f"no pin named {name!r} in {self.manifest_url}") from None
            raise

    def _manifest_entries(self) -> list[dict]:
        if self._pins is not None:
            return [_entry(name, paths, f"board {self.name!r}") for name, paths in self._pins.items() if paths]
        if self._parsed is not None and self._mode == MANIFEST \
                and time.monotonic() - self._checked_at < self.index_max_age:
            return self._parsed[1]
        local = self._fetch_url(self.manifest_url, self.cache.url_path(self.name, self.manifest_url),
                                max_bytes=self.max_index_bytes)
        stat = local.stat()
        key = [MANIFEST, stat.st_size, stat.st_mtime_ns]
        if self._parsed is None or self._parsed[0] != key:
            manifest = parse_manifest(local.read_bytes(), source=self.manifest_url, max_bytes=self.max_index_bytes)
            self._parsed = (key, IndexEntries(_entry(name, paths, self.manifest_url)
                                              for name, paths in manifest.items() if paths))
        self._mode = MANIFEST
        self._checked_at = time.monotonic()
        return self._parsed[1]

    # ---- R legacy versions (`versions = TRUE` boards) ------------------------------------
    def _legacy_versions(self, entry: dict) -> dict[str, str]:
        """version name (the sha1 folder name) -> its folder relative to the pin, oldest first."""
        path = str(entry["path"])
        if not (path.endswith("/") or "." not in posixpath.basename(path)):
            return {}  # a single-file entry has no pin folder, hence no versions
        url = self._abs(path.rstrip("/") + "/data.txt", pin=entry["name"])
        try:
            local = self._fetch_url(url, self.cache.url_path(self.name, url), max_bytes=self.max_index_bytes)
        except DownloadError as e:
            if e.status == 404:
                return {}
            raise
        raw = load_yaml(local.read_bytes(), source=url, max_bytes=self.max_index_bytes)
        listed = raw.get("versions") if isinstance(raw, dict) else None
        out: dict[str, str] = {}
        for rel in reversed([str(v) for v in (listed or []) if v]):  # R lists them newest first
            rel = check_relative(rel.rstrip("/"), what="version path", pin=entry["name"], board=url)
            out[check_segment(posixpath.basename(rel), pin=entry["name"], board=url)] = rel
        return out

    def _legacy_version_url(self, name: str, version: str) -> str:
        entry = self._entry(name, revalidate=False)
        rel = self._legacy_versions(entry).get(version)
        if rel is None:
            raise PinNotFound(f"legacy pin {name!r} on board {self.name!r} has no version {version!r}")
        return self._abs(f"{str(entry['path']).rstrip('/')}/{rel}/", pin=name)

    def _is_legacy_version(self, name: str, version: str) -> bool:
        if version == LEGACY:
            return False
        entry = self._entry(name, revalidate=False)
        return not self._is_versioned(entry)

    def versions_held(self, name: str) -> list[str] | None:
        """A versioned pin's versions from the data.txt `hold_index` holds (the first call may read it); None
        for a manifest or an R legacy pin, whose versions may take requests to list, or when not held.

        Args:
            name: The pin's name.
        """
        if self._mode == MANIFEST or self._held_since == float("inf"):
            return None
        try:
            entry = self._entry(name)   # decides the mode on a first read
        except PinNotFound:
            return None
        if self._mode != DATATXT or not self._is_versioned(entry):
            return None
        return super().versions_held(name)

    def list_versions(self, name: str) -> list[str]:
        entry = self._entry(name, revalidate=getattr(self._within, "fetch", None) != name)
        if self._is_versioned(entry):
            return super().list_versions(name)  # reuses the index the same way, and clears the mark
        self._within.fetch = None
        return [*self._legacy_versions(entry), LEGACY]

    def read_meta(self, name: str, version: str) -> PinMeta:
        if not self._is_legacy_version(name, version):
            return super().read_meta(name, version)
        url = self._legacy_version_url(name, version) + "data.txt"
        raw = load_yaml(self._get(url), source=url, max_bytes=self.max_index_bytes)
        if not isinstance(raw, dict):
            raise MalformedMetadata(f"{url}: expected a mapping of fields")
        raw.setdefault("type", self._entry(name, revalidate=False).get("type", "files"))
        meta = PinMeta.from_dict(raw, source=url)
        self._check_files(meta, name, url)
        meta.name, meta.version = name, version
        self._declare(name, version, meta)
        return meta

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        if not self._is_legacy_version(name, version):
            return super().download_file(name, version, file, dest, offset=offset)
        url = self._legacy_version_url(name, version) + check_relative(file, pin=name, board=self.url)
        self._download(url, dest, size=self._declared_size(name, version, file),  # the board's one HTTP client
                       what=f"pin {name!r} version {version} file {file!r} of board {self.name!r}", offset=offset)

    def file_url(self, name: str, version: str, file: str) -> str:
        """As DatatxtStorage's; an R legacy version's files sit in the pin's `_versions/<sha1>/` folder."""
        if not self._is_legacy_version(name, version):
            return super().file_url(name, version, file)
        return self._legacy_version_url(name, version) + check_relative(file, pin=name, board=self.url)

    def direct_fetch(self, name: str, version: str | None, *, download: bool) -> tuple[PinMeta, Path] | None:
        """The current copy of an R legacy pin comes directly (see DatatxtStorage); a version of one
        is immutable (named by its content), so it is cached like pins 1.x versions."""
        if version in (None, LEGACY) or (download and self._is_versioned(self._entry(name))):
            return super().direct_fetch(name, version, download=download)
        return None


def _entry(name: str, paths: list[str], source: str) -> dict:
    """An index entry for a manifest pin: its versions are the version folders under one pin folder."""
    folders = [p.rstrip("/") for p in paths]
    base = posixpath.dirname(folders[-1])
    versions = [posixpath.basename(f) for f in folders if posixpath.dirname(f) == base]
    if len(versions) != len(folders):
        raise MalformedMetadata(f"{source}: pin {name!r} lists version folders under different parents "
                                f"({', '.join(sorted({posixpath.dirname(f) for f in folders}))})")
    versions.sort(key=lambda v: (parse_version(v) is None, v))
    return {"path": f"{base}/{versions[-1]}/" if base else f"{versions[-1]}/", "name": name,
            "version": versions[-1], "versions": versions, "description": "", "type": "",
            "index": MANIFEST}


def datatxt_storage(name: str, url: str, **options) -> UrlStorage:
    """The `datatxt` kind, as R's `board_register_datatxt`: a URL board that reads only data.txt.

    It is a `UrlStorage` so that R legacy boards written with `versions = TRUE` list their versions
    here too, as they do when the same URL is registered plainly.
    """
    storage = UrlStorage(name, url, index=DATATXT, **options)
    storage.kind = "datatxt"
    return storage
