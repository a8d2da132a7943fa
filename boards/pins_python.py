"""pins-python's remaining module-level API: `board(protocol, path, ...)`, `BaseBoard(path, fs)`,
`board_deparse(board)` and `cache_info()` (`cache_prune` is pruning.cache_prune).

Each returns or takes an ordinary pinstorm `Board`: `board("s3", "bucket/folder")` is
`board_s3("bucket/folder")`, and `BaseBoard(path, fs=fsspec_filesystem)` is the board of that kind
over that very filesystem object (its credentials and endpoint included).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .board import Board
from .errors import BoardError, NotSupported


def _protocols(fs: Any) -> set[str]:
    prot = getattr(fs, "protocol", "file")
    return {prot} if isinstance(prot, str) else set(prot)


def board(protocol: str, path: str = "", versioned: bool = True, cache: Any = None,
          allow_pickle_read: bool | None = None, storage_options: dict[str, Any] | None = None,
          board_factory: Any = None) -> Board:
    """pins-python's `board()`: the board of `protocol` ("file", "s3", "gs"/"gcs", "abfs"/"az",
    "http(s)") at `path`; `storage_options` go to the storage (credentials, endpoint_url, ...)."""
    from . import constructors as c

    if board_factory is not None:
        raise NotSupported("board(..., board_factory=) is pins-python's internal hook; pinstorm has none")
    opts = dict(storage_options or {})
    if protocol in ("file", "local"):
        return c.board_folder(path, versioned, allow_pickle_read, cache=cache, **opts)
    if protocol in ("s3", "s3a"):
        return c.board_s3(path, versioned, cache, allow_pickle_read, **opts)
    if protocol in ("gs", "gcs"):
        return c.board_gcs(path, versioned, cache, allow_pickle_read, **opts)
    if protocol in ("abfs", "az", "azure"):
        return c.board_azure(path, versioned, cache, allow_pickle_read=allow_pickle_read, **opts)
    if protocol in ("http", "https"):
        return c.board_url(path, opts.pop("pin_paths", None), cache, allow_pickle_read, **opts)
    raise NotSupported(f"board(): no board for protocol {protocol!r}; use file, s3, gcs, abfs or http(s)")


class _BaseBoardType(type):
    """`BaseBoard(path, fs)` makes a `Board`; `isinstance(b, BaseBoard)` holds for every `Board`."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Board:
        return _base_board(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Board)


class BaseBoard(metaclass=_BaseBoardType):
    """pins-python's `BaseBoard(board, fs, versioned=True, allow_pickle_read=None)`: see `_base_board`."""


def _base_board(board: str, fs: Any, versioned: bool = True, meta_factory: Any = None,
                allow_pickle_read: bool | None = None, cache: Any = None) -> Board:
    """pins-python's `BaseBoard(board, fs)`: a board at path `board` of fsspec filesystem `fs`
    (a local folder, an s3fs or gcsfs filesystem).

    Args:
        board: The board's path on `fs` (a folder, or ``bucket/folder``).
        fs: An fsspec filesystem: local, s3fs or gcsfs.
        versioned: Keep every version of a pin (False: only the newest).
        meta_factory: Accepted for pins-python's signature; not used.
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``,
            else no).
        cache: A `Cache`, or the folder of one (None: the user cache folder).

    Returns:
        The `Board` of that kind (`board_folder`, `board_s3` or `board_gcs`).

    Raises:
        NotSupported: `fs` is of another protocol.
    """
    from .constructors import _board, _spec

    prots = _protocols(fs)
    if prots & {"file", "local"}:
        from .backends.fs_board import FolderStorage

        root = Path(board).expanduser().resolve()

        def folder(name: str, **rest: Any) -> Any:
            return FolderStorage(name, root, kind="folder", **rest)

        return _board(folder, _spec("folder", path=str(root), versions=versioned), root.name or "folder",
                      {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read}, given=board)
    kind = "s3" if prots & {"s3", "s3a"} else "gcs" if prots & {"gs", "gcs"} else \
        "azure" if prots & {"abfs", "az"} else None
    if kind is None:
        raise NotSupported(f"BaseBoard: no pinstorm board over a {sorted(prots)} filesystem; "
                           "use file, s3, gcs or abfs")
    from .backends.cloud import BucketStorage, S3Storage
    from .constructors import _bucket_path

    bucket, folder = _bucket_path(kind, board)
    root = f"{bucket}/{folder}".rstrip("/")
    endpoint = getattr(fs, "endpoint_url", None) or (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")
    cls: type[BucketStorage] = S3Storage if kind == "s3" else BucketStorage
    if kind == "azure":
        from .backends.azure_board import AzureStorage

        cls, endpoint = AzureStorage, None  # the account's endpoint stays in the filesystem object

    def bucket_storage(name: str, **rest: Any) -> Any:
        return cls(name, fs, root, kind=kind, bucket=bucket, endpoint=endpoint, **rest)

    from .constructors import _location_name

    return _board(bucket_storage, _spec(kind, bucket=bucket, path=folder or None, versions=versioned),
                  _location_name(kind, bucket, folder),
                  {"versions": versioned, "cache": cache, "allow_pickle_read": allow_pickle_read}, given=board)


def board_deparse(board: Board) -> str:
    """pins-python's: the constructor call that makes `board` again, as text (credentials left out).

    Args:
        board: A folder, S3, GCS, Azure or URL `Board`.

    Returns:
        The call, e.g. ``board_folder('/data/team')``.

    Raises:
        NotSupported: A board of another kind.
    """
    pickle = "" if board.allow_pickle_read is None else f", allow_pickle_read={board.allow_pickle_read!r}"
    kind = board.kind
    where = board.board
    if kind in ("folder", "local"):
        return f"board_folder({where!r}{pickle})"
    if kind in ("s3", "gcs", "azure"):
        return f"board_{kind}({where!r}{pickle})"
    if kind == "url":
        return f"board_url({where!r}, {board.spec.get('pins')!r}{pickle})"
    raise NotSupported(f"board deparsing currently not supported for a {kind} board")


def cache_info(cache_root: str | os.PathLike[str] | None = None) -> dict[str, int]:
    """pins-python's: prints the cache folder and each board's size in it; returns {board: bytes}.

    Args:
        cache_root: The cache folder (None: the user cache folder).

    Returns:
        ``{board: bytes}`` of the cache's board folders.
    """
    from .cache import default_cache_root

    root = Path(cache_root) if cache_root else default_cache_root()
    sizes: dict[str, int] = {}
    print(f"Cache info: {root}")
    for p in sorted(root.glob("*")) if root.is_dir() else []:
        if p.is_dir():
            sizes[p.name] = sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
            print(f"* {p.name}: {sizes[p.name]:,} B")
    return sizes


__all__ = ["BaseBoard", "board", "board_deparse", "cache_info", "BoardError"]
