"""`pin_get_many`: fetch and extract many pins at once, with one progress bar.

Fetching a partition of an image data set means hundreds of small pins; one at a time, each pays its
round trips (listing, data.txt, files) in turn. Threads overlap them and are the default: transfers
and zlib release the GIL, and threads share the board's connections and event loop, which is what
s3fs and gcsfs need (a forked child that inherits their event loop hangs). Processes are available
for boards whose work is CPU-bound in Python; they are started with `forkserver` (or `spawn`), never
plain `fork`, and receive the board by pickling, so each builds its own connections.

A failing pin never stops the others: every failure is collected and reported at the end.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import multiprocessing
import os
from typing import Any, Callable, Iterable

from .board import Board
from .errors import BoardError
from pinstorm.progress import progress_bar
from .registry import resolve_board

DEFAULT_THREADS = 16
_ERROR_MODES = ("raise", "return")


class PinFetchError(BoardError):
    """Some pins of a `pin_get_many` call failed; `.results` holds the others, `.errors` the failures.

    Args:
        message: Which pins failed, and why.
        results: ``{name: what pin_get returned}`` of the pins that succeeded.
        errors: ``{name: exception}`` of the pins that failed.
    """

    def __init__(self, message: str, results: dict[str, Any] | None = None,
                 errors: dict[str, BaseException] | None = None):
        super().__init__(message)
        self.results = results or {}
        self.errors = errors or {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.results, self.errors))


def _plan(parallel: Any, n: int) -> tuple[str, int]:
    """(pool kind, workers) from the `parallel` argument."""
    if parallel is None or parallel is True:
        return "threads", max(1, min(DEFAULT_THREADS, n))
    if parallel is False:
        return "threads", 1
    if isinstance(parallel, int):
        if parallel < 0:
            raise ValueError(f"parallel must be >= 0, got {parallel}")
        return "threads", max(1, min(parallel, n))
    if isinstance(parallel, str):
        kind, _, count = parallel.partition(":")
        if kind not in ("threads", "processes"):
            raise ValueError(f"parallel must be None, a number of threads, 'threads', 'processes' or "
                             f"'processes:N', got {parallel!r}")
        default = DEFAULT_THREADS if kind == "threads" else (os.cpu_count() or 1)
        try:
            workers = int(count) if count else default
        except ValueError:
            raise ValueError(f"parallel={parallel!r}: the worker count after ':' must be a number") from None
        return kind, max(1, min(workers, n))
    raise TypeError(f"parallel must be None, an int or a str, got {type(parallel).__name__}")


# -- process workers: the board arrives once per process, by pickling ------------------------
_worker_board: Board | None = None


def _init_worker(board: Board) -> None:
    global _worker_board
    _worker_board = board


def _fetch_in_worker(name: str, options: dict[str, Any]) -> Any:
    assert _worker_board is not None
    return _worker_board.pin_get(name, **options)


def _process_context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _served_from_cache(board: Board, names: list[str]) -> list[str]:
    """The `names` whose `pin_get` on `board` needs no request now: the index the board holds for the call
    (`hold_index`) gives the pin's newest version (`versions_held`) and the cache has that version. Stops
    at the first failure to read the index (a board out of reach: the threads serve what the cache has)."""
    held = getattr(board.storage, "versions_held", None)
    here: list[str] = []
    if held is None:
        return here
    for name in names:
        try:
            versions = held(name)
        except Exception:  # noqa: BLE001 - pin_get in the threads says what is wrong
            break
        try:
            if versions and (board.cache.version_dir(board.name, name, versions[-1]) / "data.txt").is_file():
                here.append(name)
        except Exception:  # noqa: BLE001 - an unusable name or version: pin_get in the threads names it
            continue
    return here


def pin_get_many(names: Iterable[str], board: str | Board | None = None, parallel: Any = None,
                 extract: bool | None = None, errors: str = "raise", *, cache: bool = True, files: bool = False,
                 download: bool = True) -> dict[str, Any]:
    """Fetch (and extract) many pins of one board concurrently; returns {name: what pin_get returns}.

    `parallel`: None (threads, up to 16), an int (that many threads; 1 = one at a time),
    "threads", "processes", or "processes:N". `errors="raise"` raises `PinFetchError` at the end
    when any pin failed (it carries `.results` and `.errors`); `errors="return"` puts the exception
    objects in the returned dict instead. `cache`, `files` and `download` mean what they mean for
    `pin_get`, for every pin.

    Args:
        names: The pins' names (a list, not one string).
        board: A registered board's name, a `Board`, or None for the default board.
        parallel: None (threads, up to 16), a number of threads, ``"threads"``, ``"processes"`` or
            ``"processes:N"``.
        extract: As `pin_get`'s, for every pin.
        errors: ``"raise"`` (`PinFetchError` at the end when any pin failed) or ``"return"`` (the
            exceptions in the returned dict).
        cache: As `pin_get`'s.
        files: As `pin_get`'s.
        download: As `pin_get`'s.

    Returns:
        ``{name: what pin_get returns}`` (with ``errors="return"``, an exception for a pin that failed).

    Raises:
        PinFetchError: With ``errors="raise"``, some pins failed (``.results`` and ``.errors`` hold both).
    """
    if isinstance(names, str):
        raise TypeError("pin_get_many takes a list of pin names; for one pin use pin_get")
    if errors not in _ERROR_MODES:
        raise ValueError(f"errors must be one of {_ERROR_MODES}, got {errors!r}")
    names = list(dict.fromkeys(names))  # once each, in the order given
    options: dict[str, Any] = {"extract": extract, "cache": cache, "files": files, "download": download}
    target = resolve_board(board)
    results: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}
    if not names:
        return results
    kind, workers = _plan(parallel, len(names))
    # a board that can keep its index (data.txt over HTTP) or one listing (a bucket) for the call reads it
    # once for all the pins
    hold = getattr(target.storage, "hold_index", None)
    with (hold(names) if hold is not None else contextlib.nullcontext()), \
            progress_bar(f"pins from {target.name}", len(names), unit="pins") as advance:
        def settle(name: str, outcome: Callable[[], Any]) -> None:
            try:
                results[name] = outcome()
            except Exception as e:  # noqa: BLE001 - reported at the end with the pin's name
                failures[name] = e
            advance(1)

        rest = names
        if kind == "threads" and cache:
            # pins whose newest version the held index names and the cache holds need no request: served
            # here, one after another (16 threads taking turns on the GIL made each ~3x dearer)
            here = _served_from_cache(target, names)
            for name in here:
                settle(name, functools.partial(target.pin_get, name, **options))
            served = set(here)
            rest = [name for name in names if name not in served]
        if kind == "threads" and rest:
            # The first pin goes alone: it does the board's one-time work (sign-in, session, the
            # data.txt index) that would otherwise have every thread queue for the same lock at once.
            settle(rest[0], functools.partial(target.pin_get, rest[0], **options))
            rest = rest[1:]
        if kind == "threads" and workers == 1:
            for name in rest:
                settle(name, functools.partial(target.pin_get, name, **options))
        elif rest:
            pool: cf.Executor
            if kind == "threads":
                pool = cf.ThreadPoolExecutor(workers, thread_name_prefix="pin-get")
                futures = {pool.submit(target.pin_get, n, **options): n for n in rest}
            else:
                pool = cf.ProcessPoolExecutor(workers, mp_context=_process_context(),
                                              initializer=_init_worker, initargs=(target,))
                futures = {pool.submit(_fetch_in_worker, n, options): n for n in rest}
            try:
                for future in cf.as_completed(futures):
                    settle(futures[future], future.result)
            except BaseException:  # Ctrl-C: drop what has not started
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
    ordered = {n: results[n] for n in names if n in results}
    if failures and errors == "raise":
        lines = [f"  {n}: {type(e).__name__}: {e}" for n, e in failures.items()]
        raise PinFetchError(f"{len(failures)} of {len(names)} pins failed on board {target.name!r} "
                            f"({len(ordered)} fetched):\n" + "\n".join(lines),
                            results=ordered, errors=failures)
    if failures:
        return {n: results[n] if n in results else failures[n] for n in names}
    return ordered
