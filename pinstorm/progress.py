"""Progress bars for transfers that take more than a moment, quiet when not on a terminal.

`PINSTORM_PROGRESS=1` forces bars on (e.g. in a notebook), `PINSTORM_PROGRESS=0` forces them off.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Callable, Iterator

from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)


def progress_enabled() -> bool:
    forced = os.environ.get("PINSTORM_PROGRESS")
    if forced is not None:
        return forced not in {"0", "false", "no", ""}
    return sys.stderr.isatty()


@contextlib.contextmanager
def progress_bar(description: str, total: float | None, *, unit: str = "bytes",
                 enabled: bool | None = None) -> Iterator[Callable[[float], None]]:
    """Yield `advance(n)`; a rich bar on a terminal (shown after half a second), a no-op elsewhere.

    `advance` is thread-safe, so parallel downloads can share one bar. While a bar is shown, nested
    requests (one pin inside a parallel fetch) get a no-op: the outer bar already tells the story.
    `enabled` forces the bar on or off for this call only (None: decide as `progress_enabled`).
    """
    global _active
    wanted = progress_enabled() if enabled is None else enabled
    with _active_lock:
        nested = _active
        _active = _active or wanted
    if nested or not wanted:
        yield lambda n: None
        return
    try:
        with _bar(description, total, unit) as advance:
            yield advance
    finally:
        with _active_lock:
            _active = False


_active = False
_active_lock = threading.Lock()


@contextlib.contextmanager
def _bar(description: str, total: float | None, unit: str) -> Iterator[Callable[[float], None]]:
    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += ([DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()])
    columns.append(TimeRemainingColumn())
    lock = threading.Lock()
    with Progress(*columns, transient=True, refresh_per_second=8,
                  console=None) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: float) -> None:
            with lock:
                bar.advance(task, n)

        yield advance
