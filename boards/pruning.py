"""Deleting what is old, and only that: which versions `pin_versions_prune` may delete, and
`cache_prune` for the local cache.

The rules live here once; `Board.pin_versions_prune` applies them to a board's listing."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from filelock import FileLock

from .cache import Cache
from .metadata import version_time

PRUNE_GRACE = 0.0  # seconds: pin_versions_prune(grace=) keeps versions younger than this (pins-python: none)


def check_prune_rules(n: int | None, days: float | None, grace: float | None) -> None:
    if n is None and days is None:
        raise ValueError("pin_versions_prune: give n= (versions to keep) or days= (age to keep)")
    if n is not None and int(n) < 1:
        raise ValueError(f"pin_versions_prune: n must be at least 1, got {n}")
    if days is not None and days < 0:
        raise ValueError(f"pin_versions_prune: days must be >= 0, got {days}")
    if grace is None or not grace >= 0:
        raise ValueError(f"pin_versions_prune: grace must be >= 0 seconds, got {grace}")


def versions_to_prune(versions: list[str], n: int | None, days: float | None) -> list[str]:
    """The versions (oldest first) that neither rule keeps: not among the newest `n`, not created in
    the last `days`. The newest version and undated (hand-made) folders are always kept."""
    keep = {versions[-1]} if versions else set()
    if n is not None:
        keep.update(versions[-int(n):])
    if days is not None:
        cutoff = time.time() - float(days) * 86400
        for v in versions:
            created = version_time(v)
            if created is None or created >= cutoff:
                keep.add(v)
    return [v for v in versions if v not in keep]


def version_age(version: str, stored: float | None) -> float:
    """Seconds since `version` was created and stored (the younger of the two); -inf when unknown,
    so no grace period ever lets it go by mistake."""
    known = [t for t in (version_time(version), stored) if t is not None]
    return time.time() - max(known) if known else float("-inf")


def cache_prune(days: float = 30, cache: str | Path | Cache | None = None, prompt: bool | None = None, *,
                cache_root: str | Path | None = None, dry_run: bool = False) -> list[str]:
    """Delete cached pin versions not used in the last `days` days; returns the folders removed.

    pins-python's arguments: `cache_root` is `cache`; `prompt=True` asks before deleting (the default,
    None, asks only when standard input is a terminal, as pins-python's prompt does in a session).

    "Used" is the newest of the version's data.txt access and modification times (access times
    are coarse on most mounts, at worst a day, which is fine at this scale). A version being
    downloaded or read under the cache's file lock is skipped.

    Args:
        days: Versions not used for this many days are deleted.
        cache: A `Cache`, or the folder of one (None: the user cache folder).
        prompt: Ask before deleting (None: only when standard input is a terminal).
        cache_root: pins-python's name for `cache`.
        dry_run: Only list what would be deleted.

    Returns:
        The version folders removed (with `dry_run`, those that would be).
    """
    if cache is None and cache_root is not None:
        cache = cache_root
    cache = cache if isinstance(cache, Cache) else Cache(cache)
    if prompt or (prompt is None and not dry_run and sys.stdin is not None and sys.stdin.isatty()):
        stale = cache_prune(days, cache, dry_run=True)
        if not stale:
            print("No stale pins found")
            return []
        answer = input(f"Delete {len(stale)} cached pin version(s) unused for {days} days? [yN] ")
        if answer.strip().lower() != "y":
            return []
    cutoff = time.time() - float(days) * 86400
    removed: list[str] = []
    if not cache.root.is_dir():
        return removed
    for data_txt in sorted(cache.root.glob("*/*/*/data.txt")):
        folder = data_txt.parent
        if folder.name.startswith(".") or folder.parent.name.startswith((".", "_")):
            continue
        stat = data_txt.stat()
        if max(stat.st_atime, stat.st_mtime) >= cutoff:
            continue
        if dry_run:
            removed.append(str(folder))
            continue
        lock = FileLock(str(folder) + ".lock", timeout=0)
        try:
            with lock:
                gone = folder.with_name(f".{folder.name}.pruned-{os.getpid()}")
                os.replace(folder, gone)  # readers never see a half-deleted version
                shutil.rmtree(gone, ignore_errors=True)
                removed.append(str(folder))
        except (TimeoutError, OSError):
            continue
    return removed
