"""The read-only board behind a URL with a `data.txt` index (R legacy pins' "datatxt" board).

Any static web server or public bucket holding a board folder is such a board. The index and the
files of legacy R pins can change at any time, so they are revalidated with ETag / max-age (see
`cache.py`); pins 1.x versions never change, so once cached they are served without a request.

Whoever serves the board controls everything in it, so nothing it says is trusted (see
docs/boards.md, "Security model"): file and version names must stay inside their cache folder
(`paths.py`), URLs must be http(s) on the board's own origin unless `allow_external=` says
otherwise, metadata is capped at `max_index_bytes` and parsed with a loader that evaluates no tag
and refuses alias bombs, and archives extract within the board's limits.

One HTTP client policy: every request goes through one `requests.Session` (connection pool sized for
parallel fetches, `PINSTORM_HTTP_TIMEOUT` timeout, two retries on refused connections and 502/503/504
with no Retry-After sleeps, the board's headers sent to its own origin only).

Revalidation stays hand-written (`Cache.fetch_url`, ~60 lines) rather than CacheControl: CacheControl
keeps a response body inside its own serialised cache entry, so a cached file is not a plain file at
a stable path that `pin_get` can return (a second copy on disk is needed), and it buffers whole bodies
in memory. Measured with cachecontrol 0.14.4 + FileCache on a 64 MiB file from 127.0.0.1, two
fetches (cold, then revalidated): peak RSS +133 MiB and 5.3 s, against +0 MiB and 0.38 s for
`fetch_url` (2-core machine, 2026-11). We need only ETag / Last-Modified / max-age /
no-cache / no-store, which `fetch_url` honours.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import threading
import time
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from . import index as board_index
from . import paths
from .board import Board
from .cache import HTTP_TIMEOUT, Cache, _stream_to
from .errors import DownloadError, LimitExceeded, MalformedMetadata, PinNotFound, UnsafePath
from .legacy_view import pin_folder
from .meta import PinMeta, parse_version
from .tempnames import tmp_name

LEGACY = "legacy"  # the one pseudo-version of a legacy (unversioned) pin
POOL_SIZE = 32  # connections kept per host: pin_get_many runs up to 16 threads on one board


def http_session() -> requests.Session:
    """The one HTTP client of a data.txt board: pooled, with bounded retries and no long sleeps."""
    session = requests.Session()
    retry = Retry(total=2, connect=2, read=0, status=2, other=0, backoff_factor=0.1,
                  status_forcelist=(502, 503, 504), allowed_methods=("GET", "HEAD"),
                  raise_on_status=False, respect_retry_after_header=False)
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE, max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class DatatxtBoard(Board):
    kind = "datatxt"
    read_only = True

    def __init__(self, name: str, url: str, *, cache: str | Path | Cache | None = None, versions: bool = True,
                 headers: dict | None = None, index_max_age: float = 0,
                 allow_external: bool | list[str] = False, max_index_bytes: int = board_index.MAX_INDEX_BYTES,
                 max_extract_bytes: int | None = None, max_extract_ratio: float | None = None):
        """`index_max_age`: seconds to trust the index without asking the server (beyond the
        server's own Cache-Control max-age); raise it when many `pin_get` calls hit one board.
        `allow_external`: follow index paths that are absolute URLs on other hosts (R legacy boards
        wrote some): True for any http(s) origin, or a list of origins such as
        ["https://cdn.example.org"]. `max_index_bytes`: the cap on a data.txt (index or version).
        `max_extract_bytes` / `max_extract_ratio`: this board's archive extraction bounds."""
        super().__init__(name, cache=cache, versions=versions, max_extract_bytes=max_extract_bytes,
                         max_extract_ratio=max_extract_ratio)
        self.index_max_age = float(index_max_age)
        self._checked_at = float("-inf")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise DownloadError(f"datatxt board {name!r}: url must be http(s)://..., got {url!r}", url=url)
        url = url.rstrip("/")
        self.url = url[: -len("/data.txt")] if url.endswith("/data.txt") else url
        if isinstance(allow_external, str):
            allow_external = [allow_external]
        self.allow_external = allow_external if isinstance(allow_external, bool) else list(allow_external)
        self.max_index_bytes = int(max_index_bytes)
        self.headers = dict(headers or {})
        self.session = http_session()
        self._parsed: tuple[Any, list[dict]] | None = None
        self._within = threading.local()  # per thread: the pin whose fetch already revalidated the index

    def describe(self) -> str:
        return self.url

    def __getstate__(self) -> dict:  # picklable for process pools: a fresh session on the other side
        state = dict(self.__dict__)
        state["session"] = state["_within"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.session = http_session()
        self._within = threading.local()

    # ---- URLs and requests ----------------------------------------------------------------
    def _abs(self, path: str, *, pin: str | None = None) -> str:
        """An index or metadata path as a URL this board may follow (see `paths.resolve_url`)."""
        return paths.resolve_url(self.url, path, allow=self.allow_external, pin=pin, board=self.url)

    def _headers_for(self, url: str) -> dict:
        """The board's headers (credentials, perhaps) go to its own origin only."""
        return self.headers if paths.origin(url) == paths.origin(self.url) else {}

    def _request(self, url: str) -> requests.Response:
        try:
            r = self.session.get(url, headers=self._headers_for(url), stream=True, timeout=HTTP_TIMEOUT)
        except requests.RequestException as e:
            raise DownloadError(f"cannot reach {url}: {e}", url=url) from e
        if r.status_code >= 400:
            r.close()
            raise DownloadError(f"HTTP {r.status_code} {r.reason} from {url}", url=url, status=r.status_code)
        return r

    def _get(self, url: str) -> bytes:
        """A small document (a version's data.txt), at most `max_index_bytes`."""
        with self._request(url) as r:
            body = bytearray()
            try:
                for block in r.iter_content(1 << 16):
                    body += block
                    if len(body) > self.max_index_bytes:
                        raise LimitExceeded(f"{url}: more than the {self.max_index_bytes}-byte cap on metadata "
                                            f"(max_index_bytes=) of board {self.name!r}")
            except requests.RequestException as e:
                raise DownloadError(f"transfer from {url} broke off: {e}", url=url) from e
        return bytes(body)

    def _download(self, url: str, dest: Path) -> None:
        """Stream `url` into `dest`, refusing a body shorter than its Content-Length."""
        with self._request(url) as r:
            received = _stream_to(r, dest, url, None)
            expected = r.headers.get("Content-Length")
            if expected is not None and "Content-Encoding" not in r.headers and int(expected) != received:
                raise DownloadError(f"truncated body from {url}: {received} of {expected} bytes", url=url)

    def _fetch_url(self, url: str, dest: Path, *, max_bytes: int | None = None) -> Path:
        return self.cache.fetch_url(url, dest, session=self.session, headers=self._headers_for(url),
                                    max_bytes=max_bytes)

    # ---- index ----------------------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        if self._parsed is not None and time.monotonic() - self._checked_at < self.index_max_age:
            return self._parsed[1]
        source = f"{self.url}/data.txt"
        local = self._fetch_url(source, self.cache.url_path(self.name, source), max_bytes=self.max_index_bytes)
        stat = local.stat()
        key = [stat.st_size, stat.st_mtime_ns]
        if self._parsed is None or self._parsed[0] != key:
            self._parsed = (key, _parse_cached(local, key, source, self.max_index_bytes))
        self._checked_at = time.monotonic()
        return self._parsed[1]

    def _entry(self, name: str, *, revalidate: bool = True) -> dict:
        """The index entry of `name`; `revalidate=False` reuses the index this board last read
        (within one `pin_get`, versions were just listed from a revalidated index)."""
        entries = self._parsed[1] if (not revalidate and self._parsed is not None) else self.list_entries()
        for e in entries:
            if e["name"] == name:
                return e
        raise PinNotFound(f"no pin named {name!r} in {self.url}/data.txt")

    @staticmethod
    def _is_versioned(entry: dict) -> bool:
        path = str(entry["path"]).rstrip("/")
        return bool(entry.get("version") or entry.get("versions") or parse_version(posixpath.basename(path)))

    # ---- primitives -----------------------------------------------------------------------
    def list_versions(self, name: str) -> list[str]:
        e = self._entry(name, revalidate=getattr(self._within, "fetch", None) != name)
        if not self._is_versioned(e):
            return [LEGACY]
        if e.get("versions"):
            found = [str(v) for v in e["versions"]] if isinstance(e["versions"], list) else [str(e["versions"])]
        else:
            found = [str(e.get("version") or posixpath.basename(str(e["path"]).rstrip("/")))]
        # a version name becomes a cache folder: `..` or `a/b` would reach another pin's files
        return [paths.check_segment(v, pin=name, board=f"{self.url}/data.txt") for v in found]

    def _version_url(self, name: str, version: str) -> str:
        paths.check_segment(version, pin=name, board=self.url)
        base = pin_folder(self._entry(name, revalidate=False))  # `<pin>/<version>/`, `.../r-legacy`, `<pin>`
        return self._abs(posixpath.join(base, version) + "/", pin=name)

    def read_meta(self, name: str, version: str) -> PinMeta:
        if version == LEGACY:
            return self._legacy_meta(self._entry(name, revalidate=False))
        url = self._version_url(name, version) + "data.txt"
        raw = board_index.load_yaml(self._get(url), source=url, max_bytes=self.max_index_bytes)
        if not isinstance(raw, dict):
            raise MalformedMetadata(f"{url}: expected a mapping of fields, got {type(raw).__name__}")
        meta = PinMeta.from_dict(raw, source=url)
        self._check_files(meta, name, url)
        meta.name, meta.version = name, version
        return meta

    @staticmethod
    def _check_files(meta: PinMeta, name: str, source: str) -> None:
        for f in meta.file:
            paths.check_relative(f, pin=name, board=source)
            if f == "data.txt":
                raise UnsafePath(f"file name 'data.txt' (pin {name!r} of board {source}) is reserved for the "
                                 "pin's metadata")

    def download_file(self, name: str, version: str, file: str, dest: Path) -> None:
        paths.check_relative(file, pin=name, board=self.url)
        self._download(self._version_url(name, version) + file, dest)

    # ---- legacy (unversioned, mutable) pins ----------------------------------------------
    def _legacy_meta(self, entry: dict) -> PinMeta:
        path = str(entry["path"])
        name = entry["name"]
        if path.endswith("/") or "." not in posixpath.basename(path):
            url = self._abs(path.rstrip("/") + "/data.txt", pin=name)
            try:
                # through the cache: revalidated like the files, served stale when the board is offline
                local = self._fetch_url(url, self.cache.url_path(self.name, url), max_bytes=self.max_index_bytes)
                raw = board_index.load_yaml(local.read_bytes(), source=url, max_bytes=self.max_index_bytes)
            except DownloadError as e:
                if e.status != 404:
                    raise
                raw = None
            if isinstance(raw, dict):
                raw.setdefault("type", entry.get("type", "files"))
                meta = PinMeta.from_dict(raw, source=url)
                meta.extra["base_url"] = self._abs(path.rstrip("/") + "/", pin=name)
            else:
                raise PinNotFound(f"legacy pin {name!r}: {url} lists no files")
            source = url
        else:
            meta = PinMeta(file=[posixpath.basename(path)], file_size=[], pin_hash="", api_version=0,
                           type=entry.get("type", "files"), description=entry.get("description"))
            meta.extra["base_url"] = self._abs(posixpath.dirname(path) + "/", pin=name)
            source = f"{self.url}/data.txt"
        self._check_files(meta, name, source)
        meta.name, meta.version = name, LEGACY
        return meta

    def fetch(self, name: str, version: str | None = None, *, download: bool = True, trust_cache: bool = True):
        entry = None
        if download:
            entry = self._entry(name)
        elif self.cache.cached_versions(self.name, name) == [LEGACY]:
            entry = {"path": "", "name": name}
        if entry is None or self._is_versioned(entry):
            self._within.fetch = name if entry is not None else None  # the index was just revalidated
            try:
                return super().fetch(name, version, download=download, trust_cache=trust_cache)
            finally:
                self._within.fetch = None
        folder = self.cache.version_dir(self.name, name, LEGACY)
        if not download:
            return self._cached_meta(name, LEGACY, folder), folder
        meta = self._legacy_meta(entry)
        # every target is checked before the first byte is written (no file, .http.json or .lock)
        targets = [(self._abs(meta.extra["base_url"] + f, pin=name),
                    paths.contained(folder, f, pin=name, board=self.url)) for f in meta.file]
        for url, target in targets:  # each file revalidated on its own, as R legacy pins did
            self._fetch_url(url, target)
        (folder / "data.txt").write_text(meta.to_yaml())
        return meta, folder


# ---- the parsed index, kept beside the cached data.txt ------------------------------------------
# Parsing YAML is slow (libyaml: ~3 s per MB on a busy 2-core machine); reading the same entries as
# JSON takes milliseconds. Each process that sees a new data.txt parses it once and leaves the
# entries in `<cached data.txt>.entries.json`, keyed by the cached file's size and mtime; others reuse
# them. Values JSON cannot hold exactly (YAML dates, non-string keys) mean no sidecar: parse again.

def _parse_cached(local: Path, key: list[int], source: str, max_bytes: int) -> list[dict]:
    sidecar = local.with_name(local.name + ".entries.json")
    try:
        stored = json.loads(sidecar.read_text())
        if isinstance(stored, dict) and stored.get("key") == key and isinstance(stored.get("entries"), list):
            return stored["entries"]
    except (OSError, ValueError):
        pass
    entries = board_index.parse_index(local.read_bytes(), source=source, max_bytes=max_bytes)
    if _plain(entries):
        tmp = Path(tmp_name(sidecar))
        try:
            tmp.write_text(json.dumps({"key": key, "entries": entries}))
            os.replace(tmp, sidecar)
        except OSError:
            tmp.unlink(missing_ok=True)
    return entries


def _plain(value: Any) -> bool:
    """True when `value` survives a JSON round trip unchanged."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False
