"""Room on a disk, checked before a transfer starts: a 155 GB download must fail at once with the
numbers, not after an hour with a bare ENOSPC."""

from __future__ import annotations

import contextlib
import errno
import shutil
from pathlib import Path

from ..errors import BoardError, DiskFull

# kept free beyond what a transfer needs: 1 GiB, or 2% of a small disk
def reserve(total: int) -> int:
    return min(1 << 30, total // 50)


def free_bytes(folder: str | Path) -> tuple[int, int] | None:
    """(free, total) bytes of the disk holding `folder` (or its nearest existing parent); None if unknown."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.free, usage.total


def require_room(folder: str | Path, needed: int, *, what: str) -> None:
    """Raise DiskFull unless `needed` bytes (plus the reserve) fit on the disk of `folder`."""
    usage = free_bytes(folder)
    if usage is None or needed <= 0:
        return
    free, total = usage
    if needed + reserve(total) > free:
        raise DiskFull(f"{what} needs {needed:,} bytes in {folder}, but its disk has {free:,} bytes free "
                       f"(and keeps {reserve(total):,} in reserve); free some space or point the cache "
                       "elsewhere (PINSTORM_CACHE)")


_FULL = {errno.ENOSPC, errno.EDQUOT}
_DENIED = {errno.EACCES, errno.EPERM, errno.EROFS}


@contextlib.contextmanager
def storage_errors(what: str, where: str | Path):
    """Turn a full disk or a refused write inside the block into one clear error naming `what` (the
    pin), the path and the free space, instead of a bare `OSError: [Errno 28]`."""
    try:
        yield
    except BoardError:
        raise
    except OSError as e:
        path = e.filename2 or e.filename or where  # a copy names its source first, the full disk second
        if e.errno in _FULL:
            usage = free_bytes(path)
            room = f"{usage[0]:,} bytes free" if usage else "free space unknown"
            raise DiskFull(f"{what}: no space left writing {path} ({room}); the board is as it was") from e
        if e.errno in _DENIED or isinstance(e, PermissionError):
            raise BoardError(f"{what}: not allowed to write {path} ({e.strerror or e}); the board is as it "
                             "was") from e
        raise
