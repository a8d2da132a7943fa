"""pinstorm boards: find, pin, cache and share data sets on storage boards.

A Python take on R's `pins`: register boards (a local folder, S3, Google Cloud Storage, Kaggle, or
any web server holding a `data.txt` index), pin data sets as versioned folders in the pins 1.x
layout, and get them back through a local cache that makes loads fast and works offline.
"""

from .api import (batch, pin, pin_delete, pin_download, pin_exists, pin_find, pin_get, pin_info, pin_list,
                  pin_meta, pin_read, pin_remove, pin_search, pin_upload, pin_version_delete, pin_versions,
                  pin_versions_prune, pin_write, write_board_manifest)
from .board import Board
from .cache import Cache, StaleCacheWarning
from .constructors import (board_azure, board_datatxt, board_folder, board_from_spec, board_gcs, board_kaggle,
                           board_local, board_s3, board_temp, board_url)
from .errors import (BoardError, BoardNotRegistered, CredentialsError, DownloadError, IndexNotWritten, IntegrityError,
                     InvalidPinName, MalformedMetadata, PinNotFound, ReadOnlyBoard, UnsafeArchive,
                     VersionNotFound)
from .errors import AddressInUse, ArchiveTooLarge, DiskFull, LimitExceeded, UnsafePath
from .metadata import PinMetadata, VersionInfo
from .errors import MalformedParquet, ParquetLimitExceeded
from .safety.archive import ExtractLimits
from .pruning import cache_prune
from .errors import NotSupported, PinsError, PinsInsecureReadError, PinsVersionError
from .pins_python import BaseBoard, board_deparse, cache_info
from . import pins_python as _pins_python
from .registry import KINDS, board_deregister, board_get, board_list, board_names, board_register, resolve_board
from .parallel import PinFetchError, pin_get_many
from .serve import serve_board
from .storage import Maintenance, Storage, StorageBase


__all__ = [
    "Board", "BoardError", "batch", "BoardNotRegistered", "Cache", "CredentialsError", "DownloadError",
    "IndexNotWritten", "IntegrityError", "InvalidPinName", "MalformedMetadata", "PinNotFound", "ReadOnlyBoard",
    "AddressInUse", "PinFetchError", "StaleCacheWarning", "UnsafeArchive", "VersionNotFound", "board_deregister", "board_get",
    "board_list", "board_register", "pin", "pin_find", "pin_get", "pin_get_many", "pin_info",
    "pin_remove", "pin_versions", "serve_board", "board_names", "resolve_board", "KINDS",
    # constructors (no registration) and the storage protocol behind every board
    "board_azure", "board_datatxt", "board_folder", "board_from_spec", "board_gcs", "board_kaggle", "board_local", "board_s3",
    "board_temp", "board_url", "Maintenance", "Storage", "StorageBase",
    # bounds and containment of untrusted boards (docs/boards.md, "Security model")
    "ArchiveTooLarge", "DiskFull", "ExtractLimits", "LimitExceeded", "MalformedParquet", "ParquetLimitExceeded",
    "UnsafePath",
    # pins 1.x / pins-python names
    "PinMetadata", "VersionInfo", "cache_prune", "pin_delete", "pin_download", "pin_exists", "pin_list", "pin_meta",
    "pin_read", "pin_search", "pin_upload", "pin_version_delete", "pin_versions_prune", "pin_write",
    "write_board_manifest",
    # pins-python's module-level API and errors (`boards.board(protocol, path, ...)` is callable too: see below)
    "BaseBoard", "NotSupported", "PinsError", "PinsInsecureReadError", "PinsVersionError", "board_deparse",
    "cache_info",
]


def _callable_board_module() -> None:
    """`boards.board(protocol, path, ...)` is pins-python's `board()`, while `pinstorm.boards.board`
    stays the module that defines `Board` (so imports and patches of it keep working)."""
    import sys
    import types

    module = sys.modules[__name__ + ".board"]

    class _BoardModule(types.ModuleType):
        def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            return _pins_python.board(*args, **kwargs)

    module.__class__ = _BoardModule


_callable_board_module()
