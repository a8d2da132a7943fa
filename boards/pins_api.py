"""What pins 1.x users expect: `pin_meta`, `pin_search`, `pin_versions_prune`, `pin_version_delete`,
`cache_prune`, tags, and pins-python's Board method names (`pin_write`, `pin_read`, `pin_upload`,
`pin_download`, `pin_list`, `pin_exists`).

`PinsApiMixin` is a base class of `Board`, so every board (folder, S3, GCS, URL, Kaggle) has these
methods; the module-level functions take `board=` like the rest of the API. Everything is written
over the legacy operations (`pin`, `pin_get`, `pin_remove`, ...), which stay as they are.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import shutil
import time
from typing import Any, Iterable

import pandas as pd
from filelock import FileLock

from .errors import BoardError, DownloadError, IntegrityError, PinNotFound, VersionNotFound
from .meta import parse_version

PRUNE_GRACE = 60.0  # seconds: pin_versions_prune never deletes a version younger than this
SEARCH_COLUMNS = ["name", "type", "title", "description", "created", "file_size", "tags", "board"]


class PinMetadata(dict):
    """A version's metadata as R's `pin_meta()` gives it: every data.txt field (`title`,
    `description`, `created`, `pin_hash`, `file`, `file_size`, `type`, `api_version`, `user`, `tags`,
    `urls`, and any other) plus `name`, `version` and `board`. Fields read as keys or attributes
    (`meta["user"]`, `meta.user`), so R and pins-python habits both work."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _as_list(value: Any) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, (str, int, float)) else list(value)


class PinsApiMixin:
    """pins 1.x operations over the Board primitives; mixed into `Board`."""

    # ---- metadata -------------------------------------------------------------------------
    def pin_meta(self, name: str, version: str | None = None) -> PinMetadata:
        """All of a version's metadata (latest by default), incl. user metadata, tags and urls."""
        name = self.check_name(name)
        v = self.resolve_version(name, version, self.list_versions(name))
        meta = self.read_meta(name, v)
        out = PinMetadata(meta.to_dict())
        out["file"], out["file_size"] = list(meta.file), list(meta.file_size)
        out["user"] = dict(meta.user or {})
        out["tags"] = _as_list(out.get("tags")) or None
        out["urls"] = _as_list(out.get("urls")) or None
        out.update(name=name, version=v, board=self.name)
        return out

    def pin_list(self) -> list[str]:
        """Names of the pins on this board."""
        return sorted(str(e["name"]) for e in self.list_entries())

    def pin_exists(self, name: str) -> bool:
        return self.check_name(name) in self.pin_list()

    def pin_search(self, search: str | None = None, as_df: bool = True) -> pd.DataFrame | list[PinMetadata]:
        """Pins whose name, title, description or tags contain `search` (case-insensitive), with
        their latest metadata; `as_df=False` gives the `PinMetadata` objects."""
        needle = (search or "").lower()
        found: list[PinMetadata] = []
        for name in self.pin_list():
            try:
                meta = self.pin_meta(name)
            except BoardError:
                continue  # a pin without readable metadata is not searchable, and must not hide the others
            haystack = " ".join([name, str(meta.get("title") or ""), str(meta.get("description") or ""),
                                 *map(str, meta.get("tags") or [])]).lower()
            if needle in haystack:
                found.append(meta)
        if not as_df:
            return found
        rows = [{"name": m["name"], "type": m.get("type"), "title": m.get("title"),
                 "description": m.get("description") or "", "created": _created(m.get("created")),
                 "file_size": sum(m.get("file_size") or []), "tags": m.get("tags"), "board": self.name}
                for m in found]
        return pd.DataFrame(rows, columns=SEARCH_COLUMNS)

    # ---- versions -------------------------------------------------------------------------
    def pin_version_delete(self, name: str, version: str) -> None:
        """Delete one version of a pin (a full version name or a unique prefix)."""
        self.pin_remove(name, version=version)

    def pin_versions_prune(self, name: str, n: int | None = None, days: float | None = None, *,
                           grace: float = PRUNE_GRACE) -> list[str]:
        """Delete old versions, keeping the newest `n` and/or those created in the last `days`
        (a version is kept if either rule keeps it). Returns the versions deleted.

        Whatever the rules say, the newest version is never deleted, nor one younger than `grace`
        seconds (default 60): a writer that just stored a version is still checking it, and readers
        that just listed it are about to read it. A version's age counts from the later of the time
        in its name and the time its data.txt was stored (when the board can tell), so a slow upload
        is young when it appears; a version of unknown age is kept (`grace=0` deletes it)."""
        if n is None and days is None:
            raise ValueError("pin_versions_prune: give n= (versions to keep) or days= (age to keep)")
        if n is not None and int(n) < 1:
            raise ValueError(f"pin_versions_prune: n must be at least 1, got {n}")
        if days is not None and days < 0:
            raise ValueError(f"pin_versions_prune: days must be >= 0, got {days}")
        if grace is None or not grace >= 0:
            raise ValueError(f"pin_versions_prune: grace must be >= 0 seconds, got {grace}")
        name = self.check_name(name)
        versions = self.list_versions(name)
        keep = {versions[-1]}
        if n is not None:
            keep.update(versions[-int(n):])
        if days is not None:
            cutoff = time.time() - float(days) * 86400
            for v in versions:
                created = _version_time(v)
                if created is None or created >= cutoff:  # undated (hand-made) folders are kept
                    keep.add(v)
        doomed = [v for v in versions if v not in keep]
        if grace > 0:
            doomed = [v for v in doomed if self._version_age(name, v) >= grace]
        if doomed:
            self.delete(name, doomed)
        return doomed

    def _version_age(self, name: str, version: str) -> float:
        """Seconds since `version` was created and stored (the younger of the two); -inf when
        unknown, so no grace period ever lets it go by mistake."""
        times = [_version_time(version), self._stored_time(name, version)]
        known = [t for t in times if t is not None]
        return time.time() - max(known) if known else float("-inf")

    def _stored_time(self, name: str, version: str) -> float | None:
        """When the version's data.txt was stored, on boards over an fsspec filesystem (local
        mtime, object LastModified); None elsewhere, or when the storage does not say."""
        fs, path_of = getattr(self, "fs", None), getattr(self, "_path", None)
        if fs is None or path_of is None:
            return None
        from .fs_board import _modified

        path = path_of(name, version, "data.txt")
        errors = getattr(self, "_errors", None)  # cloud boards translate storage errors
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        try:
            with errors(f"read the age of {name!r} version {version}") if errors else contextlib.nullcontext():
                info = fs.info(path)
        except FileNotFoundError:
            return time.time()  # gone or going: nothing to delete, and counted as young
        stamp = _modified(info)
        return stamp if any(k in info for k in ("LastModified", "mtime", "updated", "last_modified")) else None

    # ---- pins-python names ----------------------------------------------------------------
    def pin_write(self, x: Any, name: str | None = None, type: str | None = None, title: str | None = None,
                  description: str | None = None, metadata: dict | None = None, versioned: bool | None = None,
                  tags: Iterable[str] | None = None) -> PinMetadata:
        """pins-python's `pin_write`: store `x` and return the new version's metadata.

        `type`: parquet (default for DataFrames), csv, arrow, json, or file (paths).
        `versioned=False` keeps only the new version."""
        if type == "file":
            type = None
        result_name = self._pin_with_tags(x, name, description=description, metadata=metadata, type=type,
                                          title=title, tags=tags, versioned=versioned)
        return self.pin_meta(result_name)

    def pin_upload(self, paths: str | os.PathLike | list, name: str | None = None, title: str | None = None,
                   description: str | None = None, metadata: dict | None = None,
                   tags: Iterable[str] | None = None) -> PinMetadata:
        """Store files (a path or a list of paths) as a `file` pin; returns its metadata."""
        return self.pin_write(paths, name=name, title=title, description=description, metadata=metadata,
                              tags=tags)

    def pin_read(self, name: str, version: str | None = None, hash: str | None = None) -> Any:
        """The object stored in a pin (DataFrame, JSON value); `hash` must equal its `pin_hash`."""
        meta = self._check_hash(name, version, hash)
        if meta["type"] in ("file", "files"):
            raise BoardError(f"pin {name!r} holds files, not an object: use pin_download()")
        return self.pin_get(name, version=meta["version"])

    def pin_download(self, name: str, version: str | None = None, hash: str | None = None) -> list[str]:
        """Local paths of a pin's files (cached; verified against its data.txt)."""
        meta = self._check_hash(name, version, hash)
        return self.pin_get(name, version=meta["version"], files=True, extract=False)

    def _check_hash(self, name: str, version: str | None, expected: str | None) -> PinMetadata:
        """The version's metadata, after checking its pin_hash against `expected` (when given)."""
        meta = self.pin_meta(name, version)
        actual = str(meta.get("pin_hash") or "")
        if expected is not None and actual != expected:
            raise IntegrityError(f"pin {name!r} version {meta['version']}: pin_hash is {actual!r}, "
                                 f"not the expected {expected!r}")
        return meta

    def _pin_with_tags(self, x: Any, name: str | None, *, tags: Iterable[str] | None,
                       versioned: bool | None, **kwargs: Any) -> str:
        from .board import _default_name

        name = self.check_name(name if name is not None else _default_name(x))
        tags = [str(t) for t in tags] if tags is not None else None
        if tags is not None:
            kwargs["tags"] = tags
        self.pin(x, name=name, **kwargs)
        if versioned is False:  # keep only the version just written, as the board's versions=False does
            older = self.list_versions(name)[:-1]
            if older:
                self.delete(name, older)
        return name


# ---- the cache --------------------------------------------------------------------------------
def cache_prune(days: float = 30, cache=None, *, dry_run: bool = False) -> list[str]:
    """Delete cached pin versions not used in the last `days` days; returns the folders removed.

    "Used" is the newest of the version's data.txt access and modification times (access times
    are coarse on most mounts, at worst a day, which is fine at this scale). A version being
    downloaded or read under the cache's file lock is skipped."""
    from .cache import Cache

    cache = cache if isinstance(cache, Cache) else Cache(cache)
    cutoff = time.time() - float(days) * 86400
    removed: list[str] = []
    if not cache.root.is_dir():
        return removed
    for data_txt in sorted(cache.root.glob("*/*/*/data.txt")):
        folder = data_txt.parent
        if folder.name.startswith(".") or folder.parent.name.startswith((".", "_")):
            continue
        stat = data_txt.stat()
        if max(stat.st_atime, stat.st_mtime) >= cutoff:
            continue
        if dry_run:
            removed.append(str(folder))
            continue
        lock = FileLock(str(folder) + ".lock", timeout=0)
        try:
            with lock:
                gone = folder.with_name(f".{folder.name}.pruned-{os.getpid()}")
                os.replace(folder, gone)  # readers never see a half-deleted version
                shutil.rmtree(gone, ignore_errors=True)
                removed.append(str(folder))
        except (TimeoutError, OSError):
            continue
    return removed


# ---- reading a version that may be pruned under the reader -------------------------------------
@contextlib.contextmanager
def version_read(board, name: str, version: str | None):
    """Around the reading of one version (`Board.fetch`, `Board.pin_get`): when it fails because the
    version's files or data.txt vanished and a fresh listing confirms the version is gone (pruned or
    removed by another process), raise `VersionNotFound` naming pin, version and board instead of a
    bare FileNotFoundError / PinNotFound / missing-file IntegrityError / 404. Failures of a version
    that still exists (damaged bytes, a network fault) stay what they are."""
    try:
        yield
    except VersionNotFound:
        raise
    except (FileNotFoundError, PinNotFound, IntegrityError, DownloadError) as e:
        if version is None or _still_listed(board, name, version):
            raise
        raise VersionNotFound(f"pin {name!r} version {version} on board {board.name!r} is gone: it was deleted "
                              f"(pruned or removed) while being read ({type(e).__name__}: {e})") from e


def _still_listed(board, name: str, version: str) -> bool:
    try:
        return version in board.list_versions(name)
    except PinNotFound:
        return False
    except (BoardError, OSError):
        return True  # cannot tell (board unreachable): the original error stands


def _version_time(version: str) -> float | None:
    parsed = parse_version(version)
    if not parsed:
        return None
    return _dt.datetime.strptime(parsed[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=_dt.timezone.utc).timestamp()


def _created(value: Any) -> Any:
    try:
        return pd.to_datetime(str(value), format="%Y%m%dT%H%M%SZ", utc=True)
    except (ValueError, TypeError):
        return pd.NaT


# ---- module-level functions (board= as in the rest of the API) ---------------------------------
def _board(board):
    from .registry import board_get

    return board_get(board)


def pin_meta(name: str, board=None, version: str | None = None) -> PinMetadata:
    from .api import _board_holding

    return _board_holding(name, board).pin_meta(name, version=version)


def pin_search(search: str | None = None, board=None) -> pd.DataFrame:
    return _board(board).pin_search(search)


def pin_versions_prune(name: str, board=None, n: int | None = None, days: float | None = None, *,
                       grace: float = PRUNE_GRACE) -> list[str]:
    return _board(board).pin_versions_prune(name, n=n, days=days, grace=grace)


def pin_version_delete(name: str, version: str, board=None) -> None:
    _board(board).pin_version_delete(name, version)


def pin_write(x: Any, name: str | None = None, board=None, **kwargs: Any) -> PinMetadata:
    return _board(board).pin_write(x, name=name, **kwargs)


def pin_upload(paths, name: str | None = None, board=None, **kwargs: Any) -> PinMetadata:
    return _board(board).pin_upload(paths, name=name, **kwargs)


def pin_read(name: str, board=None, version: str | None = None, hash: str | None = None) -> Any:
    from .api import _board_holding

    return _board_holding(name, board).pin_read(name, version=version, hash=hash)


def pin_download(name: str, board=None, version: str | None = None, hash: str | None = None) -> list[str]:
    from .api import _board_holding

    return _board_holding(name, board).pin_download(name, version=version, hash=hash)


def write_board_manifest(board=None) -> dict[str, list[str]]:
    """Write `_pins.yaml` at the root of a writable board (pinstorm keeps it current on every pin
    and remove; this is for boards other tools wrote). Returns the manifest."""
    from .manifest import write_board_manifest as _write

    return _write(_board(board))


__all__ = ["PRUNE_GRACE", "PinMetadata", "PinsApiMixin", "cache_prune", "pin_download", "pin_meta", "pin_read",
           "pin_search", "pin_upload", "pin_version_delete", "pin_versions_prune", "pin_write",
           "version_read", "write_board_manifest"]
