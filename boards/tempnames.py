"""Temporary names that say who owns them, so a later call can remove what a killed process left.

Every temporary file or folder pinstorm creates (a version being written on a board, a version being
downloaded into the cache, the TMPDIR staging folder of `pin()`) carries `.tmp-<pid>-<host>-<rand>`
(staging: `pinstorm-stage-<pid>-<host>-<rand>`). A name whose owner is gone is abandoned: on this
host, when no process has that pid; on another host (a shared folder), when it is older than a day.
A recycled pid only delays the clean-up; it never removes a live writer's files.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

TMP_MARK = ".tmp-"
STAGE_PREFIX = "pinstorm-stage-"
FOREIGN_MAX_AGE = 24 * 3600.0  # seconds before another host's temporary is presumed abandoned
_OWNER = re.compile(r"(?:\.tmp-|^pinstorm-stage-)(\d+)-([A-Za-z0-9_-]{1,40})-[0-9a-z_]+$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:40] or "host"


def owner_tag() -> str:
    """`<pid>-<host>-<random>`: unique, and tells a later process whether the owner still runs."""
    return f"{os.getpid()}-{_host()}-{uuid.uuid4().hex[:8]}"


def tmp_name(final: str | os.PathLike) -> str:
    """A temporary sibling name for `final` (a path or a key), marked with its owner."""
    return f"{os.fspath(final)}{TMP_MARK}{owner_tag()}"


def is_temporary(name: str) -> bool:
    return TMP_MARK in name or name.startswith(STAGE_PREFIX)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    except OSError:
        return True
    return True


def is_abandoned(path: Path) -> bool:
    """True when `path` is a temporary whose owning process is gone (never for live owners)."""
    m = _OWNER.search(path.name)
    if m is None:
        # an old-style name without an owner: abandoned once it has not changed for a day
        return is_temporary(path.name) and _age(path) > FOREIGN_MAX_AGE
    pid, host = int(m.group(1)), m.group(2)
    if host != _host():
        return _age(path) > FOREIGN_MAX_AGE
    return pid != os.getpid() and not _pid_alive(pid)


def _age(path: Path) -> float:
    try:
        return time.time() - path.lstat().st_mtime
    except OSError:
        return 0.0


def sweep(folder: str | os.PathLike, *, prefix: str = "") -> list[Path]:
    """Remove the abandoned temporaries directly inside `folder`; returns what was removed."""
    removed = []
    try:
        children = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in children:
        if not entry.name.startswith(prefix) or not is_temporary(entry.name):
            continue
        path = Path(entry.path)
        if not is_abandoned(path):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue  # another process removed it first
        except OSError:
            continue  # not ours to remove (permissions): leave it
    return removed


def staging_dir() -> Path:
    """A private (mode 0700, unpredictable name) staging folder in TMPDIR, after sweeping the
    abandoned ones that killed processes left there."""
    sweep(tempfile.gettempdir(), prefix=STAGE_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-{_host()}-"))
