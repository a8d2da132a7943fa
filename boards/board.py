"""`Board`: the user-facing pin operations, written once over a few storage primitives.

A concrete board (a folder or bucket, an HTTP data.txt site, Kaggle) implements the primitives
(`list_entries`, `list_versions`, `read_meta`, `download_file`, and for writable boards
`write_version` and `delete`); everything users call (`pin`, `pin_get`, `pin_find`, `pin_info`,
`pin_versions`, `pin_remove`) lives here so every board behaves alike: same versions, same cache,
same errors, same offline fallback.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from . import archive, drivers, paths, secrets
from .cache import Cache, StaleCacheWarning, check_folder, stamp_path
from .diskspace import require_room, storage_errors
from .errors import (BoardError, DownloadError, IntegrityError, InvalidPinName, LimitExceeded, PinNotFound,
                     ReadOnlyBoard, VersionNotFound)
from .meta import FILE_HASH_FIELD, PinMeta, format_created, hash_matches, parse_version, utc_now
from .tempnames import staging_dir, tmp_name
from .names import check_pin_name
from .pins_api import PinsApiMixin
from pinstorm.progress import progress_bar

FIND_COLUMNS = ["name", "description", "type", "board"]
EXTRACTED = "_extracted"
# Field in data.txt marking a pin that pinstorm zipped for transport: pin_get unzips it by default.
ZIPPED_FIELD = "pinstorm_zipped"


class Board(PinsApiMixin):
    """Base class of every board. Subclasses set `kind` and implement the primitives below
    (`PinsApiMixin` adds the pins 1.x / pins-python method names over the operations here)."""

    kind = "board"
    read_only = False

    def __init__(self, name: str, *, cache: str | Path | Cache | None = None, versions: bool = True,
                 max_extract_bytes: int | None = None, max_extract_ratio: float | None = None):
        self.name = name
        self.cache = cache if isinstance(cache, Cache) else Cache(cache)
        self.versions = versions
        self._written: dict[tuple[str, str], PinMeta] = {}
        # bounds on archive extraction for this board (archive.ExtractLimits; None keeps the default)
        self.extract_limits = archive.ExtractLimits.of(max_bytes=max_extract_bytes, max_ratio=max_extract_ratio)

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

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        """Copy `file` of a version to `dest`; with `offset`, append its bytes from `offset` on to the
        `offset` bytes `dest` already holds (resuming a download cut short)."""
        raise NotImplementedError

    def write_version(self, name: str, staging: Path, meta: PinMeta) -> str:
        raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only")

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only")

    @contextlib.contextmanager
    def batch(self):
        """`with board.batch(): ...`: write many pins and publish the board's indexes once, when the
        outermost batch closes. Boards without derived indexes have nothing to defer."""
        yield self

    def default_extract(self, meta: PinMeta) -> bool:
        """What `extract=None` means: unzip what pinstorm zipped itself, leave other archives be."""
        return bool(meta.extra.get(ZIPPED_FIELD))

    def check_name(self, name: str) -> str:
        return check_pin_name(name)

    # ---- writing --------------------------------------------------------------------------
    def pin(self, x: Any, name: str | None = None, description: str | None = None, zip: bool = False,
            metadata: dict | None = None, type: str | None = None, title: str | None = None,
            tags: list[str] | None = None) -> Any:
        """Store `x` as a new version of pin `name` and return what `pin_get` would.

        `x`: a pandas DataFrame (Parquet, or CSV with type="csv"), a file or folder path, a list of
        paths, an http(s) URL (downloaded through the cache), or a JSON-able object. Pinning the
        latest version's bytes with the same title, description and metadata stores nothing new (and
        repairs the stored bytes on a local board if they were damaged); the same bytes with a new
        title, description or metadata make a new version, so the change is never dropped.
        """
        if self.read_only:
            raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only; cannot pin {name!r}")
        name = self.check_name(name if name is not None else _default_name(x))
        with storage_errors(f"pin {name!r} on board {self.name!r}", self.describe()), \
                self.staging(name) as (staging, in_place):
            files, pin_type, default_title, extra = self._stage(x, name, staging, type=type, zip=zip,
                                                                link=not in_place)
            meta = PinMeta.from_files(files, type=pin_type, title=title or default_title,
                                      description=description, user=metadata)
            meta.file = [f.relative_to(staging).as_posix() for f in files]
            meta.extra.update(extra)
            if tags is not None:  # pins 1.x's `tags` field
                meta.extra["tags"] = [str(t) for t in tags]
            latest = self._latest_or_none(name)
            try:
                old = self.read_meta(name, latest) if latest is not None else None
            except PinNotFound:  # pruned or removed since the listing: there is nothing to compare with
                old = None
            if old is not None:
                if _same_content(old, meta, staging) and _same_metadata(old, meta):
                    # identical content and metadata: keep the version (repairing its bytes if they rotted)
                    self.repair_version(name, latest, old, staging)
                    return self.pin_get(name, version=latest)
                # same bytes with a new title, description or metadata: a new version records it
            meta.created = format_created(_after(latest))
            version = self.write_version(name, staging, meta)
            meta.name, meta.version = name, version
            self._written[(name, version)] = meta  # pin_get below needs no listing or data.txt read
        if not self.versions:
            older = [v for v in self.list_versions(name) if v != version]
            if older:
                self.delete(name, older)
        try:
            return self.pin_get(name, version=version)
        except LimitExceeded:  # stored, but larger than the load budget: hand back its files, not an error
            return self.pin_get(name, version=version, files=True)

    @contextlib.contextmanager
    def staging(self, name: str):
        """Yields (folder, on_board): an empty private folder where `pin` assembles a version, and
        whether that folder is on the board itself.

        Here: a fresh TMPDIR folder, into which `pin` links the user's files rather than copying them
        (a 155 GB archive must not need 155 GB of TMPDIR); `write_version` then reads them once.
        Boards on a local disk stage inside the board, so a version is written once and renamed."""
        root = staging_dir()
        try:
            staging = root / "stage"
            staging.mkdir()
            yield staging, False
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def repair_version(self, name: str, version: str, meta: PinMeta, staging: Path) -> bool:
        """Make a stored version hold the bytes in `staging` (which hash to `meta`) if its own bytes
        no longer do; True when something was repaired. Boards that cannot read their bytes cheaply
        (object stores, read-only boards) keep the version as it is."""
        return False

    def _stage(self, x: Any, name: str, staging: Path, *, type: str | None, zip: bool, link: bool = False):
        """Write `x` into `staging`; return (files, type, default title, extra data.txt fields).
        `link`: user files are symlinked, not copied (`staging` is a TMPDIR folder; see `staging`)."""
        extra: dict = {}
        if isinstance(x, pd.DataFrame):
            path, kind, title = drivers.save_dataframe(x, name, staging, type)
            return [path], kind, title, extra
        if isinstance(x, str) and x.startswith(("http://", "https://")):
            downloaded = self.cache.fetch_url(x, self.cache.url_path(self.name, x))
            target = staging / paths.url_file_name(x)  # one safe segment, whatever the URL says
            shutil.copyfile(downloaded, target)
            extra["source_url"] = secrets.strip_url(x)  # data.txt is public: no user:password@, no ?token=
            sources = [(target, target.name)]
        elif isinstance(x, (str, Path)) or (isinstance(x, (list, tuple)) and x and
                                           all(isinstance(p, (str, Path)) for p in x)):
            sources = _collect_paths([x] if isinstance(x, (str, Path)) else list(x))
        else:
            path, kind, title = drivers.save_json(x, name, staging, type)
            return [path], kind, title, extra
        if zip:
            out = staging / f"{name}.zip"
            archive.make_zip(sources, out)
            for src, _ in sources:  # a URL download was staged in place; drop it now it is zipped
                if src.parent == staging:
                    src.unlink()
            extra[ZIPPED_FIELD] = True
            return [out], type or "file", f"{name}: {len(sources)} zipped file(s)", extra
        if not link:  # copied onto the board's own disk: say so now if it cannot fit
            require_room(staging, sum(Path(src).stat().st_size for src, _ in sources), what=f"pin {name!r}")
        files = []
        for src, rel in sources:
            target = staging / rel
            if target != src:
                target.parent.mkdir(parents=True, exist_ok=True)
                if link:  # staged by reference: the board stores a copy of the bytes, never the link
                    target.symlink_to(Path(src).resolve())
                else:
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
            return self._offline(name, self.resolve_version(name, version, cached), full=not trust_cache)
        known = getattr(self, "_written", {}).pop((name, version), None) if version else None
        try:
            versions = [version] if known is not None else self.list_versions(name)
        except (DownloadError, OSError) as e:
            if not cached or isinstance(e, PinNotFound):
                raise
            v = self.resolve_version(name, version, cached)
            warnings.warn(f"board {self.name!r} unreachable ({e}); serving cached version {v} of {name!r}",
                          StaleCacheWarning, stacklevel=3)
            return self._offline(name, v, full=not trust_cache)
        v = self.resolve_version(name, version, versions)
        from .pins_api import version_read

        with version_read(self, name, v):  # pruned under us: VersionNotFound, never a bare FileNotFoundError
            local = self.local_folder(name, v)
            if local is not None:
                meta = known or self.read_meta(name, v)
                self._check(meta, local, self._board_stamp(name, v), full=not trust_cache,
                            source=f"pin {name!r} version {v} on board {self.name!r} ({local})")
                return meta, local
            folder = self.cache.version_dir(self.name, name, v)
            if (folder / "data.txt").is_file():
                meta = self._cached_meta(name, v, folder)
                try:
                    self._check(meta, folder, stamp_path(folder), full=not trust_cache,
                                source=f"cached pin {name!r} version {v} of board {self.name!r} ({folder})")
                    return meta, folder
                except IntegrityError:
                    if not _discard(folder):  # damaged: fetched again below, unless it cannot be moved away
                        raise
            meta = known or self.read_meta(name, v)
            meta.version = v
            sizes = dict(zip(meta.file, meta.file_size)) if meta.file_size else {}
            with progress_bar(f"{self.name}/{name}", sum(sizes.values()) or None) as advance:
                def download(f: str, dest: Path, offset: int) -> None:
                    self.download_file(name, v, f, dest, offset=offset)
                    advance(sizes.get(f, 0) - offset)

                folder = self.cache.fetch_version(self.name, name, meta, download)
            return meta, folder

    def _offline(self, name: str, version: str, *, full: bool) -> tuple[PinMeta, Path]:
        """A cached version served without the board: checked, and an error if damaged."""
        folder = self.cache.version_dir(self.name, name, version)
        meta = self._cached_meta(name, version, folder)
        self._check(meta, folder, stamp_path(folder), full=full,
                    source=f"cached pin {name!r} version {version} of board {self.name!r} ({folder}; "
                           "the board cannot be reached to fetch it again)")
        return meta, folder

    def _board_stamp(self, name: str, version: str) -> Path:
        """The verification stamp of a version the board keeps on local disk (kept in the cache)."""
        folder = self.cache.version_dir(self.name, name, version)  # safe names, inside the cache
        return folder.parent / f".{folder.name}.board-verified.json"

    @staticmethod
    def _check(meta: PinMeta, folder: Path, stamp: Path, *, full: bool, source: str) -> None:
        try:
            check_folder(meta, folder, stamp, full=full, source=source)
        except PermissionError:
            # an unwritable cache only costs the stamp: check in full, every time
            from .cache import verify

            verify(meta, folder, source=source)

    def _cached_meta(self, name: str, version: str, folder: Path) -> PinMeta:
        meta = PinMeta.from_yaml((folder / "data.txt").read_text(), source=str(folder / "data.txt"))
        meta.name, meta.version = name, version
        return meta

    def pin_get(self, name: str, cache: bool = True, extract: bool | None = None, version: str | None = None,
                files: bool = False, download: bool = True,
                extract_limits: "archive.ExtractLimits | dict | None" = None) -> Any:
        """A DataFrame or JSON value for table/json pins; for file pins, absolute local paths.

        `extract=True` unpacks archives (zip, tar, tar.gz, gz) and returns the extracted files;
        `extract=None` unpacks only pins that pinstorm zipped itself. `files=True` always returns
        paths. `version` takes a full version or a unique prefix. `cache=False` re-verifies cached
        files (and re-downloads damaged ones) instead of trusting them. `extract_limits` (a dict such
        as `{"max_bytes": 2**40, "max_ratio": 1000}`) raises or lowers this board's extraction bounds.
        """
        name = self.check_name(name)
        meta, folder = self.fetch(name, version, download=download, trust_cache=cache)
        from .pins_api import version_read  # files pruned under us: VersionNotFound

        paths = [folder / f for f in meta.file]
        if not files:
            with version_read(self, name, meta.version):
                loaded = drivers.load_pin(meta.type, paths)
            if loaded is not drivers.NOT_LOADED:
                return loaded
        if extract is None:
            extract = self.default_extract(meta)
        if not extract:
            return [str(p) for p in paths]
        out_root = self.cache.version_dir(self.name, name, meta.version or "") / EXTRACTED
        result: list[str] = []
        for p in paths:
            if archive.is_archive(p):
                limits = getattr(self, "extract_limits", None)
                if extract_limits is not None:  # a dict adjusts the board's limits; ExtractLimits replaces them
                    limits = archive.ExtractLimits.of(limits, **extract_limits) if isinstance(extract_limits, dict) \
                        else extract_limits
                with version_read(self, name, meta.version):
                    result += [str(q) for q in archive.extract(p, out_root / p.name, limits=limits)]
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


def builtins_type(x: Any) -> str:
    return type(x).__name__


def _same_content(old: PinMeta, new: PinMeta, staging: Path) -> bool:
    """Whether the staged files are the stored version's files: same names and sizes, and the
    staged bytes hash to the stored pin_hash under the scheme its writer used."""
    if old.file != new.file or (old.file_size and old.file_size != new.file_size):
        return False
    if old.pin_hash == new.pin_hash:
        return True
    return hash_matches(old.pin_hash, [staging / f for f in new.file], new.file_hashes()) is True


def _same_metadata(old: PinMeta, new: PinMeta) -> bool:
    """Whether re-pinning would record nothing new: same title, description, type and metadata."""
    def extra(m: PinMeta) -> dict:
        return {k: v for k, v in m.extra.items() if k != FILE_HASH_FIELD}

    return (old.title, old.description, old.type, dict(old.user or {}), extra(old)) == \
        (new.title, new.description, new.type, dict(new.user or {}), extra(new))


def _discard(folder: Path) -> bool:
    """Remove a damaged cached folder: renamed away first, so no reader finds it half-deleted.
    False when it is still there (no right to move it)."""
    gone = Path(tmp_name(folder.with_name("." + folder.name)))
    try:
        os.replace(folder, gone)
    except FileNotFoundError:
        return True  # another process discarded it first
    except OSError:
        return not folder.exists()
    shutil.rmtree(gone, ignore_errors=True)
    return True


def _default_name(x: Any) -> str:
    if isinstance(x, (str, Path)):
        text = secrets.strip_url(x) if isinstance(x, str) and "://" in x else str(x)
        base = Path(text.split("?", 1)[0].rstrip("/")).name
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
