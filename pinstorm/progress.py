"""Progress for work that takes more than a moment: on a terminal, in a notebook, and in a log.

How progress is shown depends on where it goes (`renderer()`): rich's live bar on a terminal, and in
a notebook that has ipywidgets (rich draws there through a widget); a plain text bar redrawn in place
with a carriage return in a notebook without ipywidgets, where rich would only warn 'install
"ipywidgets"' and show nothing. Off a terminal (a pipe, a log file, CI) a live bar would leave
nothing readable, so long work writes a plain line every `PINSTORM_PROGRESS_INTERVAL` seconds (30 by
default) and a last line when it ends, and work shorter than that writes nothing: a log of a
two-hour `convert` shows it advancing, a log of a quick `pin_get` stays clean.
`PINSTORM_PROGRESS=0` turns all of it off; `PINSTORM_PROGRESS=1` writes lines a few seconds apart
from the start.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import os
import sys
import threading
import time
from typing import Callable, Iterator, Literal, TextIO

from rich.filesize import decimal
from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeRemainingColumn, TransferSpeedColumn)

Renderer = Literal["rich", "notebook-text", "lines", "log"]

# Seconds between two redraws of a text bar: often enough to look alive in a notebook, rarely enough
# that a log file forced to show progress stays readable.
NOTEBOOK_INTERVAL = 0.25
LINES_INTERVAL = 5.0
LOG_INTERVAL = 30.0   # off a terminal, unless PINSTORM_PROGRESS_INTERVAL says otherwise


def in_notebook() -> bool:
    """True inside a Jupyter (or Colab) kernel: IPython puts `get_ipython` in builtins there."""
    get_ipython = getattr(builtins, "get_ipython", None)
    if get_ipython is None:
        return False
    try:
        shell = type(get_ipython())
    except Exception:  # a broken or foreign get_ipython is no notebook
        return False
    return shell.__name__ == "ZMQInteractiveShell" or shell.__module__.startswith("google.colab")


def _forced() -> bool | None:
    """PINSTORM_PROGRESS as a choice: True (on), False (off), or None (not set: decide by where it goes)."""
    value = os.environ.get("PINSTORM_PROGRESS")
    return None if value is None else value.strip().lower() not in {"0", "false", "no", ""}


def progress_enabled() -> bool:
    """Whether progress is shown at all: always, unless PINSTORM_PROGRESS turns it off (off a terminal
    only long work shows it, as log lines: see the module docstring)."""
    return _forced() is not False


def log_interval() -> float:
    """Seconds between two progress lines in a log (PINSTORM_PROGRESS_INTERVAL, default 30)."""
    try:
        return max(float(os.environ.get("PINSTORM_PROGRESS_INTERVAL", LOG_INTERVAL)), 0.0)
    except ValueError:
        return LOG_INTERVAL


def renderer() -> Renderer:
    """Which kind of progress suits the current stderr (see the module docstring)."""
    if in_notebook():
        return "rich" if importlib.util.find_spec("ipywidgets") is not None else "notebook-text"
    if sys.stderr.isatty():
        return "rich"
    return "lines" if _forced() else "log"


@contextlib.contextmanager
def progress_bar(description: str, total: float | None, *, unit: str = "bytes",
                 enabled: bool | None = None) -> Iterator[Callable[[float], None]]:
    """Yield `advance(n)`: a bar where one can be seen (see `renderer`), a no-op elsewhere.

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
        kind = renderer()
        if kind == "rich":
            with _rich_bar(description, total, unit) as advance:
                yield advance
        else:
            bar = TextBar(description, total, unit, sys.stderr, in_place=kind == "notebook-text",
                          interval=log_interval() if kind == "log" else None, quiet_start=kind == "log")
            try:
                yield bar.advance
            finally:
                bar.close()
    finally:
        with _active_lock:
            _active = False


_active = False
_active_lock = threading.Lock()


@contextlib.contextmanager
def _rich_bar(description: str, total: float | None, unit: str) -> Iterator[Callable[[float], None]]:
    columns = [TextColumn("{task.description}"), BarColumn()]
    columns += ([DownloadColumn(), TransferSpeedColumn()] if unit == "bytes" else [MofNCompleteColumn()])
    columns.append(TimeRemainingColumn())
    lock = threading.Lock()
    with Progress(*columns, transient=True, refresh_per_second=8, console=None) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: float) -> None:
            with lock:
                bar.advance(task, n)

        yield advance


class TextBar:
    """A plain text bar, `description: 45% |#########           | 9/20 pins, 3 s`, on one stream.

    `in_place` redraws one line with a carriage return (a notebook's output cell honours it);
    otherwise each redraw is a line of its own. Redraws are at least `interval` seconds apart (by
    `clock`), and `close` writes the final state, so the last thing shown is the truth.
    `quiet_start` (a log): nothing is written before `interval` has passed, and `close` writes only
    when something was, so work shorter than one interval leaves no line.
    """

    WIDTH = 20

    def __init__(self, description: str, total: float | None, unit: str, stream: TextIO, *,
                 in_place: bool, interval: float | None = None, quiet_start: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.description, self.total, self.unit, self.stream = description, total, unit, stream
        self.in_place = in_place
        self.interval = interval if interval is not None else (
            NOTEBOOK_INTERVAL if in_place else LINES_INTERVAL)
        self.clock = clock
        self.done = 0.0
        self.started = clock()
        self.quiet_start = quiet_start
        self._last: float | None = self.started if quiet_start else None
        self._drawn = False
        self._lock = threading.Lock()

    def advance(self, n: float) -> None:
        with self._lock:
            self.done += n
            now = self.clock()
            if self._last is None or now - self._last >= self.interval:
                self._draw(now)

    def close(self) -> None:
        with self._lock:
            if self.quiet_start and not self._drawn:
                return
            self._draw(self.clock())
            if self.in_place:
                self.stream.write("\n")
                self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = f"{now - self.started:.0f} s"
        unit = "" if self.unit == "bytes" else f" {self.unit}"
        if not self.total:
            return f"{self.description}: {self._amount(self.done)}{unit}, {elapsed}"
        fraction = min(self.done / self.total, 1.0)
        filled = round(fraction * self.WIDTH)
        bar = "#" * filled + " " * (self.WIDTH - filled)
        return (f"{self.description}: {fraction:4.0%} |{bar}| "
                f"{self._amount(self.done)}/{self._amount(self.total)}{unit}, {elapsed}")

    def _amount(self, value: float) -> str:
        return decimal(int(value)) if self.unit == "bytes" else f"{value:g}"

    def _draw(self, now: float) -> None:
        self._last = now
        self._drawn = True
        text = self.line(now)
        self.stream.write(f"\r{text}" if self.in_place else f"{text}\n")
        self.stream.flush()
