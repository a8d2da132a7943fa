"""`Board`: the user-facing pin operations, written once over a few storage primitives.

A concrete board (a folder or bucket, an HTTP data.txt site, Kaggle) implements the primitives
(`list_entries`, `list_versions`, `read_meta`, `download_file`, and for writable boards
`write_version` and `delete`); everything users call (`pin`, `pin_get`, `pin_find`, `pin_info`,
`pin_versions`, `pin_remove`) lives here so every board behaves alike: same versions, same cache,
same errors, same offline fallback.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import time
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from . import archive
from .cache import Cache, StaleCacheWarning, verify
from .errors import (BoardError, DownloadError, IntegrityError, InvalidPinName, PinNotFound, ReadOnlyBoard,
                     VersionNotFound)
from .meta import PinMeta, parse_version, utc_now
from .names import check_pin_name
from pinstorm.progress import progress_bar

FIND_COLUMNS = ["name", "description", "type", "board"]
EXTRACTED = "_extracted"
# Field in data.txt marking a pin that pinstorm zipped for transport: pin_get unzips it by default.
ZIPPED_FIELD = "pinstorm_zipped"


class Board:
    """Base class of every board. Subclasses set `kind` and implement the primitives below."""

    kind = "board"
    read_only = False

    def __init__(self, name: str, *, cache: str | Path | Cache | None = None, versions: bool = True):
        self.name = name
        self.cache = cache if isinstance(cache, Cache) else Cache(cache)
        self.versions = versions

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def describe(self) -> str:
        """One line for `board_list`: where the board lives."""
        return self.kind

    # ---- primitives -----------------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        """Index entries: dicts with at least name, description, type (and title when known)."""
        raise NotImplementedError

    def list_versions(self, name: str) -> list[str]:
        """Version names of a pin, oldest first; PinNotFound if there is no such pin."""
        raise NotImplementedError

    def read_meta(self, name: str, version: str) -> PinMeta:
        raise NotImplementedError

    def local_folder(self, name: str, version: str) -> Path | None:
        """A local folder already holding the version's files (local boards), else None."""
        return None

    def download_file(self, name: str, version: str, file: str, dest: Path) -> None:
        raise NotImplementedError

    def write_version(self, name: str, staging: Path, meta: PinMeta) -> str:
        raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only")

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only")

    def default_extract(self, meta: PinMeta) -> bool:
        """What `extract=None` means: unzip what pinstorm zipped itself, leave other archives be."""
        return bool(meta.extra.get(ZIPPED_FIELD))

    def check_name(self, name: str) -> str:
        return check_pin_name(name)

    # ---- writing --------------------------------------------------------------------------
    def pin(self, x: Any, name: str | None = None, description: str | None = None, zip: bool = False,
            metadata: dict | None = None, type: str | None = None, title: str | None = None) -> Any:
        """Store `x` as a new version of pin `name` and return what `pin_get` would.

        `x`: a pandas DataFrame (Parquet, or CSV with type="csv"), a file or folder path, a list of
        paths, an http(s) URL (downloaded through the cache), or a JSON-able object. Pinning content
        identical to the latest version stores nothing new.
        """
        if self.read_only:
            raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only; cannot pin {name!r}")
        name = self.check_name(name if name is not None else _default_name(x))
        with tempfile.TemporaryDirectory(prefix="pinstorm-stage-") as tmp:
            staging = Path(tmp) / "stage"
            staging.mkdir()
            files, pin_type, default_title, extra = self._stage(x, name, staging, type=type, zip=zip)
            latest = self._latest_or_none(name)
            created = _after(latest)
            meta = PinMeta.from_files(files, type=pin_type, title=title or default_title,
                                      description=description, user=metadata, created=created)
            meta.file = [f.relative_to(staging).as_posix() for f in files]
            meta.extra.update(extra)
            if latest is not None:
                old = self.read_meta(name, latest)
                if old.pin_hash == meta.pin_hash and old.file == meta.file:
                    return self.pin_get(name, version=latest)  # identical content: keep the version
            version = self.write_version(name, staging, meta)
        if not self.versions:
            older = [v for v in self.list_versions(name) if v != version]
            if older:
                self.delete(name, older)
        return self.pin_get(name, version=version)

    def _stage(self, x: Any, name: str, staging: Path, *, type: str | None, zip: bool):
        """Write `x` into `staging`; return (files, type, default title, extra data.txt fields)."""
        extra: dict = {}
        if isinstance(x, pd.DataFrame):
            kind = (type or "parquet").lower()
            path = staging / f"{name}.{kind}"
            if kind == "parquet":
                x.to_parquet(path)
            elif kind == "csv":
                x.to_csv(path, index=False)
            elif kind in {"arrow", "feather"}:
                path = staging / f"{name}.arrow"
                x.reset_index(drop=True).to_feather(path)
                kind = "arrow"
            else:
                raise BoardError(f"cannot store a DataFrame as type {type!r}; use parquet, csv or arrow")
            return [path], kind, f"{name}: a pinned {x.shape[0]} x {x.shape[1]} DataFrame", extra
        if isinstance(x, str) and x.startswith(("http://", "https://")):
            downloaded = self.cache.fetch_url(x, self.cache.url_path(self.name, x))
            target = staging / (Path(x.split("?", 1)[0]).name or "download")
            shutil.copyfile(downloaded, target)
            extra["source_url"] = x
            sources = [(target, target.name)]
        elif isinstance(x, (str, Path)) or (isinstance(x, (list, tuple)) and x and
                                           all(isinstance(p, (str, Path)) for p in x)):
            sources = _collect_paths([x] if isinstance(x, (str, Path)) else list(x))
        else:
            if type not in (None, "json"):
                raise BoardError(f"cannot store a {builtins_type(x)} as type {type!r}")
            path = staging / f"{name}.json"
            try:
                path.write_text(json.dumps(x))
            except TypeError as e:
                raise BoardError(f"pin {name!r}: {builtins_type(x)} is not a DataFrame, path, URL or "
                                 f"JSON-able object ({e})") from e
            return [path], "json", f"{name}: a pinned {builtins_type(x)}", extra
        if zip:
            out = staging / f"{name}.zip"
            archive.make_zip(sources, out)
            for src, _ in sources:  # a URL download was staged in place; drop it now it is zipped
                if src.parent == staging:
                    src.unlink()
            extra[ZIPPED_FIELD] = True
            return [out], type or "file", f"{name}: {len(sources)} zipped file(s)", extra
        files = []
        for src, rel in sources:
            target = staging / rel
            if target != src:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)  # a copy, never a link: later edits must not reach the pin
            files.append(target)
        return files, type or "file", f"{name}: {len(files)} file(s)", extra

    # ---- reading --------------------------------------------------------------------------
    def resolve_version(self, name: str, version: str | None, versions: list[str]) -> str:
        if not versions:
            raise PinNotFound(f"pin {name!r} has no versions on board {self.name!r}")
        if version is None:
            return versions[-1]
        if version in versions:
            return version
        matches = [v for v in versions if v.startswith(version)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise VersionNotFound(f"version prefix {version!r} of pin {name!r} is ambiguous: {', '.join(matches)}")
        raise VersionNotFound(f"pin {name!r} on board {self.name!r} has no version {version!r} "
                              f"(it has {', '.join(versions[-5:])}{' ...' if len(versions) > 5 else ''})")

    def _latest_or_none(self, name: str) -> str | None:
        try:
            versions = self.list_versions(name)
        except PinNotFound:
            return None
        return versions[-1] if versions else None

    def fetch(self, name: str, version: str | None = None, *, download: bool = True,
              trust_cache: bool = True) -> tuple[PinMeta, Path]:
        """(metadata, local folder holding the files) of a version, from the cache when possible.

        With `download=False` nothing touches the network: the newest cached version is used.
        With `trust_cache=False` cached files are verified against their data.txt and re-downloaded
        if they were damaged.
        When the board cannot be reached, the newest cached version is served with a warning.
        """
        cached = self.cache.cached_versions(self.name, name)
        if not download:
            if not cached:
                raise PinNotFound(f"pin {name!r} of board {self.name!r} is not in the cache "
                                  f"({self.cache.root}) and download=False")
            v = self.resolve_version(name, version, cached)
            folder = self.cache.version_dir(self.name, name, v)
            return self._cached_meta(name, v, folder), folder
        try:
            versions = self.list_versions(name)
        except (DownloadError, OSError) as e:
            if not cached or isinstance(e, PinNotFound):
                raise
            v = self.resolve_version(name, version, cached)
            warnings.warn(f"board {self.name!r} unreachable ({e}); serving cached version {v} of {name!r}",
                          StaleCacheWarning, stacklevel=3)
            folder = self.cache.version_dir(self.name, name, v)
            return self._cached_meta(name, v, folder), folder
        v = self.resolve_version(name, version, versions)
        local = self.local_folder(name, v)
        if local is not None:
            meta = self.read_meta(name, v)
            return meta, local
        folder = self.cache.version_dir(self.name, name, v)
        if folder.is_dir():
            meta = self._cached_meta(name, v, folder)
            if trust_cache:
                return meta, folder
            try:  # cache=False: check the cached bytes again before serving them
                verify(meta, folder, source=str(folder))
                return meta, folder
            except IntegrityError:
                shutil.rmtree(folder, ignore_errors=True)
        meta = self.read_meta(name, v)
        meta.version = v
        sizes = dict(zip(meta.file, meta.file_size)) if meta.file_size else {}
        with progress_bar(f"{self.name}/{name}", sum(sizes.values()) or None) as advance:
            def download(f: str, dest: Path) -> None:
                self.download_file(name, v, f, dest)
                advance(sizes.get(f, 0))

            folder = self.cache.fetch_version(self.name, name, meta, download)
        return meta, folder

    def _cached_meta(self, name: str, version: str, folder: Path) -> PinMeta:
        meta = PinMeta.from_yaml((folder / "data.txt").read_text(), source=str(folder / "data.txt"))
        meta.name, meta.version = name, version
        return meta

    def pin_get(self, name: str, cache: bool = True, extract: bool | None = None, version: str | None = None,
                files: bool = False, download: bool = True) -> Any:
        """A DataFrame or JSON value for table/json pins; for file pins, absolute local paths.

        `extract=True` unpacks archives (zip, tar, tar.gz, gz) and returns the extracted files;
        `extract=None` unpacks only pins that pinstorm zipped itself. `files=True` always returns
        paths. `version` takes a full version or a unique prefix. `cache=False` re-verifies cached
        files (and re-downloads damaged ones) instead of trusting them.
        """
        name = self.check_name(name)
        meta, folder = self.fetch(name, version, download=download, trust_cache=cache)
        paths = [folder / f for f in meta.file]
        if not files and len(paths) == 1:
            loaded = _load(meta.type, paths[0])
            if loaded is not _NOT_LOADED:
                return loaded
        if extract is None:
            extract = self.default_extract(meta)
        if not extract:
            return [str(p) for p in paths]
        out_root = self.cache.version_dir(self.name, name, meta.version or "") / EXTRACTED
        result: list[str] = []
        for p in paths:
            if archive.is_archive(p):
                result += [str(q) for q in archive.extract(p, out_root / p.name)]
            else:
                result.append(str(p))
        return result

    def pin_versions(self, name: str) -> pd.DataFrame:
        """Versions of a pin, oldest first, with their creation time and hash prefix."""
        name = self.check_name(name)
        rows = []
        for v in self.list_versions(name):
            parsed = parse_version(v)
            created = pd.to_datetime(parsed[0], format="%Y%m%dT%H%M%SZ", utc=True) if parsed else pd.NaT
            rows.append({"version": v, "created": created, "hash": parsed[1] if parsed else ""})
        return pd.DataFrame(rows, columns=["version", "created", "hash"])

    def pin_info(self, name: str, version: str | None = None) -> dict:
        """Everything known about a version (latest by default): its data.txt plus where it lives."""
        name = self.check_name(name)
        versions = self.list_versions(name)
        v = self.resolve_version(name, version, versions)
        meta = self.read_meta(name, v)
        info = meta.to_dict()
        info.update(name=name, version=v, board=self.name, versions=len(versions))
        return info

    def pin_find(self, text: str = "", name: str | None = None, extended: bool = False) -> pd.DataFrame:
        """Pins whose name, title or description contains `text` (case-insensitive)."""
        needle = (text or "").lower()
        rows = []
        for e in self.list_entries():
            if name is not None and e.get("name") != name:
                continue
            haystack = " ".join(str(e.get(k) or "") for k in ("name", "title", "description")).lower()
            if needle in haystack:
                row = {"name": e.get("name"), "description": e.get("description") or "",
                       "type": e.get("type") or "files", "board": self.name}
                if extended:
                    row.update({k: v for k, v in e.items() if k not in row})
                rows.append(row)
        df = pd.DataFrame(rows)
        return df if extended and rows else df.reindex(columns=FIND_COLUMNS)

    def pin_remove(self, name: str, version: str | None = None) -> None:
        """Remove a pin with all its versions, or just one version."""
        if self.read_only:
            raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only; cannot remove {name!r}")
        name = self.check_name(name)
        versions = self.list_versions(name)
        self.delete(name, None if version is None else [self.resolve_version(name, version, versions)])


# ---- helpers ------------------------------------------------------------------------------
def _after(latest: str | None) -> _dt.datetime:
    """Now, or the first second after `latest` was created: version names have one-second
    resolution, and two versions in one second would sort by hash rather than by time."""
    now = utc_now()
    parsed = parse_version(latest) if latest else None
    if parsed:
        last = _dt.datetime.strptime(parsed[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=_dt.timezone.utc)
        if now <= last:
            time.sleep((last - now).total_seconds() + 1.0 - (time.time() % 1.0) + 0.001)
            now = utc_now()
    return now


_NOT_LOADED = object()


def _load(pin_type: str, path: Path) -> Any:
    suffix = path.suffix.lower()
    if pin_type == "parquet" or (pin_type == "table" and suffix == ".parquet"):
        return pd.read_parquet(path)
    if pin_type == "csv" or (pin_type == "table" and suffix == ".csv"):
        return pd.read_csv(path)
    if pin_type in {"arrow", "feather"}:
        return pd.read_feather(path)
    if pin_type == "json":
        return json.loads(path.read_text())
    return _NOT_LOADED


def builtins_type(x: Any) -> str:
    return type(x).__name__


def _default_name(x: Any) -> str:
    if isinstance(x, (str, Path)):
        base = Path(str(x).split("?", 1)[0].rstrip("/")).name
        stem = base.split(".")[0] if "." in base else base
        if stem:
            return stem
    raise InvalidPinName("pin(): give a name= for this object")


def _collect_paths(items: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """(source file, relative name in the pin) for files and folders, refusing duplicates."""
    out: list[tuple[Path, str]] = []
    seen: set[str] = set()
    for item in items:
        p = Path(item).expanduser()
        if not p.exists():
            raise FileNotFoundError(f"cannot pin {str(item)!r}: no such file or folder")
        found = [(f, f.relative_to(p).as_posix()) for f in sorted(p.rglob("*")) if f.is_file()] \
            if p.is_dir() else [(p, p.name)]
        if p.is_dir() and not found:
            raise BoardError(f"cannot pin folder {str(item)!r}: it holds no files")
        for src, rel in found:
            if rel in seen:
                raise BoardError(f"two files would be stored as {rel!r} in one pin; rename one")
            if rel == "data.txt":
                raise BoardError(f"{src}: a pin cannot contain a file named data.txt (it holds the metadata)")
            seen.add(rel)
            out.append((src, rel))
    return out
