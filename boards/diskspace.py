"""Room on a disk, checked before a transfer starts: a 155 GB download must fail at once with the
numbers, not after an hour with a bare ENOSPC."""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import DiskFull

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
