"""The read-only board behind a URL with a `data.txt` index (R legacy pins' "datatxt" board).

Any static web server or public bucket holding a board folder is such a board. The index and the
files of legacy R pins can change at any time, so they are revalidated with ETag / max-age (see
`cache.py`); pins 1.x versions never change, so once cached they are served without a request.
Immutable version files are transferred through fsspec's HTTP filesystem.
"""

from __future__ import annotations

import posixpath
import time
from pathlib import Path
from urllib.parse import urljoin

import fsspec
import requests

from . import index as board_index
from .board import Board
from .cache import HTTP_TIMEOUT, Cache
from .errors import DownloadError, PinNotFound
from .meta import PinMeta, parse_version

LEGACY = "legacy"  # the one pseudo-version of a legacy (unversioned) pin


class DatatxtBoard(Board):
    kind = "datatxt"
    read_only = True

    def __init__(self, name: str, url: str, *, cache: str | Path | Cache | None = None, versions: bool = True,
                 headers: dict | None = None, index_max_age: float = 0):
        """`index_max_age`: seconds to trust the index without asking the server (beyond the
        server's own Cache-Control max-age); raise it when many `pin_get` calls hit one board."""
        super().__init__(name, cache=cache, versions=versions)
        self.index_max_age = float(index_max_age)
        self._checked_at = float("-inf")
        if not url.startswith(("http://", "https://")):
            raise DownloadError(f"datatxt board {name!r}: url must be http(s)://..., got {url!r}", url=url)
        url = url.rstrip("/")
        self.url = url[: -len("/data.txt")] if url.endswith("/data.txt") else url
        self.headers = dict(headers or {})
        self.session = requests.Session()
        self.session.headers.update(self.headers)
        self.fs = fsspec.filesystem("http", headers=self.headers, skip_instance_cache=True)
        self._parsed: tuple[float, list[dict]] | None = None

    def describe(self) -> str:
        return self.url

    def _abs(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else urljoin(self.url + "/", path.lstrip("/"))

    # ---- index ----------------------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        if self._parsed is not None and time.monotonic() - self._checked_at < self.index_max_age:
            return self._parsed[1]
        local = self.cache.fetch_url(f"{self.url}/data.txt", self.cache.url_path(self.name, f"{self.url}/data.txt"),
                                     session=self.session)
        mtime = local.stat().st_mtime_ns
        if self._parsed is None or self._parsed[0] != mtime:
            self._parsed = (mtime, board_index.parse_index(local.read_bytes(), source=f"{self.url}/data.txt"))
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
        path = entry["path"].rstrip("/")
        return bool(entry.get("version") or entry.get("versions") or parse_version(posixpath.basename(path)))

    # ---- primitives -----------------------------------------------------------------------
    def list_versions(self, name: str) -> list[str]:
        e = self._entry(name)
        if not self._is_versioned(e):
            return [LEGACY]
        if e.get("versions"):
            return [str(v) for v in e["versions"]]
        return [str(e.get("version") or posixpath.basename(e["path"].rstrip("/")))]

    def _version_url(self, name: str, version: str) -> str:
        base = posixpath.dirname(self._entry(name, revalidate=False)["path"].rstrip("/"))
        return self._abs(posixpath.join(base, version) + "/")

    def _get(self, url: str) -> bytes:
        try:
            r = self.session.get(url, timeout=HTTP_TIMEOUT)
        except requests.RequestException as e:
            raise DownloadError(f"cannot reach {url}: {e}", url=url) from e
        if r.status_code >= 400:
            raise DownloadError(f"HTTP {r.status_code} {r.reason} from {url}", url=url, status=r.status_code)
        return r.content

    def read_meta(self, name: str, version: str) -> PinMeta:
        if version == LEGACY:
            return self._legacy_meta(self._entry(name, revalidate=False))
        url = self._version_url(name, version) + "data.txt"
        meta = PinMeta.from_yaml(self._get(url), source=url)
        meta.name, meta.version = name, version
        return meta

    def download_file(self, name: str, version: str, file: str, dest: Path) -> None:
        url = self._version_url(name, version) + file
        try:
            self.fs.get_file(url, str(dest))
        except FileNotFoundError as e:
            raise DownloadError(f"HTTP 404 Not Found from {url}", url=url, status=404) from e
        except Exception as e:  # aiohttp's errors carry the status; keep it in the message
            status = getattr(e, "status", None)
            raise DownloadError(f"{'HTTP %s from ' % status if status else 'cannot download '}{url}: {e}",
                                url=url, status=status) from e

    # ---- legacy (unversioned, mutable) pins ----------------------------------------------
    def _legacy_meta(self, entry: dict) -> PinMeta:
        path = entry["path"]
        if path.endswith("/") or "." not in posixpath.basename(path):
            url = self._abs(path.rstrip("/") + "/data.txt")
            try:
                raw = board_index.load_yaml(self._get(url), source=url)
            except DownloadError as e:
                if e.status != 404:
                    raise
                raw = None
            if isinstance(raw, dict):
                raw.setdefault("type", entry.get("type", "files"))
                meta = PinMeta.from_dict(raw, source=url)
                meta.extra["base_url"] = self._abs(path.rstrip("/") + "/")
            else:
                raise PinNotFound(f"legacy pin {entry['name']!r}: {url} lists no files")
        else:
            meta = PinMeta(file=[posixpath.basename(path)], file_size=[], pin_hash="", api_version=0,
                           type=entry.get("type", "files"), description=entry.get("description"))
            meta.extra["base_url"] = self._abs(posixpath.dirname(path) + "/")
        meta.name, meta.version = entry["name"], LEGACY
        return meta

    def fetch(self, name: str, version: str | None = None, *, download: bool = True, trust_cache: bool = True):
        entry = None
        if download:
            entry = self._entry(name)
        elif self.cache.cached_versions(self.name, name) == [LEGACY]:
            entry = {"path": "", "name": name}
        if entry is None or self._is_versioned(entry):
            return super().fetch(name, version, download=download, trust_cache=trust_cache)
        folder = self.cache.version_dir(self.name, name, LEGACY)
        if not download:
            return self._cached_meta(name, LEGACY, folder), folder
        meta = self._legacy_meta(entry)
        for f in meta.file:  # each file revalidated on its own, as R legacy pins did
            self.cache.fetch_url(self._abs(meta.extra["base_url"] + f), folder / f, session=self.session)
        (folder / "data.txt").write_text(meta.to_yaml())
        return meta, folder
