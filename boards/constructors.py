"""Constructors: functions that return a ready `Board`, with no registration and no global state.

pins-python's names (`board_folder`, `board_local`, `board_temp`, `board_url`, `board_s3`,
`board_gcs`, `board_azure`) take its arguments; `board_datatxt` and `board_kaggle` add pinstorm's other backends.
Each splits its options in two: the Board's own (`versions`/`versioned`, extraction bounds) and the
storage's (everything else), so a backend never sees user-level policy. `board_from_spec` builds a
board from `{"kind": ..., **options}`, which is how the registry, the CLI and Spark workers make
boards; `KINDS`, the one table of kinds, maps each kind to one of the functions here.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple

import platformdirs

from .safety import secrets
from .board import BOARD_OPTIONS, Board
from .errors import BoardError
from .storage import StorageBase

ENV_LOCAL_BOARD = "PINSTORM_BOARD"


def default_local_path() -> Path:
    """The embedded default board's folder: `$PINSTORM_BOARD`, else the user data folder."""
    return Path(os.environ.get(ENV_LOCAL_BOARD) or os.environ.get("PINS_DATA_DIR")  # pins-python's variable
                or Path(platformdirs.user_data_dir("pinstorm")) / "local")


def _board(storage_factory: Callable[..., StorageBase], spec: dict[str, Any], name: str, options: dict[str, Any],
           given: str | None = None) -> Board:
    """A Board over the storage `storage_factory(name=..., **storage options)` makes; `given` is the
    path as the user wrote it (pins-python's `board.board`)."""
    options = dict(options)
    if options.get("allow_pickle_read") is None:
        options.pop("allow_pickle_read", None)
    if "versioned" in options:  # pins-python's spelling
        options["versions"] = options.pop("versioned")
    own = {k: options.pop(k) for k in BOARD_OPTIONS if k in options}
    board = Board(storage_factory(name=name, **options), spec=spec, **own)
    if given is not None:
        board.board = given
    return board


def _spec(kind: str, **options: Any) -> dict[str, Any]:
    return {"kind": kind, **{k: v for k, v in options.items() if v is not None}}


# ---- local --------------------------------------------------------------------------------
def board_folder(path: str | os.PathLike[str], versioned: bool = True, allow_pickle_read: bool | None = None, *,
                 cache: Any = None, name: str | None = None, **options: Any) -> Board:
    """A board in a local (or mounted network) folder; created if missing. Its files are read in
    place, so `cache` only holds verification stamps.

    Args:
        path: The board's folder (``~`` is expanded).
        versioned: Keep every version of a pin (False: only the newest).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        name: The board's name (None: the folder's name).
        **options: The board's other options, e.g. ``max_extract_bytes`` and ``max_extract_ratio``.

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    from .backends.fs_board import FolderStorage

    root = Path(path).expanduser().resolve()
    name = name or root.name or "folder"
    spec = _spec("folder", path=str(root), versions=versioned, cache=cache, allow_pickle_read=allow_pickle_read,
                 **options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return FolderStorage(name, root, kind="folder", **rest)

    return _board(storage, spec, name, {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read,
                                        **options}, given=str(path))


def board_local(versioned: bool = True, allow_pickle_read: bool | None = None, *,
                path: str | os.PathLike[str] | None = None, cache: Any = None, name: str = "local",
                **options: Any) -> Board:
    """The embedded default board (`$PINSTORM_BOARD`, else the user data folder), as `board_register`'s
    "local".

    Args:
        versioned: Keep every version of a pin (False: only the newest).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        path: The board's folder (None: ``$PINSTORM_BOARD``, else the user data folder).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        name: The board's name.
        **options: The board's other options, e.g. ``max_extract_bytes`` and ``max_extract_ratio``.

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    from .backends.fs_board import FolderStorage

    root = Path(path).expanduser().resolve() if path else default_local_path()
    spec = _spec("local", path=str(root) if path else None, versions=versioned, cache=cache,
                 allow_pickle_read=allow_pickle_read, **options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return FolderStorage(name, root, kind="local", **rest)

    return _board(storage, spec, name, {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read,
                                        **options})


def board_temp(versioned: bool = True, allow_pickle_read: bool | None = None, *, name: str = "temp",
               **options: Any) -> Board:
    """A board in a new temporary folder (gone when the process ends), with its own cache there.

    Args:
        versioned: Keep every version of a pin (False: only the newest).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        name: The board's name.
        **options: As `board_folder`'s (``cache`` defaults to a folder beside the board).

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    import atexit
    import shutil

    root = Path(tempfile.mkdtemp(prefix="pinstorm-board-"))
    atexit.register(shutil.rmtree, root, True)
    options.setdefault("cache", root / ".cache")
    return board_folder(root / "board", versioned, allow_pickle_read, name=name, **options)


# ---- HTTP -----------------------------------------------------------------------------------
def board_url(path: str, pin_paths: dict[str, str | list[str]] | None = None, cache: Any = None,
              allow_pickle_read: bool | None = None, *, name: str | None = None, **options: Any) -> Board:
    """A read-only board behind a URL: its `data.txt`, else its `_pins.yaml` (R `board_url()`), or
    the pins you list as `pin_paths` (name -> version folder under `path`, as pins-python's
    `board_url(path, pin_paths)`). Credentials in the URL or `headers=` go to its origin only.

    Args:
        path: The board's http(s) URL.
        pin_paths: ``{pin name: version folder (or its list of files) under path}`` (None: read the index).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        name: The board's name (None: made from the URL, e.g. ``host-8000-team``).
        **options: The board's other options, e.g. ``headers`` for every request to its origin.

    Returns:
        A read-only `Board`.
    """
    from .backends.url_board import UrlStorage

    name = name or _name_from_url(path)
    spec = _spec("url", url=path, pins=pin_paths, cache=cache, **options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return UrlStorage(name, path, pins=pin_paths, **rest)

    return _board(storage, spec, name, {"cache": cache, "allow_pickle_read": allow_pickle_read, **options},
                  given=path)


def board_datatxt(url: str, *, cache: Any = None, name: str | None = None, **options: Any) -> Board:
    """A read-only board behind a URL with a data.txt index only (R's `board_register_datatxt`).

    Args:
        url: The board's http(s) URL (its ``data.txt`` is read from there).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        name: The board's name (None: made from the URL, e.g. ``host-8000-team``).
        **options: The board's other options, e.g. ``headers`` for every request to its origin.

    Returns:
        A read-only `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    from .backends.url_board import datatxt_storage

    name = name or _name_from_url(url)
    spec = _spec("datatxt", url=url, cache=cache, **options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return datatxt_storage(name, url, **rest)

    return _board(storage, spec, name, {"cache": cache, **options})


# ---- buckets ------------------------------------------------------------------------------
def board_s3(path: str, versioned: bool = True, cache: Any = None, allow_pickle_read: bool | None = None, *,
             name: str | None = None,
             endpoint_url: str | None = None, create_bucket: bool = False, **storage_options: Any) -> Board:
    """A board in `s3://<bucket>/<folder>` (`path` is `bucket/folder`) through s3fs; credentials from
    options or the AWS chain. `endpoint_url` reaches S3-compatible stores.

    Args:
        path: ``bucket/folder`` (or ``s3://bucket/folder``).
        versioned: Keep every version of a pin (False: only the newest).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        name: The board's name (None: ``"s3"``).
        endpoint_url: An S3-compatible store's URL (None: AWS).
        create_bucket: Create the bucket when it does not exist.
        **storage_options: For s3fs (``key``, ``secret``, ``client_kwargs``, ...) and the board's own
            options (``max_extract_bytes``, ...).

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    bucket, folder = _bucket_path("s3", path)
    return _bucket_board("s3", bucket, folder, versioned=versioned, cache=cache, name=name,
                         allow_pickle_read=allow_pickle_read,
                         endpoint_url=endpoint_url, create_bucket=create_bucket, **storage_options)


def board_gcs(path: str, versioned: bool = True, cache: Any = None, allow_pickle_read: bool | None = None, *,
              name: str | None = None,
              endpoint_url: str | None = None, create_bucket: bool = False, **storage_options: Any) -> Board:
    """A board in `gs://<bucket>/<folder>` (`path` is `bucket/folder`) through gcsfs; credentials from
    `token=` or Google's default chain. `endpoint_url` reaches an emulator.

    Args:
        path: ``bucket/folder`` (or ``gs://bucket/folder``).
        versioned: Keep every version of a pin (False: only the newest).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        name: The board's name (None: ``"gcs"``).
        endpoint_url: An emulator's or other endpoint's URL (None: Google Cloud Storage).
        create_bucket: Create the bucket when it does not exist.
        **storage_options: For gcsfs (``token``, ``project``, ...) and the board's own options
            (``max_extract_bytes``, ...).

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    bucket, folder = _bucket_path("gcs", path)
    return _bucket_board("gcs", bucket, folder, versioned=versioned, cache=cache, name=name,
                         allow_pickle_read=allow_pickle_read,
                         endpoint_url=endpoint_url, create_bucket=create_bucket, **storage_options)


def board_azure(path: str, versioned: bool = True, cache: Any = None, allow_pickle_read: bool | None = None, *,
                name: str | None = None, create_bucket: bool = False, **storage_options: Any) -> Board:
    """A board in Azure Blob Storage `abfs://<container>/<folder>` (`path` is `container/folder`) through
    adlfs; credentials from `connection_string=`, `account_name=` with `account_key=` / `sas_token=` /
    `credential=`, or the `AZURE_STORAGE_*` variables (pins-python's `board_azure`).

    Args:
        path: ``container/folder`` (or ``abfs://container/folder``).
        versioned: Keep every version of a pin (False: only the newest).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        name: The board's name (None: ``"azure"``).
        create_bucket: Create the container when it does not exist.
        **storage_options: For adlfs (``connection_string``, ``account_name``, ``account_key``, ...) and
            the board's own options (``max_extract_bytes``, ...).

    Returns:
        The `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    container, folder = _bucket_path("azure", path)
    return _azure_board(container, folder, versioned=versioned, cache=cache, name=name,
                        allow_pickle_read=allow_pickle_read, create_bucket=create_bucket, **storage_options)


def _azure_board(container: str, folder: str, *, versioned: bool = True, cache: Any = None,
                 name: str | None = None, create_bucket: bool = False, allow_pickle_read: bool | None = None,
                 **storage_options: Any) -> Board:
    from .backends.azure_board import azure_storage

    spec = _spec("azure", container=container, path=folder or None, versions=versioned, cache=cache,
                 **storage_options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return azure_storage(name, container, folder, create_bucket=create_bucket, **rest)

    options = {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read, **storage_options}
    return _board(storage, spec, name or _location_name("azure", container, folder), options,
                  given=f"{container}/{folder.strip('/')}".rstrip("/"))


def _bucket_board(kind: str, bucket: str, folder: str, *, versioned: bool = True, cache: Any = None,
                  name: str | None = None, endpoint_url: str | None = None, create_bucket: bool = False,
                  allow_pickle_read: bool | None = None, **storage_options: Any) -> Board:
    from .backends.cloud import gcs_storage, s3_storage

    make = s3_storage if kind == "s3" else gcs_storage
    spec = _spec(kind, bucket=bucket, path=folder or None, endpoint_url=endpoint_url, versions=versioned,
                 cache=cache, allow_pickle_read=allow_pickle_read, **storage_options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return make(name, bucket, folder, endpoint_url=endpoint_url, create_bucket=create_bucket, **rest)

    options = {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read, **storage_options}
    return _board(storage, spec, name or _location_name(kind, bucket, folder), options,
                  given=f"{bucket}/{folder}".rstrip("/"))


# ---- Kaggle -------------------------------------------------------------------------------
def board_kaggle(token: str | os.PathLike[str] | None = None, *, cache: Any = None, name: str = "kaggle",
                 **options: Any) -> Board:
    """Kaggle's datasets (`owner/dataset`) and competitions (`c/name`), read-only; `token` is a
    kaggle.json or an access-token file (default: the kaggle client's own lookup).

    Args:
        token: A kaggle.json or access-token file (None: the kaggle client's own lookup).
        cache: A `Cache`, or the folder of one (None: the user cache folder, ``$PINSTORM_CACHE`` or the
            platform's).
        name: The board's name.
        **options: The board's other options.

    Returns:
        A read-only `Board` (not registered: pass it as ``board=`` or to `board_register`).
    """
    from .backends.kaggle_board import KaggleStorage

    spec = _spec("kaggle", token=str(token) if token else None, cache=cache, **options)

    def storage(name: str, **rest: Any) -> StorageBase:
        return KaggleStorage(name, token=token, **rest)

    return _board(storage, spec, name, {"cache": cache, **options})


# ---- the kind table: the one list of board kinds (the registry, the CLI, docs and errors read it) ----
class Kind(NamedTuple):
    """One row of `KINDS`: how a kind's board is made from `board_register`'s options.

    Args:
        make: ``make(name, options)`` -> the `Board` (`options`: the spec without ``kind``).
        required: The options the kind cannot do without (``url``, ``bucket``...).
        description: One line for the CLI's help and the docs.
    """

    make: Callable[[str, dict[str, Any]], Board]
    required: tuple[str, ...]
    description: str


def _need(kind: str, name: str, options: dict[str, Any], key: str, what: str) -> Any:
    value = options.pop(key, None)
    if not value:
        raise BoardError(f"{kind} board {name!r} needs {what}")
    return value


def _make_local(name: str, options: dict[str, Any]) -> Board:
    return board_local(options.pop("versions", True), name=name, **options)


def _make_folder(name: str, options: dict[str, Any]) -> Board:
    if options.get("path"):
        return board_folder(options.pop("path"), options.pop("versions", True), name=name, **options)
    return board_local(options.pop("versions", True), name=name, **options)


def _make_url(name: str, options: dict[str, Any]) -> Board:
    url = _need("url", name, options, "url", "a url (the board's base URL)")
    return board_url(url, options.pop("pins", None), name=name, **options)


def _make_datatxt(name: str, options: dict[str, Any]) -> Board:
    return board_datatxt(_need("datatxt", name, options, "url", "a url (the board's base URL)"), name=name, **options)


def _make_bucket(kind: str) -> Callable[[str, dict[str, Any]], Board]:
    def make(name: str, options: dict[str, Any]) -> Board:
        bucket = _need(kind, name, options, "bucket", "a bucket")
        return _bucket_board("gcs" if kind == "gcloud" else kind, bucket, options.pop("path", "") or "",
                             versioned=options.pop("versions", True), name=name, **options)
    return make


def _make_azure(name: str, options: dict[str, Any]) -> Board:
    container = options.pop("container", None) or options.pop("bucket", None)  # the CLI's --bucket
    if not container:
        raise BoardError(f"azure board {name!r} needs a container (container= or bucket=)")
    return _azure_board(container, str(options.pop("path", "") or ""), versioned=options.pop("versions", True),
                        name=name, **options)


def _make_kaggle(name: str, options: dict[str, Any]) -> Board:
    return board_kaggle(name=name, **options)


# kind -> how its board is made. An http(s) URL given where a kind is expected is a "url" board.
KINDS: dict[str, Kind] = {
    "local": Kind(_make_local, (), "a folder (path=; default: the user data folder, $PINSTORM_BOARD)"),
    "folder": Kind(_make_folder, (), "a folder (path=), as pins-python's board_folder"),
    "url": Kind(_make_url, ("url",), "an http(s) board: its data.txt, else its _pins.yaml, or pins= paths"),
    "datatxt": Kind(_make_datatxt, ("url",), "a read-only http(s) board indexed by data.txt"),
    "s3": Kind(_make_bucket("s3"), ("bucket",), "an S3 bucket (bucket=, path= a prefix, endpoint_url=)"),
    "gcs": Kind(_make_bucket("gcs"), ("bucket",), "a Google Cloud Storage bucket (bucket=, path=)"),
    "gcloud": Kind(_make_bucket("gcloud"), ("bucket",), "the same as gcs"),
    "azure": Kind(_make_azure, ("bucket",), "an Azure Blob container (container= or bucket=, path=)"),
    "kaggle": Kind(_make_kaggle, (), "Kaggle datasets and competitions, read-only"),
}
"""The kind table, the one list of board kinds: kind -> `Kind` (its constructor, required options and a
description). `board_register`, `board_from_spec`, ``pinstorm board register`` (its help and checks) and
error messages read it; a new backend adds a row here. An http(s) URL where a kind is expected is a
``url`` board."""


def is_http_url(text: Any) -> bool:
    """Whether `text` is an http(s) URL (where a kind is expected, a "url" board).

    Args:
        text: Anything.
    """
    return isinstance(text, str) and text.lower().startswith(("http://", "https://"))


def kinds_text() -> str:
    """The kinds as one phrase for help and error messages: ``local, folder, ... or an http(s) URL``."""
    return ", ".join(KINDS) + " or an http(s) URL"


def _from_kind(kind: str, name: str, options: dict[str, Any]) -> Board:
    """The board of `kind` with `board_register`'s options (bucket=, path=, url=, ...)."""
    row = KINDS.get(kind)
    if row is None:
        raise BoardError(f"unknown board kind {kind!r}; use one of {kinds_text()}")
    return row.make(name, dict(options))


def board_from_spec(spec: dict[str, Any], name: str | None = None) -> Board:
    """The board `{"kind": ..., **options}` describes (`Board.spec` gives one back); `kind` may be an
    http(s) URL (a URL board).

    Args:
        spec: ``{"kind": ..., **options}``: a kind (``"folder"``, ``"local"``, ``"url"``, ``"datatxt"``,
            ``"s3"``, ``"gcs"``, ``"azure"``, ``"kaggle"``, ...) or an http(s) URL, and the constructor's options.
        name: The board's name (None: the kind's default name).

    Returns:
        The `Board` (not registered).
    """
    options = {k: v for k, v in spec.items() if k != "kind"}
    kind = str(spec.get("kind") or "local")
    if is_http_url(kind):
        options["url"] = kind
        kind = "url"
    board = _from_kind(kind, name or default_board_name(kind if kind != "url" else options["url"]), options)
    board._spec = dict(spec)  # as given: a registered board keeps its own spelling
    return board


def default_board_name(kind: str) -> str:
    """The name a board of `kind` (or an http(s) URL) gets when none is given."""
    if is_http_url(kind):
        return _name_from_url(kind)
    return "gcs" if kind == "gcloud" else kind


def _name_from_url(url: str) -> str:
    """A name from the URL without its credentials: `http://host:8000/team/` -> `host-8000-team`."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", secrets.strip_url(url).split("://", 1)[-1]).strip("-")
    return slug.removesuffix("-data-txt") or "datatxt"


def _location_name(kind: str, bucket: str, folder: str) -> str:
    """A bucket board's default name, `s3-<bucket>-<folder>`: its cached versions live under it, so two
    boards in different places must not share it (pins-python keys its cache by the board's path)."""
    import hashlib

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{kind}-{bucket}-{folder}".rstrip("-/")).strip("-.")
    if len(slug) > 80:
        slug = f"{slug[:70]}-{hashlib.sha256(slug.encode()).hexdigest()[:8]}"
    return slug


def _bucket_path(kind: str, path: str) -> tuple[str, str]:
    """`bucket/folder` (or `s3://bucket/folder`) -> (bucket, folder)."""
    text = str(path)
    for scheme in ("s3://", "gs://", "gcs://", "abfs://", "az://"):
        text = text.removeprefix(scheme)
    bucket, _, folder = text.strip("/").partition("/")
    if not bucket:
        raise BoardError(f"{kind} board: path must be 'bucket' or 'bucket/folder', got {path!r}")
    return bucket, folder
