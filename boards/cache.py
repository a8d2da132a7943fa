"""The local cache: where pins land so data loads fast and works offline.

Two kinds of things are cached:
* immutable pin versions (`<root>/<board>/<pin>/<version>/`), downloaded once into a temporary
  folder, checked against the sizes and hash in their metadata, and renamed into place, under a file
  lock so that many processes asking for one pin download it once;
* mutable URLs (a data.txt index, legacy R pins, `pin("https://...")`), revalidated the way R
  legacy pins did: ETag / Last-Modified and Cache-Control max-age, kept beside the file; when the
  server cannot be reached or fails (5xx), the cached copy is served with a warning.

The root is `cache=` if given, else `$PINSTORM_CACHE`, else the user cache folder, so it can live on
a fast local SSD.
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import platformdirs
import requests
import urllib3
import xxhash
from filelock import FileLock

from .safety import secrets
from .safety.diskspace import require_room
from .errors import BoardError, DownloadError, IntegrityError, LimitExceeded
from .meta import PinMeta, hash_file, hash_files, hash_matches
from .safety.paths import check_relative, contained
from .tempnames import FOREIGN_MAX_AGE, sweep, tmp_name

ENV_CACHE = "PINSTORM_CACHE"
HTTP_TIMEOUT = float(os.environ.get("PINSTORM_HTTP_TIMEOUT", "60"))  # per connect / read
HTTP_DEADLINE = float(os.environ.get("PINSTORM_HTTP_DEADLINE", "60"))  # per body, plus size / min rate
HTTP_MIN_RATE = float(os.environ.get("PINSTORM_HTTP_MIN_RATE", str(128 * 1024)))  # bytes/s
SIZE_SLACK = 64 * 1024  # bytes past a declared size before a body is cut (or 1%)
DISK_RESERVE = 16 * 1024 * 1024  # free bytes a download without a declared size leaves on the disk
_CHUNK = 1 << 20


class StaleCacheWarning(UserWarning):
    """A cached copy was served because the source could not be reached."""


def default_cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE) or os.environ.get("PINS_CACHE_DIR")  # pins-python's variable
                or platformdirs.user_cache_dir("pinstorm"))


def _safe_segment(text: str) -> str:
    """One plain folder name for `text`: never empty, never `.`/`..` or hidden (a version named `..`
    in remote metadata must not reach another pin's cached files)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"
    return "_" + safe if safe.startswith(".") else safe


def verify(meta: PinMeta, folder: Path, *, source: str, full: bool = True) -> None:
    """Raise IntegrityError unless the files in `folder` are what `meta` promises.

    Always: every listed file exists, with the size in data.txt. `full=True` also recomputes the
    pin hash from the bytes under the scheme its writer used (see `meta.hash_matches`); the error
    names the file that differs when data.txt records per-file hashes, else lists the pin's files.
    """
    paths = [folder / f for f in meta.file]
    sizes: list[int | None] = list(meta.file_size) if meta.file_size else [None] * len(paths)
    # archives the cache replaced by their verified extraction (see `extract_once`)
    replaced = {f: m for f in meta.file if (m := read_manifest(folder / EXTRACTED, f)) is not None}
    for path, f, size in zip(paths, meta.file, sizes):
        if f in replaced:
            m = replaced[f]
            if size is not None and m["archive_size"] != size:
                raise IntegrityError(f"{source}: {f!r} was extracted from {m['archive_size']} bytes, data.txt "
                                     f"says {size}")
            check_extracted(folder / EXTRACTED, f, m, source=source, full=full)
            continue
        if not path.is_file():
            raise IntegrityError(f"{source}: file {f!r} listed in data.txt is missing")
        actual = path.stat().st_size
        if size is not None and actual != size:
            raise IntegrityError(f"{source}: {f!r} has {actual} bytes, data.txt says {size}"
                                 " (truncated or changed)")
    if not full or meta.api_version == 0:
        return
    hashes = [replaced[f]["archive_hash"] if f in replaced else hash_file(p) for p, f in zip(paths, meta.file)]
    if replaced:  # the archives' bytes are gone: their hashes recorded when they were verified stand in
        if _pin_hash_from(meta.pin_hash, hashes) is False:
            raise IntegrityError(f"{source}: the recorded hashes of {sorted(replaced)} do not give pin_hash "
                                 f"{meta.pin_hash} of data.txt")
        recorded = meta.file_hashes()
        for f, want, got in zip(meta.file, recorded or [], hashes):
            if want != got:
                raise IntegrityError(f"{source}: file {f!r} has hash {got}, data.txt says {want} "
                                     "(its bytes changed)")
        return
    recorded = meta.file_hashes()
    if recorded is not None:
        for f, want, got in zip(meta.file, recorded, hashes):
            if want != got:
                raise IntegrityError(f"{source}: file {f!r} has hash {got}, data.txt says {want} "
                                     "(its bytes changed)")
    if hash_matches(meta.pin_hash, paths, hashes) is False:
        listed = ", ".join(repr(f) for f in meta.file[:20]) + (" ..." if len(meta.file) > 20 else "")
        raise IntegrityError(f"{source}: the files hash to something other than pin_hash {meta.pin_hash} "
                             f"in data.txt; one of them changed: {listed}")


def _stat_key(folder: Path, files: list[str]) -> list[list[Any]] | None:
    """Size and mtime of each file; an archive the cache replaced by its extraction (`extract_once`)
    is keyed by its manifest's recorded hash and size (its extracted files are stat-checked where
    they are read, against the manifest)."""
    out: list[list[Any]] = []
    for f in files:
        manifest = read_manifest(folder / EXTRACTED, f)
        if manifest is not None:
            out.append(["extracted", manifest["archive_hash"], manifest["archive_size"]])
            continue
        try:
            st = (folder / f).stat()
        except OSError:
            return None
        out.append([st.st_size, st.st_mtime_ns])
    return out


def stamp_path(folder: Path) -> Path:
    """Where the verification stamp of a cached version folder lives (beside it, hidden)."""
    return folder.parent / f".{folder.name}.verified.json"


def write_stamp(meta: PinMeta, folder: Path, stamp: Path) -> None:
    """Record the size and mtime of files just verified in full, for the cheap check of later reads."""
    key = _stat_key(folder, meta.file)
    if key is None:
        return
    stamp.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tmp_name(stamp))
    tmp.write_text(json.dumps({"pin_hash": meta.pin_hash, "files": meta.file, "stat": key}))
    os.replace(tmp, stamp)


def check_folder(meta: PinMeta, folder: Path, stamp: Path, *, full: bool, source: str) -> None:
    """Verify a version folder: cheaply (size and mtime against the stamp recorded when its bytes
    were last verified in full) unless `full`, or when anything moved since: then in full."""
    if not full:
        try:
            recorded = json.loads(stamp.read_text())
        except (OSError, ValueError):
            recorded = None
        if isinstance(recorded, dict) and recorded.get("pin_hash") == meta.pin_hash \
                and recorded.get("files") == meta.file \
                and recorded.get("stat") == _stat_key(folder, meta.file):
            return
    verify(meta, folder, source=source)
    write_stamp(meta, folder, stamp)


# -- archives extracted in the cache ----------------------------------------------------------
# An archive of a version (e.g. one zip per ImageNet category) is extracted to
# `<version>/_extracted/<archive name less its suffix>/`, in a temporary folder renamed into place,
# and described by `<version>/_extracted/.<that name>.extracted.json`: the archive's name, size and
# recorded hash, and each extracted file's path, size, mtime and xxh64 (hashed as it was written).
# The manifest, written after the rename, is what makes an extraction complete: a folder without one
# (a crash between rename and manifest) is extracted again. Once it is written, an archive that was
# downloaded into the cache is deleted: the cache holds the data once. The version stays verifiable:
# the archive's recorded hash stands in for its bytes in `pin_hash`, and the extracted files are
# checked against the manifest (size and mtime on every read, their xxh64 with `cache=False` or
# when a stat changed).

EXTRACTED = "_extracted"


def archive_stem(file: str) -> str:
    """The folder an archive of a pin is extracted to: its path less the archive suffix, one segment
    (`n01440764.zip` -> `n01440764`, `sub/a.tar.gz` -> `sub_a`)."""
    from .safety.archive import ARCHIVE_SUFFIXES

    name = file.replace("\\", "/")
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    return _safe_segment(name.replace("/", "_"))


def manifest_path(out_root: Path, file: str) -> Path:
    return out_root / f".{archive_stem(file)}.extracted.json"


def read_manifest(out_root: Path, file: str) -> dict[str, Any] | None:
    """The manifest of archive `file` extracted under `out_root`, or None (none, damaged, another archive's)."""
    try:
        m = json.loads(manifest_path(out_root, file).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("archive") != file or not isinstance(m.get("files"), list) \
            or not isinstance(m.get("archive_size"), int) or not isinstance(m.get("archive_hash"), str) \
            or not all(isinstance(e, list) and len(e) == 4 for e in m["files"]):
        return None
    return m


def check_extracted(out_root: Path, file: str, manifest: dict[str, Any], *, source: str, full: bool) -> list[Path]:
    """The extracted files of archive `file`, checked against its manifest: each there, with its recorded
    size and mtime; a file whose stat changed (or every file, with `full`) is hashed and must match its
    recorded xxh64. Raises IntegrityError naming the file otherwise."""
    folder = out_root / archive_stem(file)
    out = []
    for rel, size, mtime, digest in manifest["files"]:
        check_relative(rel, what="extracted file", board=source)  # our own manifest, but still: inside `folder`
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            raise IntegrityError(f"{source}: {rel!r} extracted from {file!r} is missing ({path})") from None
        if full or st.st_size != size or st.st_mtime_ns != mtime:
            if st.st_size != size or hash_file(path) != digest:
                raise IntegrityError(f"{source}: {rel!r} extracted from {file!r} changed since it was extracted "
                                     f"({path})")
        out.append(path)
    return out


def _pin_hash_from(pin_hash: str, hashes: list[str]) -> bool | None:
    """`hash_matches` from the files' xxh64 hashes alone (no bytes to read): None when the writer's
    scheme needs the bytes (R's XXH3-128 of one file) or is unknown."""
    from .meta import joined_hash, r_hash_strings

    pin_hash = (pin_hash or "").lower()
    if len(pin_hash) == 16 and hashes:
        return (hashes[0] if len(hashes) == 1 else joined_hash(hashes)) == pin_hash
    if len(pin_hash) == 32 and len(hashes) > 1:
        return r_hash_strings(hashes) == pin_hash or None
    return None


def extract_once(meta: PinMeta, folder: Path, file: str, out_root: Path, *, limits: Any, drop: bool,
                 source: str) -> list[Path]:
    """The extracted files of archive `file` of a version whose (verified) files are in `folder`.

    Extracted once, under a lock, into `out_root` (see above); later calls check the files against the
    manifest (a stat each) and return them without touching the archive. `drop`: the version folder
    belongs to the cache, so the archive is deleted once its extraction is recorded (when the
    version's `pin_hash` can still be checked from recorded hashes). An archive whose extraction
    changed is extracted again when the archive is still there; otherwise IntegrityError (the caller
    fetches the version again).
    """
    from .safety import archive

    found: list[Path] | None = None
    manifest = read_manifest(out_root, file)
    if manifest is not None:
        try:
            found = check_extracted(out_root, file, manifest, source=source, full=False)
        except IntegrityError:
            if not (folder / file).is_file():
                raise
        else:
            if not (drop and (folder / file).exists()) or manifest.get("keep_archive"):
                return found
    out_root.mkdir(parents=True, exist_ok=True)
    stem = archive_stem(file)
    dest = out_root / stem
    version = out_root.parent  # one lock a version, beside it (nothing but extracted files in `_extracted`)
    with FileLock(str(version.parent / f".{version.name}.extract.lock")):
        manifest = read_manifest(out_root, file)
        found = None
        if manifest is not None:
            with contextlib.suppress(IntegrityError):
                found = check_extracted(out_root, file, manifest, source=source, full=False)
        if found is None:
            # what a killed extraction left: its temporary folder, or a folder renamed but never recorded
            manifest_path(out_root, file).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                for entry in os.scandir(out_root):
                    if entry.name.startswith(f".{stem}.tmp-") and entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True)
            legacy = out_root / Path(file).name  # before 2026-11: `_extracted/<archive file name>/`
            if legacy != dest and legacy.is_dir():
                shutil.rmtree(legacy, ignore_errors=True)
            digests: dict[str, str] = {}
            files = archive.extract(folder / file, dest, limits=limits, digests=digests)
            recorded = meta.file_hashes()
            index = meta.file.index(file)
            size = (folder / file).stat().st_size
            manifest = {"archive": file, "archive_size": size,
                        "archive_hash": recorded[index] if recorded else hash_file(folder / file),
                        "pin_hash": meta.pin_hash, "files": []}
            for path in files:
                rel = path.relative_to(dest).as_posix()
                st = path.stat()
                manifest["files"].append([rel, st.st_size, st.st_mtime_ns, digests.get(rel) or hash_file(path)])
            _write_json(manifest_path(out_root, file), manifest)
            found = files
        if drop and manifest is not None and (folder / file).exists() and not manifest.get("keep_archive") \
                and _droppable(meta, folder, file):
            stamp = stamp_path(folder)
            write_stamp(meta, folder, stamp)  # keyed by the manifest from now on: then the archive can go
            (folder / file).unlink(missing_ok=True)
    return found


def restore_archive(meta: PinMeta, folder: Path, file: str, download: Callable[[str, Path], None], *,
                    source: str) -> None:
    """Put back archive `file` of a version kept extracted (someone asks for the archive itself):
    `download(file, dest)` fetches it, it must match the size and hash recorded when it was extracted,
    and it is kept from then on beside its extraction (asked for both, the cache keeps both). The
    extracted files are left alone: a reader of them is never disturbed."""
    out_root = folder / EXTRACTED
    with FileLock(str(folder.parent / f".{folder.name}.extract.lock")):
        manifest = read_manifest(out_root, file)
        target = contained(folder, file, what="file", board=source)
        if target.exists() or manifest is None:
            return
        require_room(folder, manifest["archive_size"], what=f"downloading {file!r} of {source} again")
        tmp = Path(tmp_name(folder.with_name(f".{folder.name}.restore")))  # swept if this process dies
        try:
            download(file, tmp)
            if tmp.stat().st_size != manifest["archive_size"] or hash_file(tmp) != manifest["archive_hash"]:
                raise IntegrityError(f"{source}: {file!r} downloaded again differs from the one extracted "
                                     "(its size or hash)")
            _write_json(manifest_path(out_root, file), {**manifest, "keep_archive": True})
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def _droppable(meta: PinMeta, folder: Path, file: str) -> bool:
    """Whether the version stays verifiable without the archive's bytes: pin_hash computable from the
    recorded hashes of the replaced archives and the other files' hashes."""
    if meta.api_version == 0:
        return False  # a legacy pin: no hash to check the extraction's origin against later
    hashes = []
    recorded = meta.file_hashes()
    for i, f in enumerate(meta.file):
        m = read_manifest(folder / EXTRACTED, f)
        if m is not None:
            hashes.append(m["archive_hash"])
        elif recorded is not None:
            hashes.append(recorded[i])
        else:
            hashes.append(hash_file(folder / f))
    return _pin_hash_from(meta.pin_hash, hashes) is True


class Cache:
    """A cache folder. Cheap to create; safe to share between processes and threads.

    Args:
        root: The folder (None: ``$PINSTORM_CACHE``, ``$PINS_CACHE_DIR``, else the user cache folder).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None):
        self.root = Path(root).expanduser().resolve() if root else default_cache_root()

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    # -- immutable versions -------------------------------------------------------------------
    def version_dir(self, board: str, name: str, version: str) -> Path:
        """The folder a version of a pin is cached in.

        Args:
            board: The board's name.
            name: The pin's name.
            version: The version's name.
        """
        return self.root / _safe_segment(board) / _safe_segment(name) / _safe_segment(version)

    def board_stamp(self, board: str, name: str, version: str) -> Path:
        """The verification stamp of a version a board keeps on local disk (kept here, beside the
        cached versions: the board's own folder may be read-only or shared).

        Args:
            board: The board's name.
            name: The pin's name.
            version: The version's name.
        """
        folder = self.version_dir(board, name, version)  # safe names, inside the cache
        return folder.parent / f".{folder.name}.board-verified.json"

    def cached_versions(self, board: str, name: str) -> list[str]:
        """The versions of a pin in the cache (those whose data.txt is there).

        Args:
            board: The board's name.
            name: The pin's name.
        """
        folder = self.root / _safe_segment(board) / _safe_segment(name)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and (p / "data.txt").is_file())

    def fetch_version(self, board: str, name: str, meta: PinMeta,
                      download: Callable[[str, Path, int], None]) -> Path:
        """The cached folder of an immutable version, downloading it once if absent.

        `download(file_name, dest_path, offset)` copies one file of the version from the board,
        appending from byte `offset` of the file (0: the whole file). Files go to a resumable
        `.<version>.partial` folder that outlives a crash or a dropped connection: the next fetch
        (under the same lock) keeps the files already there and resumes the one cut short, then
        verifies every byte once. The free space is checked against the declared sizes first.

        Args:
            board: The board's name.
            name: The pin's name.
            meta: The version's data.txt (its files, sizes and hashes).
            download: ``download(file_name, dest_path, offset)``, as above.

        Returns:
            The version's cached folder.
        """
        dest = self.version_dir(board, name, meta.version or meta.version_name)
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            if dest.is_dir():  # another process finished while we waited
                return dest
            sweep(dest.parent)  # what killed writers left behind
            partial = dest.with_name(f".{dest.name}{PARTIAL}")
            _drop_stale_partials(dest.parent, keep=partial)
            source = f"pin {name!r} version {meta.version} on board {board!r}"
            sizes = dict(zip(meta.file, meta.file_size)) if meta.file_size else {}
            targets = {f: contained(partial, f, pin=name, board=board) for f in meta.file}  # names from metadata
            have = {f: _size_or_zero(t) for f, t in targets.items()}
            require_room(dest.parent, sum(max(0, int(sizes.get(f) or 0) - have[f]) for f in meta.file),
                         what=f"downloading {source}")
            for attempt in range(2):
                resumed = False
                for f, target in targets.items():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    want, got = sizes.get(f), _size_or_zero(target)
                    if want is not None and got == want:
                        continue  # whole already (verified below, with the rest)
                    if want is None or got > want:
                        got = 0
                    resumed = resumed or got > 0
                    download(f, target, got)
                try:
                    verify(meta, partial, source=source)
                    break
                except IntegrityError:
                    shutil.rmtree(partial, ignore_errors=True)  # never resume onto bytes that failed
                    if attempt or not (resumed or any(have.values())):
                        raise
            (partial / "data.txt").write_text(meta.to_yaml())
            os.replace(partial, dest)
            write_stamp(meta, dest, stamp_path(dest))
        return dest

    # -- mutable URLs -------------------------------------------------------------------------
    def url_path(self, board: str, url: str) -> Path:
        """Where the bytes of mutable `url` are cached: a readable tail of the URL plus a hash of the
        whole URL, so two URLs never share a file (`a?x=1` vs `a?x=2`, `a/b` vs `a_b`) and no URL
        can name a path outside `<root>/<board>/_urls/`. Credentials in the URL (`user:password@`,
        `?token=`) are left out of both: a file name is no place for a secret, not even hashed.

        Args:
            board: The board's name.
            url: The URL.
        """
        url = secrets.strip_url(url)
        tail = _safe_segment(url.split("://", 1)[-1].split("?", 1)[0])[-100:].lstrip(".") or "_"
        digest = xxhash.xxh64(url.encode()).hexdigest()[:12]
        return self.root / _safe_segment(board) / "_urls" / f"{digest}-{tail}"

    def fetch_url(self, url: str, dest: Path, *, session: requests.Session | None = None,
                  headers: dict[str, Any] | None = None, progress: Callable[[int], None] | None = None,
                  offline: bool = False, max_bytes: int | None = None,
                  limits: TransferLimits | None = None) -> Path:
        """`dest` holding the bytes at `url`, revalidated with ETag / max-age as R legacy pins did.

        `Cache-Control: no-cache` (or max-age=0) makes every call revalidate; `no-store` keeps no
        validators, so the next call downloads again and an unreachable server is an error, not a
        stale copy. A body over `max_bytes` (else over the disk's free space) raises LimitExceeded and
        leaves nothing behind; a body slower than `limits` allow raises DownloadError. Messages and
        `.http.json` show the URL without its credentials.

        Args:
            url: The http(s) URL.
            dest: The cached file (`url_path`).
            session: The ``requests`` session to use (None: a new one).
            headers: Sent with the request (to `url`'s origin only).
            progress: Called with each block's size in bytes.
            offline: Use the cached copy without revalidating (an error when there is none).
            max_bytes: The largest body accepted (None: the disk's free space).
            limits: Bounds on the transfer's time and rate (None: the defaults).

        Returns:
            `dest`.
        """
        shown = secrets.strip_url(url)
        info_path = dest.with_name(dest.name + ".http.json")
        try:
            info = json.loads(info_path.read_text()) if dest.is_file() else None
        except (OSError, ValueError):  # none yet, or damaged: download again
            info = None
        if not isinstance(info, dict):
            info = None
        if info and (offline or time.time() - info.get("fetched_at", 0) < info.get("max_age", 0)):
            return dest
        if offline:
            raise DownloadError(f"{shown} is not in the cache and download=False", url=shown)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            request_headers = dict(headers or {})
            if info and info.get("etag"):
                request_headers["If-None-Match"] = info["etag"]
            if info and info.get("last_modified"):
                request_headers["If-Modified-Since"] = info["last_modified"]
            http = session or requests
            try:
                response = http.get(url, headers=request_headers, stream=True, timeout=HTTP_TIMEOUT)
            except requests.RequestException as e:
                return self._stale_or_raise(dest, info, shown,
                                            f"cannot reach {shown}: {secrets.redact_text(str(e))}")
            with response:
                directives = _cache_control(response.headers)
                if response.status_code == 304 and info:
                    info.update(fetched_at=time.time(), max_age=_max_age(directives))
                    _write_json(info_path, info)
                    return dest
                if response.status_code >= 500:
                    return self._stale_or_raise(dest, info, shown, f"HTTP {response.status_code} from {shown}",
                                                status=response.status_code)
                if response.status_code >= 400:
                    raise DownloadError(f"HTTP {response.status_code} {response.reason} from {shown}",
                                        url=shown, status=response.status_code)
                expected = response.headers.get("Content-Length")
                tmp = Path(tmp_name(dest.with_name("." + dest.name)))
                try:
                    received = _stream_to(response, tmp, shown, progress, cap=max_bytes, limits=limits)
                    if expected is not None and expected.isdigit() and "Content-Encoding" not in response.headers \
                            and int(expected) != received:
                        raise DownloadError(f"truncated body from {shown}: {received} of {expected} bytes",
                                            url=shown)
                    os.replace(tmp, dest)
                finally:
                    tmp.unlink(missing_ok=True)
                if "no-store" in directives:  # keep the bytes for this call only: no validators
                    info_path.unlink(missing_ok=True)
                    return dest
                _write_json(info_path, {
                    "url": shown, "etag": response.headers.get("ETag"),
                    "last_modified": response.headers.get("Last-Modified"),
                    "max_age": _max_age(directives), "fetched_at": time.time(),
                })
        return dest

    @staticmethod
    def _stale_or_raise(dest: Path, info: dict[str, Any] | None, url: str, why: str, status: int | None = None) -> Path:
        if info is not None:
            warnings.warn(f"{why}; serving the cached copy from "
                          f"{email.utils.formatdate(info.get('fetched_at', 0), usegmt=True)}",
                          StaleCacheWarning, stacklevel=3)
            return dest
        raise DownloadError(why, url=url, status=status)


@dataclass(frozen=True)
class TransferLimits:
    """How long one HTTP body may take, overall: `deadline` seconds plus one second per `min_rate`
    bytes (of the declared size, or of what arrived when no size is declared). The per-read
    timeout alone lets a server that trickles a byte a minute hold a client forever."""

    deadline: float = HTTP_DEADLINE
    min_rate: float = HTTP_MIN_RATE

    def __post_init__(self) -> None:
        if not (self.deadline > 0 and self.min_rate > 0):
            raise BoardError(f"transfer limits must be positive: deadline={self.deadline!r} s, "
                             f"min_rate={self.min_rate!r} bytes/s")

    def seconds(self, size: int) -> float:
        return self.deadline + size / self.min_rate


def declared_cap(size: int) -> int:
    """The most bytes accepted for a file whose metadata declares `size` (a little slack, so a size
    that is slightly off is reported by the size check, naming both numbers)."""
    return size + max(SIZE_SLACK, size // 100)


def _interrupt(response: requests.Response) -> None:
    """Wake a read blocked on `response`'s socket (the overall deadline passed): shut the socket down,
    which ends the read at once; closing the response from this thread would race the reader.
    http.client hands the socket of a closing connection to the response, hence two places to look."""
    raw = response.raw
    sock = getattr(getattr(raw, "connection", None), "sock", None)
    if sock is None:
        sock = getattr(getattr(getattr(getattr(raw, "_fp", None), "fp", None), "raw", None), "_sock", None)
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)


def bounded_blocks(response: requests.Response, url: str, *, what: str = "", size: int | None = None,
                   cap: int | None = None, limits: TransferLimits | None = None,
                   chunk: int = _CHUNK) -> Iterator[bytes]:
    """The body of `response`, block by block, stopped at the declared `size` (plus slack) or `cap`,
    and at the overall deadline (`limits`), with errors naming `what` (pin, file) and `url`.

    A watchdog shuts the socket when the deadline passes, so a stalled read ends then and not one
    per-read timeout later.
    """
    limits = limits or TransferLimits()
    label = f"{what}: " if what else ""
    length = response.headers.get("Content-Length", "")
    known = size if size is not None else (int(length) if length.isdigit() else None)
    caps = [c for c in (declared_cap(size) if size is not None else None, cap) if c is not None]
    most = min(caps) if caps else None
    if most is not None and length.isdigit() and "Content-Encoding" not in response.headers \
            and int(length) > most:
        raise LimitExceeded(f"{label}{url} announces {int(length):,} bytes, more than the {most:,} accepted "
                            f"({_why_cap(size, cap)})")
    start = time.monotonic()
    received = 0
    stop = threading.Event()
    expired = threading.Event()

    def allowed() -> float:
        return limits.seconds(max(known or 0, received))

    def watch() -> None:
        while not stop.wait(min(60.0, max(0.0, start + allowed() - time.monotonic()) + 0.01)):
            if time.monotonic() - start > allowed():
                expired.set()
                _interrupt(response)
                return

    dog = threading.Thread(target=watch, name="pinstorm-transfer-deadline", daemon=True)
    dog.start()

    def late(e: BaseException | None = None) -> DownloadError:
        return DownloadError(f"{label}{url} did not finish within {allowed():.1f} s (deadline {limits.deadline:g} s "
                             f"+ size / {limits.min_rate:,.0f} B/s; PINSTORM_HTTP_DEADLINE, PINSTORM_HTTP_MIN_RATE): "
                             f"{received:,} of {known if known is not None else 'an undeclared number of'} bytes "
                             "arrived", url=url)

    try:
        try:
            for block in response.iter_content(chunk):
                received += len(block)
                if most is not None and received > most:
                    raise LimitExceeded(f"{label}{url} sent more than the {most:,} bytes accepted "
                                        f"({_why_cap(size, cap)}); stopped at {received:,}")
                if expired.is_set() or time.monotonic() - start > allowed():
                    raise late()
                yield block
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
            if isinstance(e, BoardError):
                raise
            if expired.is_set():
                raise late(e) from e
            raise DownloadError(f"{label}transfer from {url} broke off after {received:,} bytes: {e}", url=url) from e
        if expired.is_set():
            raise late()
    finally:
        stop.set()


def _why_cap(size: int | None, cap: int | None) -> str:
    if size is not None and (cap is None or declared_cap(size) <= cap):
        return f"the metadata declares {size:,} bytes, plus slack"
    return f"the {cap}-byte cap"


def _stream_to(response: requests.Response, tmp: Path, url: str, progress: Callable[[int], None] | None, *,
               what: str = "",
               size: int | None = None, cap: int | None = None, limits: TransferLimits | None = None,
               append: bool = False) -> int:
    """Write a bounded body (`bounded_blocks`) to `tmp`; an undeclared size is also bounded by the
    free space of the disk, so an endless body ends in a clear error, not a bare ENOSPC."""
    received = 0
    free, reserve = _free_space(tmp.parent)
    disk_bound = free is not None and size is None and (cap is None or free - reserve < cap)
    if disk_bound and free is not None:
        cap = max(0, free - reserve)
    try:
        with open(tmp, "ab" if append else "wb") as out:  # append: resuming after a partial download
            for block in bounded_blocks(response, url, what=what, size=size, cap=cap, limits=limits):
                out.write(block)
                received += len(block)
                if progress:
                    progress(len(block))
    except LimitExceeded as e:
        if disk_bound:
            raise LimitExceeded(f"{e}: the disk of {tmp.parent} had {free:,} bytes free "
                                f"(keeping {reserve:,} in reserve)") from None
        raise
    except OSError as e:
        if isinstance(e, BoardError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise BoardError(f"{what + ': ' if what else ''}no space left on the cache disk writing {tmp} "
                         f"from {url} after {received:,} bytes ({_free_space(tmp.parent)[0] or 0:,} bytes free)") from e
    return received


def _free_space(folder: Path) -> tuple[int | None, int]:
    """(free bytes on the disk of `folder`, the reserve an undeclared download leaves: 16 MiB, or
    5% of a small disk)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return None, 0
    return usage.free, min(DISK_RESERVE, usage.total // 20)


def _cache_control(headers: Any) -> dict[str, str | None]:
    """The Cache-Control directives of a response, lower-cased: {"max-age": "60", "no-cache": None}."""
    out: dict[str, str | None] = {}
    for part in (headers.get("Cache-Control") or "").split(","):
        key, _, value = part.strip().partition("=")
        if key:
            out[key.lower()] = value.strip('"') or None
    return out


def _max_age(directives: dict[str, str | None]) -> float:
    """Seconds a response may be reused without asking: 0 under no-cache / no-store."""
    if "no-cache" in directives or "no-store" in directives:
        return 0.0
    value = directives.get("max-age") or ""
    return float(value) if value.isdigit() else 0.0


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


PARTIAL = ".partial"  # suffix of a version folder whose download may be resumed


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _drop_stale_partials(folder: Path, keep: Path, older_than: float = FOREIGN_MAX_AGE) -> None:
    """Other partial downloads nobody resumed for a day are garbage: remove them (not `keep`, the one
    about to be resumed, however old)."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(".") and entry.name.endswith(PARTIAL) and entry.name != keep.name \
                    and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    if now - max(_mtimes(Path(entry.path))) > older_than:
                        shutil.rmtree(entry.path, ignore_errors=True)


def _mtimes(folder: Path) -> list[float]:
    return [folder.stat().st_mtime] + [p.stat().st_mtime for p in folder.rglob("*")]


__all__ = ["Cache", "EXTRACTED", "StaleCacheWarning", "check_folder", "default_cache_root", "extract_once",
           "restore_archive", "stamp_path", "verify", "hash_files", "write_stamp"]

