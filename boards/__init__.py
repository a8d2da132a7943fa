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
from .constructors import (board_datatxt, board_folder, board_from_spec, board_gcs, board_kaggle, board_local,
                           board_s3, board_temp, board_url)
from .errors import (BoardError, BoardNotRegistered, CredentialsError, DownloadError, IndexNotWritten, IntegrityError,
                     InvalidPinName, MalformedMetadata, PinNotFound, ReadOnlyBoard, UnsafeArchive,
                     VersionNotFound)
from .errors import ArchiveTooLarge, DiskFull, LimitExceeded, UnsafePath
from .metadata import PinMetadata, VersionInfo
from .parquet_limits import MalformedParquet, ParquetLimitExceeded
from .archive import ExtractLimits
from .pruning import cache_prune
from .registry import board_deregister, board_get, board_list, board_names, board_register
from .parallel import PinFetchError, pin_get_many
from .serve import serve_board
from .storage import Storage, StorageBase


__all__ = [
    "Board", "BoardError", "batch", "BoardNotRegistered", "Cache", "CredentialsError", "DownloadError",
    "IndexNotWritten", "IntegrityError", "InvalidPinName", "MalformedMetadata", "PinNotFound", "ReadOnlyBoard",
    "PinFetchError", "StaleCacheWarning", "UnsafeArchive", "VersionNotFound", "board_deregister", "board_get",
    "board_list", "board_register", "pin", "pin_find", "pin_get", "pin_get_many", "pin_info",
    "pin_remove", "pin_versions", "serve_board", "board_names",
    # constructors (no registration) and the storage protocol behind every board
    "board_datatxt", "board_folder", "board_from_spec", "board_gcs", "board_kaggle", "board_local", "board_s3",
    "board_temp", "board_url", "Storage", "StorageBase",
    # bounds and containment of untrusted boards (docs/boards.md, "Security model")
    "ArchiveTooLarge", "DiskFull", "ExtractLimits", "LimitExceeded", "MalformedParquet", "ParquetLimitExceeded",
    "UnsafePath",
    # pins 1.x / pins-python names
    "PinMetadata", "VersionInfo", "cache_prune", "pin_delete", "pin_download", "pin_exists", "pin_list", "pin_meta",
    "pin_read", "pin_search", "pin_upload", "pin_version_delete", "pin_versions_prune", "pin_write",
    "write_board_manifest",
]
