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
parallel fetches, `PINSTORM_HTTP_TIMEOUT` per read and an overall deadline per body that scales with
its declared size, two retries on refused connections and 502/503/504 with no Retry-After sleeps, the
board's credentials sent to its own origin only, redirects included: `OriginSession`). A file's body
stops at the size its data.txt declares (plus slack): an endless body cannot fill the cache.

Revalidation stays hand-written (`Cache.fetch_url`, ~60 lines) rather than CacheControl: CacheControl
keeps a response body inside its own serialised cache entry, so a cached file is not a plain file at
a stable path that `pin_get` can return (a second copy on disk is needed), and it buffers whole bodies
in memory. Measured with cachecontrol 0.14.4 + FileCache on a 64 MiB file from 127.0.0.1, two
fetches (cold, then revalidated): peak RSS +133 MiB and 5.3 s, against +0 MiB and 0.38 s for
`fetch_url` (2-core machine, 2026-11). We need only ETag / Last-Modified / max-age /
no-cache / no-store, which `fetch_url` honours.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence
from urllib.parse import parse_qsl

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from .. import index as board_index
from ..safety import paths, secrets
from ..cache import (HTTP_DEADLINE, HTTP_MIN_RATE, HTTP_TIMEOUT, Cache, TransferLimits, _stream_to, bounded_blocks,
                    declared_cap)
from ..errors import DownloadError, LimitExceeded, MalformedMetadata, PinNotFound, UnsafePath
from ..legacy_view import pin_folder
from ..meta import PinMeta, parse_version
from ..storage import StorageBase
from ..tempnames import tmp_name

LEGACY = "legacy"  # the one pseudo-version of a legacy (unversioned) pin
POOL_SIZE = 32  # connections kept per host: pin_get_many runs up to 16 threads on one board


class IndexEntries(list):
    """An index's entries with a lookup by name, built on first use: finding each of 21,841 pins by a scan
    of the list cost ~0.7 ms a lookup, several a `pin_get` (the first entry of a name wins, as a scan's)."""

    _by_name: dict[str, dict] | None = None

    def named(self, name: str) -> dict | None:
        """The first entry named `name`, or None.

        Args:
            name: The pin's name.
        """
        if self._by_name is None:
            by_name: dict[str, dict] = {}
            for entry in self:
                if isinstance(entry.get("name"), str):
                    by_name.setdefault(entry["name"], entry)
            self._by_name = by_name
        return self._by_name.get(name)


class OriginSession(requests.Session):
    """A Session whose credentials (the board's headers, a URL's `user:password@`, its `?token=`)
    go to one origin (scheme, host, port) only, redirects included.

    Credentials are added per request, only for URLs on the origin; `rebuild_auth`, which requests
    calls on every redirect, removes them when the next hop leaves it (requests itself strips only
    `Authorization` and cookies, so an `X-Api-Key` header would follow a 302 anywhere).
    """

    def __init__(self, home: str, *, headers: dict | None = None, auth: tuple[str, str] | None = None,
                 params: dict | None = None):
        super().__init__()
        self.home = paths.origin(home)
        self.private_headers = dict(headers or {})
        self.private_auth = auth
        self.private_params = dict(params or {})

    def at_home(self, url: str) -> bool:
        try:
            return paths.origin(url) == self.home
        except UnsafePath:
            return False

    def request(self, method, url, **kwargs):
        if self.at_home(url):
            kwargs["headers"] = {**self.private_headers, **(kwargs.get("headers") or {})}
            if self.private_auth and kwargs.get("auth") is None:
                kwargs["auth"] = self.private_auth
            if self.private_params:
                kwargs["params"] = {**self.private_params, **(kwargs.get("params") or {})}
        return super().request(method, url, **kwargs)

    def rebuild_auth(self, prepared_request, response):
        super().rebuild_auth(prepared_request, response)
        if not self.at_home(prepared_request.url):
            for name in [*self.private_headers, "Authorization"]:
                prepared_request.headers.pop(name, None)


def http_session(home: str = "http://localhost", *, headers: dict | None = None,
                 auth: tuple[str, str] | None = None, params: dict | None = None) -> OriginSession:
    """The one HTTP client of a data.txt board: pooled, with bounded retries and no long sleeps,
    its credentials sent to `home`'s origin only."""
    session = OriginSession(home, headers=headers, auth=auth, params=params)
    retry = Retry(total=2, connect=2, read=0, status=2, other=0, backoff_factor=0.1,
                  status_forcelist=(502, 503, 504), allowed_methods=("GET", "HEAD"),
                  raise_on_status=False, respect_retry_after_header=False)
    adapter = HTTPAdapter(pool_connections=4, pool_maxsize=POOL_SIZE, max_retries=retry)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


class DatatxtStorage(StorageBase):
    """A read-only board behind an HTTP(S) URL with a data.txt index (R's board_register_datatxt)."""

    kind = "datatxt"
    read_only = True

    def __init__(self, name: str, url: str, *, cache: str | Path | Cache | None = None,
                 headers: dict | None = None, index_max_age: float = 0,
                 allow_external: bool | list[str] = False, max_index_bytes: int = board_index.MAX_INDEX_BYTES,
                 deadline: float | None = None, min_rate: float | None = None):
        """`index_max_age`: seconds to trust the index without asking the server (beyond the
        server's own Cache-Control max-age); raise it when many `pin_get` calls hit one board.
        `allow_external`: follow index paths that are absolute URLs on other hosts (R legacy boards
        wrote some): True for any http(s) origin, or a list of origins such as
        ["https://cdn.example.org"]. `max_index_bytes`: the cap on a data.txt (index or version).
        `deadline` / `min_rate`: each body must arrive within `deadline` seconds plus one second per
        `min_rate` bytes (defaults: $PINSTORM_HTTP_DEADLINE = 60, $PINSTORM_HTTP_MIN_RATE = 128 KiB/s).
        `headers=` (a dict or a list of pairs) and credentials in `url` (`user:password@`, `?token=`)
        are sent to the board's origin only and never saved, shown or put in a file name."""
        super().__init__(name, cache=cache)
        self.index_max_age = float(index_max_age)
        self._checked_at = float("-inf")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise DownloadError(f"datatxt board {name!r}: url must be http(s)://..., got {url!r}", url=url)
        url, auth, params = secrets.split_url(url)  # credentials leave the URL: it is shown and names files
        url, _, query = url.partition("?")
        params = {**dict(parse_qsl(query, keep_blank_values=True)), **params}
        url = url.rstrip("/")
        self.url = url[: -len("/data.txt")] if url.endswith("/data.txt") else url
        if isinstance(allow_external, str):
            allow_external = [allow_external]
        self.allow_external = allow_external if isinstance(allow_external, bool) else list(allow_external)
        self.max_index_bytes = int(max_index_bytes)
        self.headers = dict(secrets.header_items(headers))
        self._auth, self._params = auth, params
        self._secrets = secrets.secret_values({"headers": self.headers, "params": params,
                                               "password": auth[1] if auth else None})
        self.limits = TransferLimits(HTTP_DEADLINE if deadline is None else float(deadline),
                                     HTTP_MIN_RATE if min_rate is None else float(min_rate))
        self._declared: dict[tuple[str, str], dict[str, int]] = {}  # file sizes read_meta saw
        self.session = self._new_session()
        self._parsed: tuple[Any, IndexEntries] | None = None
        self._within = threading.local()  # per thread: the pin whose fetch already revalidated the index
        self._holds, self._held_since, self._hold_lock = 0, float("inf"), threading.Lock()  # `hold_index`

    def describe(self) -> str:
        return self.url

    def _new_session(self) -> OriginSession:
        return http_session(self.url, headers=self.headers, auth=self._auth, params=self._params)

    def __getstate__(self) -> dict:  # picklable for process pools: a fresh session on the other side
        state = dict(self.__dict__)
        state["session"] = state["_within"] = state["_hold_lock"] = None
        state["_holds"], state["_held_since"] = 0, float("inf")
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.session = self._new_session()
        self._within = threading.local()
        self._hold_lock = threading.Lock()

    @contextlib.contextmanager
    def hold_index(self, names: Sequence[str] = ()) -> Iterator[None]:
        """Within: the index is revalidated once, then reused (`pin_get_many` reads it once for all its
        `names`, not once a pin: one request instead of 1,000 for 1,000 cached categories)."""
        with self._hold_lock:
            self._holds += 1
            if self._holds == 1:
                self._held_since = time.monotonic()
        try:
            yield
        finally:
            with self._hold_lock:
                self._holds -= 1
                if not self._holds:
                    self._held_since = float("inf")

    def versions_held(self, name: str) -> list[str] | None:
        """The versions of `name` from the index `hold_index` reads once (the first call may make that one
        request), or None: not held, or not in it.

        Args:
            name: The pin's name.
        """
        if self._held_since == float("inf"):
            return None
        try:
            return self.list_versions(name)
        except (PinNotFound, UnsafePath):
            return None

    # ---- URLs and requests ----------------------------------------------------------------
    def _abs(self, path: str, *, pin: str | None = None) -> str:
        """An index or metadata path as a URL this board may follow (see `paths.resolve_url`)."""
        return paths.resolve_url(self.url, path, allow=self.allow_external, pin=pin, board=self.url)

    def _scrub(self, text: str) -> str:
        return secrets.redact_text(text, self._secrets)

    def _request(self, url: str, headers: dict | None = None) -> requests.Response:
        try:
            r = self.session.get(url, stream=True, timeout=HTTP_TIMEOUT, headers=headers)
        except requests.RequestException as e:
            raise DownloadError(f"cannot reach {url}: {self._scrub(str(e))}", url=url) from e
        if r.status_code >= 400:
            r.close()
            raise DownloadError(f"HTTP {r.status_code} {r.reason} from {url}", url=url, status=r.status_code)
        return r

    def _get(self, url: str) -> bytes:
        """A small document (a version's data.txt), at most `max_index_bytes`."""
        with self._request(url) as r:
            try:
                return b"".join(bounded_blocks(r, url, cap=self.max_index_bytes, limits=self.limits,
                                               chunk=1 << 16))
            except LimitExceeded:
                raise LimitExceeded(f"{url}: more than the {self.max_index_bytes}-byte cap on metadata "
                                    f"(max_index_bytes=) of board {self.name!r}") from None

    def _download(self, url: str, dest: Path, *, what: str = "", size: int | None = None, offset: int = 0) -> None:
        """Stream `url` into `dest`: no more than the declared `size` (plus slack), within the
        board's deadline, refusing a body shorter than its Content-Length. With `offset`, ask for the
        rest of the file only (a Range request) and append it; a server that answers with the whole
        file (200) starts it over."""
        with self._request(url, headers={"Range": f"bytes={offset}-"} if offset else None) as r:
            append = bool(offset) and r.status_code == 206 and \
                r.headers.get("Content-Range", "").startswith(f"bytes {offset}-")
            if offset and r.status_code == 206 and not append:
                raise DownloadError(f"{what + ': ' if what else ''}{url} answered a resume from byte {offset} with "
                                    f"Content-Range {r.headers.get('Content-Range')!r}", url=url)
            rest = None if size is None else max(0, size - offset) if append else size
            received = _stream_to(r, dest, url, None, what=what, size=rest, limits=self.limits, append=append)
            expected = r.headers.get("Content-Length")
            if expected is not None and expected.isdigit() and "Content-Encoding" not in r.headers \
                    and int(expected) != received:
                raise DownloadError(f"{what + ': ' if what else ''}truncated body from {url}: {received} of "
                                    f"{expected} bytes", url=url)

    def _fetch_url(self, url: str, dest: Path, *, max_bytes: int | None = None) -> Path:
        try:
            return self.cache.fetch_url(url, dest, session=self.session, max_bytes=max_bytes, limits=self.limits)
        except DownloadError as e:
            if not self._secrets:
                raise
            raise DownloadError(self._scrub(str(e)), url=e.url, status=e.status) from None

    def _declare(self, name: str, version: str, meta: PinMeta) -> None:
        """Remember the file sizes a version's data.txt declares: its downloads stop there."""
        if meta.file_size and len(meta.file_size) == len(meta.file):
            if len(self._declared) > 1024:
                self._declared.clear()
            self._declared[(name, version)] = dict(zip(meta.file, meta.file_size))

    def _declared_size(self, name: str, version: str, file: str) -> int | None:
        sizes = self._declared.get((name, version))
        if sizes is None:
            self.read_meta(name, version)  # download_file called on its own: read the sizes first
            sizes = self._declared.get((name, version), {})
        size = sizes.get(file)
        return int(size) if isinstance(size, int) and size >= 0 else None

    # ---- index ----------------------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        if self._parsed is not None and (time.monotonic() - self._checked_at < self.index_max_age
                                         or self._checked_at >= self._held_since):  # read once in `hold_index`
            return self._parsed[1]
        source = f"{self.url}/data.txt"
        local = self._fetch_url(source, self.cache.url_path(self.name, source), max_bytes=self.max_index_bytes)
        stat = local.stat()
        key = [stat.st_size, stat.st_mtime_ns]
        if self._parsed is None or self._parsed[0] != key:
            self._parsed = (key, IndexEntries(_parse_cached(local, key, source, self.max_index_bytes)))
        self._checked_at = time.monotonic()
        return self._parsed[1]

    def _entry(self, name: str, *, revalidate: bool = True) -> dict:
        """The index entry of `name`; `revalidate=False` reuses the index this board last read
        (within one `pin_get`, versions were just listed from a revalidated index)."""
        entries = self._parsed[1] if (not revalidate and self._parsed is not None) else self.list_entries()
        found = entries.named(name) if isinstance(entries, IndexEntries) else \
            next((e for e in entries if e["name"] == name), None)
        if found is not None:
            return found
        raise PinNotFound(f"no pin named {name!r} in {self.url}/data.txt")

    @staticmethod
    def _is_versioned(entry: dict) -> bool:
        path = str(entry["path"]).rstrip("/")
        return bool(entry.get("version") or entry.get("versions") or parse_version(posixpath.basename(path)))

    # ---- primitives -----------------------------------------------------------------------
    def list_versions(self, name: str) -> list[str]:
        revalidate = getattr(self._within, "fetch", None) != name
        self._within.fetch = None  # one listing per fetch reuses the index the fetch just read
        e = self._entry(name, revalidate=revalidate)
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
        self._declare(name, version, meta)
        return meta

    @staticmethod
    def _check_files(meta: PinMeta, name: str, source: str) -> None:
        """Each file name safe (`paths.check_relative`: inside the folder, not data.txt however
        written), and no two landing on one file (`a.csv` and `./a.csv`)."""
        seen: dict[str, str] = {}
        for f in meta.file:
            paths.check_relative(f, pin=name, board=source)
            landing = paths.normalise(f)
            if landing in seen:
                raise UnsafePath(f"file names {seen[landing]!r} and {f!r} (pin {name!r} of board {source}) name "
                                 "the same file")
            seen[landing] = f

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        paths.check_relative(file, pin=name, board=self.url)
        self._download(self._version_url(name, version) + file, dest, size=self._declared_size(name, version, file),
                       what=f"pin {name!r} version {version} file {file!r} of board {self.name!r}", offset=offset)

    def file_url(self, name: str, version: str, file: str) -> str:
        """The URL of one file of a version, inside the version's folder (`paths.check_relative`).

        Args:
            name: The pin's name.
            version: A version name from `list_versions`.
            file: A file name from the version's metadata.

        Returns:
            The file's URL (credentials left out: the session adds them, on the board's origin only).
        """
        paths.check_relative(file, pin=name, board=self.url)
        if version == LEGACY:
            return self._abs(self._legacy_meta(self._entry(name, revalidate=False)).extra["base_url"] + file, pin=name)
        return self._version_url(name, version) + file

    def read_range(self, name: str, version: str, file: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive) of one file of a version, by one ranged GET through the board's
        client (`read_range_into`), in memory.

        Args:
            name: The pin's name.
            version: A version name from `list_versions`.
            file: A file name from the version's metadata.
            start: The first byte.
            end: One past the last byte.

        Returns:
            At most ``end - start`` bytes; fewer when the connection dropped mid-body (the caller resumes).

        Raises:
            DownloadError: As `read_range_into`, when not a byte arrived.
        """
        data = bytearray()
        try:
            self.read_range_into(name, version, file, start, end, data.extend)
        except DownloadError:
            if not data:
                raise
        return bytes(data)

    def read_range_into(self, name: str, version: str, file: str, start: int, end: int,
                        take: Callable[[memoryview], object]) -> None:
        """Bytes `start` to `end` (exclusive) of one file of a version, handed to `take` a block at a time as
        they arrive, by one ranged GET through the board's client: a reader that streams a pin's files part
        by part (`pipeline.part_cache`) fetches no file whole, and holds no part in memory.

        Args:
            name: The pin's name.
            version: A version name from `list_versions`.
            file: A file name from the version's metadata.
            start: The first byte.
            end: One past the last byte.
            take: Called with each block, in order.

        Raises:
            DownloadError: Unreachable, an HTTP error (``status`` 404: no such file), a server that ignored
                the Range and answered with another part of the file, or a connection dropped mid-body (the
                blocks handed over stand; the caller resumes from there).
        """
        if end <= start:
            return
        url = self.file_url(name, version, file)
        with self._request(url, headers={"Range": f"bytes={start}-{end - 1}"}) as r:
            if r.status_code != 206 or not r.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
                raise DownloadError(f"{url} answered a request for bytes {start}-{end - 1} with HTTP {r.status_code} "
                                    f"and Content-Range {r.headers.get('Content-Range')!r}: the server must honour "
                                    "Range requests to stream", url=url, status=r.status_code)
            try:
                for block in bounded_blocks(r, url, cap=end - start, limits=self.limits):
                    take(memoryview(block))
            except DownloadError as e:
                raise DownloadError(self._scrub(str(e)), url=url, status=e.status) from None

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

    def direct_fetch(self, name: str, version: str | None, *, download: bool) -> tuple[PinMeta, Path] | None:
        """R legacy (unversioned) pins: each file fetched from its URL and revalidated on its own, as
        R legacy pins were, into the cache's `legacy` folder. Versioned pins: None (the board's
        versioned path), after noting that the index was just revalidated for this pin."""
        entry = None
        if download:
            entry = self._entry(name)
        elif self.cache.cached_versions(self.name, name) == [LEGACY]:
            entry = {"path": "", "name": name}
        if entry is None or self._is_versioned(entry):
            self._within.fetch = name if entry is not None else None  # the index was just revalidated
            return None
        folder = self.cache.version_dir(self.name, name, LEGACY)
        if not download:
            meta = PinMeta.from_yaml((folder / "data.txt").read_text(), source=str(folder / "data.txt"))
            meta.name, meta.version = name, LEGACY
            return meta, folder
        meta = self._legacy_meta(entry)
        # every target is checked before the first byte is written (no file, .http.json or .lock)
        targets = [(self._abs(meta.extra["base_url"] + f, pin=name),
                    paths.contained(folder, f, pin=name, board=self.url)) for f in meta.file]
        sizes = dict(zip(meta.file, meta.file_size)) if len(meta.file_size or []) == len(meta.file) else {}
        for f, (url, target) in zip(meta.file, targets):  # each file revalidated on its own, as R legacy pins did
            size = sizes.get(f)
            self._fetch_url(url, target, max_bytes=declared_cap(size) if isinstance(size, int) else None)
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
        text = sidecar.read_text()
        if board_index.may_hold_surrogates(text):  # written before lone surrogates were refused: parse again
            raise ValueError(f"{sidecar}: written by an older pinstorm")
        stored = json.loads(text)
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


def DatatxtBoard(name: str, url: str, **options: Any):  # noqa: N802 - the class name earlier releases had
    """A Board over `DatatxtStorage` (data.txt only, no R legacy version listing), built as earlier
    releases built their `DatatxtBoard` objects; new code uses `boards.board_datatxt(url, ...)`."""
    from ..board import BOARD_OPTIONS, Board

    own = {k: options.pop(k) for k in BOARD_OPTIONS if k in options}
    return Board(DatatxtStorage(name, url, **options), spec={"kind": "datatxt", "url": url, **options}, **own)
