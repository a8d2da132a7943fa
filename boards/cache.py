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

import email.utils
import json
import os
import re
import shutil
import time
import uuid
import warnings
from pathlib import Path
from typing import Callable

import platformdirs
import requests
import xxhash
from filelock import FileLock

from .errors import DownloadError, IntegrityError, LimitExceeded
from .meta import PinMeta, hash_file, hash_files, hash_matches
from .paths import contained
from .tempnames import sweep, tmp_name

ENV_CACHE = "PINSTORM_CACHE"
HTTP_TIMEOUT = float(os.environ.get("PINSTORM_HTTP_TIMEOUT", "60"))
_CHUNK = 1 << 20


class StaleCacheWarning(UserWarning):
    """A cached copy was served because the source could not be reached."""


def default_cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE) or platformdirs.user_cache_dir("pinstorm"))


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
    for path, f, size in zip(paths, meta.file, meta.file_size or [None] * len(paths)):
        if not path.is_file():
            raise IntegrityError(f"{source}: file {f!r} listed in data.txt is missing")
        actual = path.stat().st_size
        if size is not None and actual != size:
            raise IntegrityError(f"{source}: {f!r} has {actual} bytes, data.txt says {size}"
                                 " (truncated or changed)")
    if not full or meta.api_version == 0:
        return
    hashes = [hash_file(p) for p in paths]
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


def _stat_key(paths: list[Path]) -> list[list[int]] | None:
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            return None
        out.append([st.st_size, st.st_mtime_ns])
    return out


def stamp_path(folder: Path) -> Path:
    """Where the verification stamp of a cached version folder lives (beside it, hidden)."""
    return folder.parent / f".{folder.name}.verified.json"


def write_stamp(meta: PinMeta, folder: Path, stamp: Path) -> None:
    """Record the size and mtime of files just verified in full, for the cheap check of later reads."""
    key = _stat_key([folder / f for f in meta.file])
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
                and recorded.get("stat") == _stat_key([folder / f for f in meta.file]):
            return
    verify(meta, folder, source=source)
    write_stamp(meta, folder, stamp)


class Cache:
    """A cache folder. Cheap to create; safe to share between processes and threads."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root).expanduser().resolve() if root else default_cache_root()

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r})"

    # -- immutable versions -------------------------------------------------------------------
    def version_dir(self, board: str, name: str, version: str) -> Path:
        return self.root / _safe_segment(board) / _safe_segment(name) / _safe_segment(version)

    def cached_versions(self, board: str, name: str) -> list[str]:
        folder = self.root / _safe_segment(board) / _safe_segment(name)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and (p / "data.txt").is_file())

    def fetch_version(self, board: str, name: str, meta: PinMeta,
                      download: Callable[[str, Path], None]) -> Path:
        """The cached folder of an immutable version, downloading it once if absent.

        `download(file_name, dest_path)` copies one file of the version from the board.
        """
        dest = self.version_dir(board, name, meta.version or meta.version_name)
        if dest.is_dir():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(dest) + ".lock"):
            if dest.is_dir():  # another process finished while we waited
                return dest
            sweep(dest.parent)  # what killed downloads left behind
            tmp = Path(tmp_name(dest.with_name("." + dest.name)))
            tmp.mkdir()
            try:
                for f in meta.file:
                    target = contained(tmp, f, pin=name, board=board)  # names come from metadata
                    target.parent.mkdir(parents=True, exist_ok=True)
                    download(f, target)
                verify(meta, tmp, source=f"pin {name!r} version {meta.version} on board {board!r}")
                (tmp / "data.txt").write_text(meta.to_yaml())
                os.replace(tmp, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            write_stamp(meta, dest, stamp_path(dest))
        return dest

    # -- mutable URLs -------------------------------------------------------------------------
    def url_path(self, board: str, url: str) -> Path:
        """Where the bytes of mutable `url` are cached: a readable tail of the URL plus a hash of the
        whole URL, so two URLs never share a file (`a?x=1` vs `a?x=2`, `a/b` vs `a_b`) and no URL
        can name a path outside `<root>/<board>/_urls/`."""
        tail = _safe_segment(url.split("://", 1)[-1].split("?", 1)[0])[-100:].lstrip(".") or "_"
        digest = xxhash.xxh64(url.encode()).hexdigest()[:12]
        return self.root / _safe_segment(board) / "_urls" / f"{digest}-{tail}"

    def fetch_url(self, url: str, dest: Path, *, session: requests.Session | None = None,
                  headers: dict | None = None, progress: Callable[[int], None] | None = None,
                  offline: bool = False, max_bytes: int | None = None) -> Path:
        """`dest` holding the bytes at `url`, revalidated with ETag / max-age as R legacy pins did.

        `Cache-Control: no-cache` (or max-age=0) makes every call revalidate; `no-store` keeps no
        validators, so the next call downloads again and an unreachable server is an error, not a
        stale copy. A body over `max_bytes` raises LimitExceeded and leaves nothing behind.
        """
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
            raise DownloadError(f"{url} is not in the cache and download=False", url=url)
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
                return self._stale_or_raise(dest, info, url, f"cannot reach {url}: {e}")
            with response:
                directives = _cache_control(response.headers)
                if response.status_code == 304 and info:
                    info.update(fetched_at=time.time(), max_age=_max_age(directives))
                    _write_json(info_path, info)
                    return dest
                if response.status_code >= 500:
                    return self._stale_or_raise(dest, info, url, f"HTTP {response.status_code} from {url}",
                                                status=response.status_code)
                if response.status_code >= 400:
                    raise DownloadError(f"HTTP {response.status_code} {response.reason} from {url}",
                                        url=url, status=response.status_code)
                expected = response.headers.get("Content-Length")
                if max_bytes is not None and expected is not None and expected.isdigit() \
                        and int(expected) > max_bytes:
                    raise LimitExceeded(f"{url}: {expected} bytes, more than the {max_bytes}-byte cap")
                tmp = Path(tmp_name(dest.with_name("." + dest.name)))
                try:
                    received = _stream_to(response, tmp, url, _capped(progress, max_bytes, url))
                    if expected is not None and "Content-Encoding" not in response.headers \
                            and int(expected) != received:
                        raise DownloadError(f"truncated body from {url}: {received} of {expected} bytes",
                                            url=url)
                    os.replace(tmp, dest)
                finally:
                    tmp.unlink(missing_ok=True)
                if "no-store" in directives:  # keep the bytes for this call only: no validators
                    info_path.unlink(missing_ok=True)
                    return dest
                _write_json(info_path, {
                    "url": url, "etag": response.headers.get("ETag"),
                    "last_modified": response.headers.get("Last-Modified"),
                    "max_age": _max_age(directives), "fetched_at": time.time(),
                })
        return dest

    @staticmethod
    def _stale_or_raise(dest: Path, info: dict | None, url: str, why: str, status: int | None = None) -> Path:
        if info is not None:
            warnings.warn(f"{why}; serving the cached copy from "
                          f"{email.utils.formatdate(info.get('fetched_at', 0), usegmt=True)}",
                          StaleCacheWarning, stacklevel=3)
            return dest
        raise DownloadError(why, url=url, status=status)


def _stream_to(response: requests.Response, tmp: Path, url: str, progress) -> int:
    received = 0
    try:
        with open(tmp, "wb") as out:
            for block in response.iter_content(_CHUNK):
                out.write(block)
                received += len(block)
                if progress:
                    progress(len(block))
    except requests.RequestException as e:
        raise DownloadError(f"transfer from {url} broke off after {received} bytes: {e}", url=url) from e
    return received


def _cache_control(headers) -> dict[str, str | None]:
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


def _capped(progress: Callable[[int], None] | None, max_bytes: int | None, url: str):
    """A progress callback that also stops a body at `max_bytes` (LimitExceeded)."""
    if max_bytes is None:
        return progress
    seen = [0]

    def advance(n: int) -> None:
        seen[0] += n
        if seen[0] > max_bytes:
            raise LimitExceeded(f"{url}: more than the {max_bytes}-byte cap")
        if progress:
            progress(n)

    return advance


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


__all__ = ["Cache", "StaleCacheWarning", "check_folder", "default_cache_root", "stamp_path", "verify",
           "hash_files", "write_stamp"]
