"""S3 and Google Cloud Storage boards: an `FsBoard` on s3fs / gcsfs, with cloud errors made plain.

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
import os
import re
from pathlib import Path
from typing import Any, Iterator

# gcsfs probes a gRPC endpoint (~60 s per bucket without network) unless this is off; the user's
# own setting wins. It must be set before gcsfs is first imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from pinstorm.extras import require  # noqa: E402

from . import secrets as secret_rules  # noqa: E402
from .cache import Cache  # noqa: E402
from .errors import BoardError, CredentialsError, DownloadError  # noqa: E402
from .fs_board import FsBoard  # noqa: E402

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_CREDENTIAL_ERRORS = {"NoCredentialsError", "PartialCredentialsError", "NoAuthTokenError",
                      "CredentialRetrievalError", "UnauthorizedSSOTokenError", "SSOTokenLoadError",
                      "DefaultCredentialsError", "RefreshError", "TransportError"}
_CONNECTION_ERRORS = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
                      "ConnectionClosedError", "ProxyConnectionError", "ServerDisconnectedError",
                      "ClientConnectorError", "ClientOSError", "ClientPayloadError", "ConnectionError",
                      "TimeoutError", "ProxyError", "ChunkedEncodingError", "IncompleteRead"}


class BucketBoard(FsBoard):
    """An FsBoard whose storage is a cloud bucket: same layout, cloud errors translated."""

    def __init__(self, name: str, fs, root: str, *, kind: str, bucket: str, endpoint: str | None = None,
                 secrets: tuple[str, ...] = (), **kwargs):
        super().__init__(name, fs, root, kind=kind, **kwargs)
        self.bucket = bucket
        self.endpoint = secret_rules.strip_url(endpoint) if endpoint else endpoint  # shown in messages
        self._secrets = tuple(s for s in secrets if isinstance(s, str) and len(s) >= 4)

    def __repr__(self) -> str:
        return f"<BucketBoard {self.name!r} {self.describe()}>"

    def describe(self) -> str:
        where = f"{self.kind}://{self.root}"
        return f"{where} at {self.endpoint}" if self.endpoint else where

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
        where = f"{self.kind} board {self.name!r} (bucket {self.bucket!r}{', ' + self.endpoint if self.endpoint else ''})"
        names = {c.__name__ for c in type(e).__mro__}
        reason = self._scrub(_first_line(e))
        status = _status_of(e)
        if names & _CREDENTIAL_ERRORS or isinstance(e, PermissionError) or status in (401, 403) \
                or reason.startswith("Forbidden"):
            return CredentialsError(
                f"{where}: credentials missing or refused while trying to {action} ({type(e).__name__}: "
                f"{reason}). Give credentials as board options or through the "
                f"{'AWS' if self.kind == 's3' else 'Google Cloud'} library's usual chain (environment "
                "variables, config files).")
        if names & _CONNECTION_ERRORS:
            return DownloadError(f"{where}: cannot {action}: connection failed ({type(e).__name__}: {reason})",
                                 url=self.endpoint, status=status)
        label = f"HTTP {status}" if status else type(e).__name__
        return DownloadError(f"{where}: cannot {action}: {label}: {reason}", url=self.endpoint, status=status)

    # ---- primitives, translated -----------------------------------------------------------
    def list_entries(self) -> list[dict]:
        with self._errors("list pins"):
            return super().list_entries()

    def list_versions(self, name: str) -> list[str]:
        with self._errors(f"list versions of {name!r}"):
            return super().list_versions(name)

    def read_meta(self, name: str, version: str):
        with self._errors(f"read data.txt of {name!r} version {version}"):
            return super().read_meta(name, version)

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        try:
            with self._errors(f"download {name}/{version}/{file}"):
                super().download_file(name, version, file, dest, offset=offset)
        except FileNotFoundError as e:
            raise DownloadError(f"{self.kind} board {self.name!r}: {name}/{version}/{file} listed in data.txt "
                                f"is missing from bucket {self.bucket!r}", url=self.endpoint, status=404) from e

    def write_version(self, name: str, staging: Path, meta) -> str:
        try:
            with self._errors(f"write pin {name!r}"):
                return super().write_version(name, staging, meta)
        except FileNotFoundError as e:
            raise BoardError(f"{self.kind} board {self.name!r}: bucket {self.bucket!r} does not exist"
                             f"{' at ' + self.endpoint if self.endpoint else ''}; create it, or register "
                             "the board with create_bucket=True") from e

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        with self._errors(f"remove pin {name!r}"):
            super().delete(name, versions)

    def rebuild_index(self, *args, **kwargs) -> int:
        with self._errors("rebuild the data.txt index"):
            return super().rebuild_index(*args, **kwargs)

    def sweep_temporaries(self, *args, **kwargs) -> int:
        with self._errors("remove unfinished versions"):
            return super().sweep_temporaries(*args, **kwargs)

    def ensure_bucket(self) -> None:
        """Create the bucket unless it exists (needs the right to create buckets)."""
        with self._errors(f"create bucket {self.bucket!r}"):
            self._fresh()
            if not self.fs.exists(self.bucket):
                with contextlib.suppress(FileExistsError):
                    self.fs.mkdir(self.bucket)
                self._fresh()


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


def s3_board(name: str, bucket: str, path: str = "", endpoint_url: str | None = None,
             cache: str | Path | Cache | None = None, versions: bool = True, create_bucket: bool = False,
             **storage_options: Any) -> BucketBoard:
    """A board in `s3://bucket/path` through s3fs.

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
    board = BucketBoard(name, fs, _root(bucket, path), kind="s3", bucket=bucket, endpoint=endpoint_url,
                        secrets=_secrets({**storage_options, "endpoint_url": endpoint_url}), cache=cache,
                        versions=versions)
    if create_bucket:
        board.ensure_bucket()
    return board


def gcs_board(name: str, bucket: str, path: str = "", endpoint_url: str | None = None,
              project: str | None = None, token: Any = None, cache: str | Path | Cache | None = None,
              versions: bool = True, create_bucket: bool = False, **storage_options: Any) -> BucketBoard:
    """A board in `gs://bucket/path` through gcsfs.

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
    board = BucketBoard(name, fs, _root(bucket, path), kind="gcs", bucket=bucket, endpoint=endpoint_url,
                        secrets=secrets, cache=cache, versions=versions)
    if create_bucket:
        board.ensure_bucket()
    return board
