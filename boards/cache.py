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
from filelock import FileLock

from .errors import DownloadError, IntegrityError
from .meta import PinMeta, hash_file, hash_files

ENV_CACHE = "PINSTORM_CACHE"
HTTP_TIMEOUT = float(os.environ.get("PINSTORM_HTTP_TIMEOUT", "60"))
_CHUNK = 1 << 20


class StaleCacheWarning(UserWarning):
    """A cached copy was served because the source could not be reached."""


def default_cache_root() -> Path:
    return Path(os.environ.get(ENV_CACHE) or platformdirs.user_cache_dir("pinstorm"))


def _safe_segment(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def verify(meta: PinMeta, folder: Path, *, source: str) -> None:
    """Raise IntegrityError unless the files in `folder` match the sizes (and our hash) in `meta`."""
    paths = [folder / f for f in meta.file]
    for path, size in zip(paths, meta.file_size or [None] * len(paths)):
        if not path.is_file():
            raise IntegrityError(f"{source}: file {path.name!r} listed in data.txt is missing")
        if size is not None and path.stat().st_size != size:
            raise IntegrityError(f"{source}: {path.name!r} has {path.stat().st_size} bytes, data.txt says {size}"
                                 " (truncated or changed transfer)")
    # R pins hash with xxh128 (32 hex); only a 16-hex xxh64 hash can be recomputed to the same value.
    if len(meta.pin_hash) == 16 and len(paths) == 1:
        actual = hash_file(paths[0])
        if actual != meta.pin_hash:
            raise IntegrityError(f"{source}: hash {actual} differs from pin_hash {meta.pin_hash} in data.txt")


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
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))

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
            tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
            tmp.mkdir()
            try:
                for f in meta.file:
                    target = tmp / f
                    target.parent.mkdir(parents=True, exist_ok=True)
                    download(f, target)
                verify(meta, tmp, source=f"pin {name!r} version {meta.version} on board {board!r}")
                (tmp / "data.txt").write_text(meta.to_yaml())
                os.replace(tmp, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

    # -- mutable URLs -------------------------------------------------------------------------
    def url_path(self, board: str, url: str) -> Path:
        tail = _safe_segment(url.split("://", 1)[-1].split("?", 1)[0])[-150:]
        return self.root / _safe_segment(board) / "_urls" / tail

    def fetch_url(self, url: str, dest: Path, *, session: requests.Session | None = None,
                  headers: dict | None = None, progress: Callable[[int], None] | None = None,
                  offline: bool = False) -> Path:
        """`dest` holding the bytes at `url`, revalidated with ETag / max-age as R legacy pins did."""
        info_path = dest.with_name(dest.name + ".http.json")
        info = json.loads(info_path.read_text()) if info_path.is_file() and dest.is_file() else None
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
                if response.status_code == 304 and info:
                    info.update(fetched_at=time.time(), max_age=_max_age(response.headers))
                    _write_json(info_path, info)
                    return dest
                if response.status_code >= 500:
                    return self._stale_or_raise(dest, info, url, f"HTTP {response.status_code} from {url}",
                                                status=response.status_code)
                if response.status_code >= 400:
                    raise DownloadError(f"HTTP {response.status_code} {response.reason} from {url}",
                                        url=url, status=response.status_code)
                tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
                try:
                    received = _stream_to(response, tmp, url, progress)
                    expected = response.headers.get("Content-Length")
                    if expected is not None and "Content-Encoding" not in response.headers \
                            and int(expected) != received:
                        raise DownloadError(f"truncated body from {url}: {received} of {expected} bytes",
                                            url=url)
                    os.replace(tmp, dest)
                finally:
                    tmp.unlink(missing_ok=True)
                _write_json(info_path, {
                    "url": url, "etag": response.headers.get("ETag"),
                    "last_modified": response.headers.get("Last-Modified"),
                    "max_age": _max_age(response.headers), "fetched_at": time.time(),
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


def _max_age(headers) -> float:
    m = re.search(r"max-age=(\d+)", headers.get("Cache-Control", "") or "")
    return float(m.group(1)) if m else 0.0


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


__all__ = ["Cache", "StaleCacheWarning", "default_cache_root", "verify", "hash_files"]
