"""S3 and Google Cloud Storage: `BucketStorage`, an `FsStorage` on s3fs / gcsfs, with cloud errors made plain
(Azure Blob Storage's `AzureStorage`, on adlfs, builds on it in azure_board.py).

A bucket board keeps exactly the local board's layout (`<pin>/<version>/{data.txt, files}` plus the
root `data.txt` index), so a bucket written here with credentials is readable by anyone with a plain
URL as a `datatxt` board. Credentials come from the storage libraries' own chains (environment,
config files, instance metadata) or from options; they are never logged or put in messages.

Listings are never cached (s3fs and gcsfs cache them by default, which serves stale listings after
another writer's change), and the libraries' errors are translated: denied or missing credentials
become `CredentialsError`, unreachable endpoints and server failures `DownloadError` (an `OSError`,
so reads fall back to a cached copy with a warning).
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

# gcsfs probes a gRPC endpoint (~60 s per bucket without network) unless this is off; the user's
# own setting wins. It must be set before gcsfs is first imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from pinstorm.extras import require  # noqa: E402

from .. import legacy_view  # noqa: E402
from ..safety import secrets as secret_rules  # noqa: E402
from ..tempnames import FOREIGN_MAX_AGE  # noqa: E402
from ..cache import Cache  # noqa: E402
from ..errors import BoardError, CredentialsError, DownloadError  # noqa: E402
from .fs_board import FsStorage, IndexConflict, _modified  # noqa: E402
from .. import index as board_index  # noqa: E402
from ..meta import parse_version  # noqa: E402
from ..metadata import as_list  # noqa: E402

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError",
                      "CredentialRetrievalError", "UnauthorizedSSOTokenError", "SSOTokenLoadError",
                      "DefaultCredentialsError", "RefreshError", "TransportError",
                      "ClientAuthenticationError", "CredentialUnavailableError"}
_CONNECTION_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                      "ConnectionClosedError", "ProxyConnectionError", "ServerDisconnectedError",
                      "ClientConnectorError", "ClientOSError", "ClientPayloadError", "ConnectionError",
                      "TimeoutError", "ProxyError", "ChunkedEncodingError", "IncompleteRead",
                      "ServiceRequestError", "ServiceResponseError", "IncompleteReadError"}


LISTING_PAGE = 1000  # keys one listing request returns (S3's and GCS's default page; Azure's is 5,000)


class BucketStorage(FsStorage):
    """A bucket (or a folder in one): files go to their final keys, data.txt last, so a version
    exists exactly when its data.txt does; no lock orders writers, so index writes are checked by
    re-reading (see fs_board). Storage-library errors become `CredentialsError` / `DownloadError`."""

    bucket_word = "bucket"  # what messages call the top level (Azure: container)

    def __init__(self, name: str, fs, root: str, *, kind: str, bucket: str, endpoint: str | None = None,
                 secrets: tuple[str, ...] = (), cache: str | Path | Cache | None = None):
        super().__init__(name, fs, root, kind=kind, cache=cache)
        self.bucket = bucket
        self.endpoint = secret_rules.strip_url(endpoint) if endpoint else endpoint  # shown in messages
        self._secrets = tuple(s for s in secrets if isinstance(s, str) and len(s) >= 4)
        self._reset_hold()

    def _reset_hold(self) -> None:
        """`hold_index`'s state: how many are open, and their listing ({pin: data.txt paths}) or None."""
        self._hold_lock = threading.Lock()
        self._holds = 0
        self._listed: dict[str, list[str]] | None = None

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state.update(_hold_lock=None, _holds=0, _listed=None)  # a hold belongs to the process that opened it
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._hold_lock = threading.Lock()

    def with_cache(self, cache: str | os.PathLike | Cache) -> "BucketStorage":
        clone = super().with_cache(cache)
        assert isinstance(clone, BucketStorage)
        clone._reset_hold()
        return clone

    def describe(self) -> str:
        where = f"{self.kind}://{self.root}"
        return f"{where} at {self.endpoint}" if self.endpoint else where

    # ---- object-store layout ----------------------------------------------------------------
    def write_text(self, path: str, text: str) -> None:
        self.fs.pipe_file(path, text.encode())  # single-object PUTs are atomic on object stores

    def stored_data_txts(self) -> list[list[str]]:
        prefix = self.root.rstrip("/") + "/"
        return [p[len(prefix):].split("/") for p in self.fs.find(self.root) if p.startswith(prefix)]

    def version_data_txts(self, folder: str) -> list[str]:
        # one recursive listing is one request on object stores; glob costs several
        depth = folder.rstrip("/").count("/") + 2
        return [p for p in self.fs.find(folder) if p.endswith("/data.txt") and p.count("/") == depth]

    def write_version(self, name: str, staging: Path, meta) -> str:
        version = meta.version_name
        final = self.path(name, version)
        try:
            with self._errors(f"write pin {name!r}"):
                try:
                    # one call: s3fs and gcsfs upload the files concurrently (a dataset pin holds 1,000+ parts)
                    self.fs.put([str(staging / f) for f in meta.file], [posixpath.join(final, f) for f in meta.file])
                    view = legacy_view.version_view(meta)
                    if view is not None:
                        self.fs.pipe_file(posixpath.join(final, view[0]), view[1].encode())
                    self.fs.pipe_file(posixpath.join(final, "data.txt"), meta.to_yaml().encode())
                except BaseException:
                    self._take_back(final)
                    raise
                self.fresh()
                meta.name, meta.version = name, version
                self.publish(name, meta)
        except FileNotFoundError as e:
            raise self._no_bucket() from e
        return version

    def _take_back(self, final: str) -> None:
        """Remove what a failed upload of version folder `final` left (no data.txt: nobody can be using
        it), so a failed `pin()` leaves no garbage for `board repair` to find a day later. Best effort:
        with the store unreachable, repair still removes it."""
        with contextlib.suppress(Exception):
            self.fresh()
            if not self.fs.exists(posixpath.join(final, "data.txt")):  # an identical version finished meanwhile
                self.fs.rm(final, recursive=True)
            self.fresh()

    def sweep_temporaries(self, older_than: float = FOREIGN_MAX_AGE) -> int:
        """Version folders without a data.txt whose newest object is older than `older_than` seconds
        (a day by default, so a writer still uploading is never disturbed): no temporary names here."""
        with self._errors("remove unfinished versions"):
            self.fresh()
            prefix = self.root.rstrip("/") + "/"
            folders: dict[tuple[str, str], list] = {}
            for key, info in self.fs.find(self.root, detail=True).items():
                parts = key[len(prefix):].split("/") if key.startswith(prefix) else []
                if len(parts) >= 3 and not parts[0].startswith("."):
                    folders.setdefault((parts[0], parts[1]), []).append((parts[2:], info))
            now = time.time()
            removed = 0
            for (pin, version), objects in folders.items():
                if parse_version(version) is None or any(rest == ["data.txt"] for rest, _ in objects):
                    continue  # a finished version, or a folder that is not a pins 1.x version: not ours
                ages = [now - _modified(info) for _, info in objects]
                if ages and min(ages) > older_than:
                    self.fs.rm(self.path(pin, version), recursive=True)
                    removed += 1
            if removed:
                self.fresh()
            return removed

    # ---- error translation ----------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return secret_rules.redact_text(text, self._secrets)

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except (BoardError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError):
            raise
        except Exception as e:  # noqa: BLE001 - every storage-library error is translated here
            raise self._translate(e, action) from e

    def _translate(self, e: Exception, action: str) -> Exception:
        where = (f"{self.kind} board {self.name!r} ({self.bucket_word} {self.bucket!r}"
                 f"{', ' + self.endpoint if self.endpoint else ''})")
        names = {c.__name__ for c in type(e).__mro__}
        reason = self._scrub(_first_line(e))
        status = _status_of(e)
        if names & _CREDENTIAL_ERRORS or isinstance(e, PermissionError) or status in (401, 403) \
                or reason.startswith("Forbidden"):
            return CredentialsError(
                f"{where}: credentials missing or refused while trying to {action} ({type(e).__name__}: "
                f"{reason}). {self._credentials_hint()}.")
        if names & _CONNECTION_ERRORS:
            return DownloadError(f"{where}: cannot {action}: connection failed ({type(e).__name__}: {reason})",
                                 url=self.endpoint, status=status)
        label = f"HTTP {status}" if status else type(e).__name__
        return DownloadError(f"{where}: cannot {action}: {label}: {reason}", url=self.endpoint, status=status)

    def _credentials_hint(self) -> str:
        return ("Give credentials as board options or through the "
                f"{'AWS' if self.kind == 's3' else 'Google Cloud'} library's usual chain (environment "
                "variables, config files)")

    def _no_bucket(self) -> BoardError:
        return BoardError(f"{self.kind} board {self.name!r}: bucket {self.bucket!r} does not exist"
                          f"{' at ' + self.endpoint if self.endpoint else ''}; create it, or register "
                          "the board with create_bucket=True")

    # ---- primitives, translated -----------------------------------------------------------
    def list_entries(self) -> list[dict]:
        with self._errors("list pins"):
            entries = super().list_entries()
            if not entries and not self.fs.exists(self.bucket):  # an empty board, or no bucket at all
                raise self._no_bucket()
            return entries

    def list_versions(self, name: str) -> list[str]:
        listed = self._listed
        if listed is not None and name in listed:  # within `hold_index`: from its one listing
            return self.versions_from(name, listed[name])
        with self._errors(f"list versions of {name!r}"):
            return super().list_versions(name)

    # ---- many pins at once: one listing -------------------------------------------------------
    @contextlib.contextmanager
    def hold_index(self, names: Sequence[str] = ()) -> Iterator[None]:
        """Within: the versions of pins come from one listing of the whole board, taken on entry, where
        the board's index says that costs fewer requests than a listing per pin (`pin_get_many` of 1,000
        cached categories: a few requests, not 1,000); else, with no index, or where the listing fails,
        a listing per pin as before. Versions stored meanwhile show from the next call on."""
        with self._hold_lock:
            self._holds += 1
            outermost = self._holds == 1
        try:
            if outermost and names and self._one_listing_pays(names):
                listed = self._list_every_version()
                with self._hold_lock:
                    self._listed = listed
            yield
        finally:
            with self._hold_lock:
                self._holds -= 1
                if not self._holds:
                    self._listed = None

    def versions_held(self, name: str) -> list[str] | None:
        """The versions of `name` from the listing `hold_index` took (no request), or None: not held.

        Args:
            name: The pin's name.
        """
        listed = self._listed
        return self.versions_from(name, listed[name]) if listed is not None and name in listed else None

    def _one_listing_pays(self, names: Sequence[str]) -> bool:
        """Whether listing the whole board takes at most half the requests of listing each of `names`,
        counting the keys the index says each pin holds (versions x (files + data.txt + R's view))."""
        try:
            entries = self.read_index() or []
        except Exception:  # noqa: BLE001 - unreadable or unreachable: per pin, whose errors say what failed
            return False
        keys = {str(e.get("name")): len(e.get("versions") or [None]) * (len(as_list(e.get("file"))) + 2)
                for e in entries}
        whole = math.ceil(sum(keys.values()) / LISTING_PAGE)
        per_pin = sum(math.ceil(keys.get(n, 1) / LISTING_PAGE) for n in set(names))
        return bool(keys) and 2 * whole <= per_pin

    def _list_every_version(self) -> dict[str, list[str]] | None:
        """{pin: paths of its `<version>/data.txt`} from one recursive listing (None where it fails)."""
        depth = self.root.count("/") + 3  # <root>/<pin>/<version>/data.txt
        self.fresh(self.root)
        try:
            with self._errors("list pins"):
                found = self.fs.find(self.root)
        except Exception:  # noqa: BLE001 - offline, say: each pin's own listing serves the cache or names the error
            return None
        listed: dict[str, list[str]] = {}
        for p in found:
            if p.endswith("/data.txt") and p.count("/") == depth:
                listed.setdefault(p.split("/")[-3], []).append(p)
        return listed

    def read_meta(self, name: str, version: str):
        with self._errors(f"read data.txt of {name!r} version {version}"):
            return super().read_meta(name, version)

    def stored_time(self, name: str, version: str) -> float | None:
        with self._errors(f"read the age of {name!r} version {version}"):
            return super().stored_time(name, version)

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        try:
            with self._errors(f"download {name}/{version}/{file}"):
                super().download_file(name, version, file, dest, offset=offset)
        except FileNotFoundError as e:
            raise DownloadError(f"{self.kind} board {self.name!r}: {name}/{version}/{file} listed in data.txt "
                                f"is missing from bucket {self.bucket!r}", url=self.endpoint, status=404) from e

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        with self._errors(f"remove pin {name!r}"):
            super().delete(name, versions)

    def rebuild_index(self, *args, **kwargs) -> int:
        with self._errors("rebuild the data.txt index"):
            return super().rebuild_index(*args, **kwargs)

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (needs the right to create buckets)."""
        with self._errors(f"create bucket {self.bucket!r}"):
            self._fresh()
            if not self.fs.exists(self.bucket):
                with contextlib.suppress(FileExistsError):
                    self.fs.mkdir(self.bucket)
                self._fresh()



class S3Storage(BucketStorage):
    """S3 writes the index with If-Match / If-None-Match, so a concurrent overwrite is refused
    instead of discovered (the re-read rounds stay, for S3 clones that ignore conditions)."""

    def read_small_file(self, path: str) -> bytes:
        """One GET: s3fs asks a file's size first (a HEAD) where it may split the download."""
        try:
            return bytes(self.fs.cat_file(path, max_concurrency=1))
        except TypeError:  # an s3fs without concurrent downloads: it has no HEAD to save either
            return bytes(self.fs.cat_file(path))

    def read_index_bytes(self, path: str) -> tuple[bytes, str | None]:
        """The body and ETag of the index, from one GET (so the token matches the bytes)."""
        from fsspec.asyn import sync

        bucket, key, _ = self.fs.split_path(path)

        async def get():
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            chunks, held = [], 0
            try:  # read(n) returns what has arrived, up to n: a 200 KB index comes in several reads
                while held <= board_index.MAX_INDEX_BYTES:
                    chunk = await body.read(board_index.MAX_INDEX_BYTES + 1 - held)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    held += len(chunk)
            finally:
                body.close()
            return b"".join(chunks), response.get("ETag")

        return sync(self.fs.loop, get)

    def write_index_text(self, path: str, text: str, token: str | None, existed: bool) -> None:
        bucket, key, _ = self.fs.split_path(path)
        condition = {"IfMatch": token} if existed and token else {"IfNoneMatch": "*"} if not existed else {}
        try:
            self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=text.encode(),
                            ContentType="text/yaml", **condition)
        except Exception as e:  # noqa: BLE001 - s3fs wraps botocore's errors in several ways
            if _precondition_failed(e):
                raise IndexConflict() from e
            raise


def _precondition_failed(e: BaseException) -> bool:
    seen = 0
    while e is not None and seen < 5:
        text = f"{type(e).__name__} {e}"
        if "PreconditionFailed" in text or "ConditionalRequestConflict" in text or " 412" in text:
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _first_line(e: Exception) -> str:
    """The library's message on one line, short (gcsfs puts the server's reason on a second line)."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:300]


def _status_of(e: BaseException) -> int | None:
    """An HTTP status carried by a storage-library exception or one it wraps."""
    seen = 0
    while e is not None and seen < 5:
        for attr in ("status", "code", "status_code"):
            v = getattr(e, attr, None)
            if isinstance(v, int) and 100 <= v < 600:
                return v
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            v = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(v, int):
                return v
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def _check_bucket(kind: str, name: str, bucket: Any) -> str:
    if not isinstance(bucket, str) or not _BUCKET.match(bucket) or ".." in bucket:
        raise BoardError(f"{kind} board {name!r}: bucket must be a bucket name (3-222 lowercase letters, "
                         f"digits, '.', '-', '_'), got {bucket!r}; put folders in path=")
    return bucket


def _root(bucket: str, path: str) -> str:
    path = (path or "").strip("/")
    if ".." in path.split("/"):
        raise BoardError(f"board path {path!r} must not contain '..'")
    return f"{bucket}/{path}".rstrip("/")


def _secrets(options: dict) -> tuple[str, ...]:
    """The secret strings among a board's options (see `secrets.secret_values`), to scrub from messages."""
    return secret_rules.secret_values(options)


def s3_storage(name: str, bucket: str, path: str = "", endpoint_url: str | None = None,
               cache: str | Path | Cache | None = None, create_bucket: bool = False,
               **storage_options: Any) -> S3Storage:
    """Storage in `s3://bucket/path` through s3fs.

    `endpoint_url` reaches S3-compatible stores (MinIO, Ceph, moto); other options (`key`, `secret`,
    `token`, `profile`, `anon`, `client_kwargs`, `config_kwargs`, ...) go to `s3fs.S3FileSystem`.
    """
    s3fs = require("s3fs", "s3", "an S3 board")

    _check_bucket("s3", name, bucket)
    options = dict(storage_options)
    options["use_listings_cache"] = False
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    fs = s3fs.S3FileSystem(**options)
    board = S3Storage(name, fs, _root(bucket, path), kind="s3", bucket=bucket, endpoint=endpoint_url,
                      secrets=_secrets({**storage_options, "endpoint_url": endpoint_url}), cache=cache)
    if create_bucket:
        board.ensure_bucket()
    return board


def gcs_storage(name: str, bucket: str, path: str = "", endpoint_url: str | None = None,
                project: str | None = None, token: Any = None, cache: str | Path | Cache | None = None,
                create_bucket: bool = False, **storage_options: Any) -> BucketStorage:
    """Storage in `gs://bucket/path` through gcsfs.

    `token` is what gcsfs takes: None (Google's default chain), "anon", "google_default", "cloud",
    a service-account JSON path, or a credentials object. `endpoint_url` reaches an emulator or a
    compatible store; `project` is needed only to create buckets.
    """
    gcsfs = require("gcsfs", "gcs", "a Google Cloud Storage board")

    _check_bucket("gcs", name, bucket)
    options = dict(storage_options)
    options["use_listings_cache"] = False
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    if project is not None:
        options["project"] = project
    if token is not None:
        options["token"] = token
    try:
        fs = gcsfs.GCSFileSystem(**options)
    except Exception as e:  # a malformed or missing service-account file fails right here
        raise CredentialsError(f"gcs board {name!r} (bucket {bucket!r}): cannot load credentials "
                               f"({type(e).__name__}: {_first_line(e)})") from e
    secrets = _secrets({**storage_options, "endpoint_url": endpoint_url, "token": token})
    board = BucketStorage(name, fs, _root(bucket, path), kind="gcs", bucket=bucket, endpoint=endpoint_url,
                          secrets=secrets, cache=cache)
    if create_bucket:
        board.ensure_bucket()
    return board
