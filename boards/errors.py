"""Exceptions raised by pinstorm's boards.

Every error a user can cause or meet derives from :class:`BoardError`, so scripts can catch one class,
and each message names the pin, board, file or URL involved.
"""

from __future__ import annotations

from pinstorm.errors import PinstormError


class BoardError(PinstormError):
    """Base class of every boards error."""


class InvalidPinName(BoardError, ValueError):
    """A pin name that is unsafe as a folder name on common filesystems."""


class BoardNotRegistered(BoardError, KeyError):
    """A board name that was never registered (or was deregistered)."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "board not registered"


class PinNotFound(BoardError, KeyError):
    """No pin of that name on the board."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "pin not found"


class VersionNotFound(PinNotFound):
    """The pin exists, but not the version asked for (or the prefix is ambiguous)."""


class MalformedMetadata(BoardError, ValueError):
    """A data.txt (pin metadata or board index) that cannot be parsed or lacks required fields."""


class UnsafeArchive(BoardError, ValueError):
    """An archive whose members would land outside the extraction folder."""


class IntegrityError(BoardError):
    """Downloaded bytes whose size or hash differs from what the pin's metadata promises."""


class ReadOnlyBoard(BoardError, PermissionError):
    """A write (pin, remove) on a board that can only be read."""


class DownloadError(BoardError, OSError):
    """A transfer failed: an HTTP status, a refused connection or a truncated body.

    Args:
        message: What failed, and where (credentials left out).
        url: The URL, credentials left out (None: not a URL transfer).
        status: The HTTP status (None: no response).
    """

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


class IndexNotWritten(BoardError, OSError):
    """Pins were stored, but the board's data.txt index naming them could not be written (the next
    write or `pinstorm board repair` lists them)."""


class CredentialsError(BoardError):
    """Credentials for a cloud board are missing or rejected."""


class UnsafePath(BoardError, ValueError):
    """A path or URL named by remote metadata that would land outside its cache folder or board.

    Raised before anything is written; the message names the pin, the offending entry and the board.
    """


class LimitExceeded(BoardError, ValueError):
    """Untrusted input larger than a configured bound (index size, YAML expansion, extracted bytes)."""


class ParquetLimitExceeded(LimitExceeded):
    """A Parquet file (or a row group of it) that would decode to more than the memory budget."""


class MalformedParquet(MalformedMetadata):
    """A Parquet footer or page header that is unreadable or contradicts itself."""


class UnreadableRowGroup(MalformedParquet):
    """A row group whose bytes fail to decode (a page checksum, a damaged page): the file is corrupt,
    which a reader of checksummed data (the pipeline) reports as its own corruption error."""


class ArchiveTooLarge(LimitExceeded, UnsafeArchive):
    """An archive that expands past the extraction limits (a zip or gzip bomb, or just too big)."""


class DiskFull(BoardError, OSError):
    """A download, extraction or write does not fit on its disk: names the folder and the numbers."""


# ---- pins-python's names (pins.errors): a script's `except` clauses written for pins-python catch --------
PinsError = BoardError
"""pins-python's base error: every pinstorm boards error is one."""


class PinsVersionError(BoardError):
    """pins-python's: `versioned=False` on a pin that already has several versions (delete it first)."""


class PinsInsecureReadError(BoardError):
    """pins-python's: reading a pickle (`type="joblib"`) from a board whose user did not allow it with
    `allow_pickle_read=True` (or `PINS_ALLOW_PICKLE_READ=1`)."""


class NotSupported(BoardError, NotImplementedError):
    """What pins-python answers with NotImplementedError: an unknown `type=`, `pin_read` of a file pin,
    `pin_write(..., type="file")` (use `pin_upload`)."""


class AddressInUse(BoardError, OSError):
    """`board serve` asked for a port another process holds: names the address and how to get a free one."""
