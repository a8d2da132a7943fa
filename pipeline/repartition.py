"""One pin per ImageNet category, so each worker fetches only the categories it converts.

`repartition` stores every class folder of a tree as its own pin (named by its wnid, zipped by
default: one object per category is far cheaper to move than 1,300 small files) plus a
``categories`` pin: a DataFrame with ``id`` (wnid), ``name`` and ``images``.
`imagenet_partition(p, n, board)` fetches categories p of n through the board's cache, in
parallel, and returns the data map `convert` takes. This is the scheme of RStudio's "ImageNet with
R and pins" (2020), where 16 workers each fetched 1/16 of the categories from a GCS board.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .contracts import DataMap
from .errors import InvalidPipelineInput, PipelineError
from .layout import Layout, is_image_name, scan
from pinstorm.progress import progress_bar
from pinstorm.boards.safety import secrets
from pinstorm import boards

log = secrets.logger(__name__)

CATEGORIES_PIN = "categories"
# How many categories are pinned at once by default, measured (bench/bench_repartition.py, docs/pipeline.md,
# "One pin per category"). Into a local folder the work is zipping, hashing and small file writes under
# the GIL: threads only add contention (4 threads were 1.9x slower than 1 on 2 cores), so the categories
# are shared among worker processes, one per core (at most `MAX_PROCESSES`: only 2 cores were measured),
# each pinning in a batch it hands to the parent's, which indexes them all once. A worker is forked
# (milliseconds); on 2 cores (tmpfs, 5 rounds, bench/results/repartition_process_threshold.json and
# repartition_tmpfs.json) two took 1.5x the time of one at 400 images, 1.1x at 1,000, 0.82x at 2,000,
# 0.74x at 4,000 and 0.62x at 40,000: so one process below
# `PROCESS_MIN_IMAGES` images, or where only a spawned worker is safe (~1 s to import pinstorm).
# Into a bucket each pin waits on requests, and eight threads were the fastest of 1, 2, 4 and 8
# (moto S3, 100 categories of 40 JPEGs).
LOCAL_KINDS = frozenset({"folder", "local"})
PROCESS_MIN_IMAGES = 2_000
MAX_PROCESSES = 8
REMOTE_PARALLEL = 8
# How often a worker process reports the categories it pinned: a message a category cost the parent
# 0.1 s of CPU at 1,000 categories, on a core the workers need (~8% of the time).
PROGRESS_EVERY = 0.2


def repartition(root, board, zip: bool = True, parallel: int | None = None, *, progress: bool | None = None):
    """Pin each train category of the tree at `root` (a folder or a `Layout`) to `board`; return the categories.

    Pins: one per non-empty category, named by its wnid, holding its image files (a zip when
    `zip=True`), with the human name as description; then ``categories`` (every class of the layout,
    empty ones with 0 images, so labels stay the layout's), a DataFrame of ``id``, ``name``, ``images``,
    written last, in the same batch, so a reader never sees a categories list whose pins are not all there.
    `parallel` categories are pinned at once: by worker processes into a local folder, by threads into
    any other board (default `default_parallel`). Returns the categories DataFrame.
    Validation images are not pinned: convert them straight from the layout (``split="val"``).

    Args:
        root: The tree: a folder (`scan`ned) or a `Layout`.
        board: A registered board's name or a writable `Board`.
        zip: Pin each category's images as one zip archive (else as separate files).
        parallel: Categories pinned at once (None: `default_parallel`, measured).
        progress: Show a progress bar (None: where one can be seen).

    Returns:
        The ``categories`` DataFrame (``id``, ``name``, ``images``), as pinned.

    Raises:
        RepartitionWorkerDied: A worker process stopped without a word (killed); what it stored is on
            the board, listed by the next write or `pinstorm board repair`.
    """

    import pandas as pd

    layout = root if isinstance(root, Layout) else scan(root)
    items = layout.items("train")
    by_class: dict[str, list[str]] = {wnid: [] for wnid in layout.classes}
    for path, wnid in items:
        by_class.setdefault(wnid, []).append(path)
    # Every class of the layout is listed, empty ones included (with 0 images, and no pin): labels are
    # indexes into this list, so dropping one would renumber every later class.
    classes = sorted(by_class)
    jobs = [(wnid, by_class[wnid], layout.names.get(wnid, wnid)) for wnid in classes if by_class[wnid]]

    target = boards.resolve_board(board)  # one Board object: the batch below is per object
    workers = min(parallel or default_parallel(target, images=len(items)), max(len(jobs), 1))
    categories = pd.DataFrame({"id": classes, "name": [layout.names.get(w, w) for w in classes],
                               "images": [len(by_class[w]) for w in classes]})

    def store_categories() -> None:
        # last, in the same batch: the index lists the categories pin and its categories in one update,
        # and whoever lists the board's folders instead never sees a list whose pins are not all there
        target.store(categories, name=CATEGORIES_PIN,
                     description=f"{len(classes)} categories of {layout.root}, one pin each")

    if workers > 1 and target.kind in LOCAL_KINDS:
        _pin_in_processes(target, jobs, zip, workers, progress, last=store_categories)
    else:
        # One batch: the board's indexes are published once, after the last pin, so a category costs the
        # same on a board of 21,841 as on one of 10 (docs/boards.md, "ImageNet-sized boards").
        with target.batch():
            with progress_bar("repartition", len(jobs), unit="categories", enabled=progress) as advance, \
                    ThreadPoolExecutor(max_workers=workers) as pool:
                for future in [pool.submit(_pin_category, target, zip, job) for job in jobs]:
                    future.result()
                    advance(1)
            store_categories()
    return categories


def default_parallel(board, images: int | None = None) -> int:
    """Categories `repartition` pins at once when not told (see `LOCAL_KINDS` and `PROCESS_MIN_IMAGES`).

    Args:
        board: The board pinned to (a name, a spec or a `Board`).
        images: The images to pin (None: many).

    Returns:
        Into a local folder: one worker process per usable core (at most `MAX_PROCESSES`) where a worker
        can be forked and there are at least `PROCESS_MIN_IMAGES` images, else 1. Into any other board:
        `REMOTE_PARALLEL` threads.
    """
    if boards.resolve_board(board).kind not in LOCAL_KINDS:
        return REMOTE_PARALLEL
    if (images is not None and images < PROCESS_MIN_IMAGES) or _process_context().get_start_method() != "fork":
        return 1
    return min(_usable_cores(), MAX_PROCESSES)


class RepartitionWorkerDied(PipelineError, OSError):
    """A `repartition` worker process stopped without finishing or reporting an error (it was killed)."""


def _pin_category(board, zip: bool, job: tuple[str, list[str], str]) -> None:
    """Pin one category: its files under its wnid, its human name as description."""
    wnid, files, name = job
    # `store`, not `pin`: `pin` reads each version back, which unpacks every zip into the cache
    # again (on a bucket board, downloads it first): 3/4 of the time at 1,000 categories
    board.store(files, name=wnid, zip=zip, description=name,
                metadata={"wnid": wnid, "name": name, "images": len(files)})


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _process_context():
    """fork where it is safe (Linux, and no other thread in this process that a child could inherit
    mid-lock): a worker starts in milliseconds with the board and the job list; else spawn."""
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _pin_in_processes(board, jobs: list, zip: bool, workers: int, progress: bool | None,
                      last: Callable[[], None]) -> None:
    """Pin `jobs` with `workers` processes, each taking the next category as it is free (so a core
    slowed by other work takes fewer) and pinning in a batch it hands to this one; then call `last` in
    that batch: one index write in all. The first error stops the others after their current category
    and is raised here, with its type (`last` is not called)."""
    context = _process_context()
    claimed = context.Value("q", 0)   # index of the next job to take
    done = context.Queue()
    procs = [context.Process(target=_pin_worker, args=(board, zip, jobs, claimed, done),
                             name=f"repartition-{i}", daemon=True) for i in range(workers)]
    for p in procs:  # before the progress bar, which may start a thread, and before this batch opens
        p.start()
    ended: set[int] = set()
    error: BaseException | None = None
    try:
        # Workers hand what they pinned to this batch: one index update for all, where each worker's own
        # update re-read the data.txt of every pin the others had stored (0.6 s of 2.2 at 1,000 categories)
        with board.batch(), \
                progress_bar("repartition", len(jobs), unit="categories", enabled=progress) as advance:
            while len(ended) < len(procs):
                try:
                    pid, what, value = done.get(timeout=0.5)
                except queue.Empty:
                    for p in procs:  # killed: it never reported its end
                        if p.pid not in ended and p.exitcode not in (None, 0):
                            ended.add(p.pid)
                            error = error or RepartitionWorkerDied(
                                f"repartition worker {p.name} (pid {p.pid}) stopped with exit code {p.exitcode}; "
                                "the categories it pinned are on the board, listed by the next write or "
                                "`pinstorm board repair`")
                    if error is not None:
                        _stop(claimed, len(jobs))
                    continue
                if what == "pinned":
                    advance(value)
                    continue
                if what == "written":
                    board.adopt(value)
                    continue
                ended.add(pid)
                if what == "failed" and error is None:
                    error = pickle.loads(value)
                    _stop(claimed, len(jobs))
            if error is None:
                last()
    finally:
        for p in procs:
            if error is not None or len(ended) < len(procs):  # interrupted: nothing left running
                p.join(timeout=5 if error is not None else 0)
                if p.is_alive():
                    p.terminate()
            p.join()
        done.close()
    if error is not None:
        raise error


def _stop(claimed, total: int) -> None:
    with claimed.get_lock():
        claimed.value = total


def _pin_worker(board, zip: bool, jobs: list, claimed, done) -> None:
    """A worker process: take the next job index from `claimed` until none is left and pin it, reporting
    ``(pid, "pinned", count)`` every `PROGRESS_EVERY` seconds and at the end; then hand over what its
    batch wrote, ``(pid, "written", {pin: metadata})`` (for the parent's batch to index), and end with
    ``(pid, "finished", None)`` or ``(pid, "failed", pickled error)``."""
    pid = os.getpid()
    pinned, reported = 0, time.monotonic()
    try:
        with board.batch(hand_over=lambda written: done.put((pid, "written", written))):
            while True:
                with claimed.get_lock():
                    i = claimed.value
                    claimed.value = i + 1
                if i >= len(jobs):
                    break
                _pin_category(board, zip, jobs[i])
                pinned += 1
                if time.monotonic() - reported >= PROGRESS_EVERY:
                    done.put((pid, "pinned", pinned))
                    pinned, reported = 0, time.monotonic()
            if pinned:
                done.put((pid, "pinned", pinned))
    except BaseException as e:  # noqa: BLE001 - any error goes back to the parent, which raises it
        done.put((pid, "failed", _portable(e)))
    else:
        done.put((pid, "finished", None))
    finally:
        done.close()
        done.join_thread()  # the report is in the pipe before this process exits


def _portable(error: BaseException) -> bytes:
    """`error` pickled, or, where it does not survive pickling, a `PipelineError` saying what it was."""
    try:
        data = pickle.dumps(error)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an error class pickle cannot rebuild
        return pickle.dumps(PipelineError(f"{type(error).__name__}: {error}"))


def imagenet_partition(partition: int, partitions: int, board, parallel=None, *, extract: bool = True) -> DataMap:
    """Fetch categories `partition` of `partitions` (0-based) from `board` and return a data map.

    The categories pin is sorted by id and cut into `partitions` contiguous, near-equal slices.
    Returns ``{"image": [paths], "category": [wnid per image], "categories": [wnids of this slice],
    "classes": [every wnid on the board], "names": {wnid: name}}``. `convert` labels by `classes`
    (the whole list), so slices converted by different workers agree on labels.
    `parallel` is passed to `boards.pin_get_many` (threads by default).

    Args:
        partition: This slice's index, from 0.
        partitions: How many slices the categories are cut into.
        board: A registered board's name or a `Board` holding `repartition`'s pins.
        parallel: As `pin_get_many`'s (None: threads).
        extract: Unpack the categories' zip archives (the data map then lists the images).

    Returns:
        The data map (a frozen `DataMap`, also read by key as above), ready for `convert`.
    """
    classes, mine, wanted, names = category_slice(partition, partitions, board)
    fetched = boards.pin_get_many(wanted, board=board, parallel=parallel, extract=extract)
    image, category = [], []
    for wnid in wanted:
        files = category_files(fetched[wnid])
        image += files
        category += [wnid] * len(files)
    return DataMap(image=image, category=category, categories=mine, classes=classes, names=names)


def category_slice(partition: int, partitions: int, board) -> tuple[list[str], list[str], list[str], dict[str, str]]:
    """(every wnid, this slice's wnids, those of them with a pin, {wnid: name}): `imagenet_partition`'s cut
    of the categories pin, without fetching a category (`convert(board://..., spark=)` fetches them on
    the executors).

    Args:
        partition: This slice's index, from 0.
        partitions: How many slices the categories are cut into.
        board: A registered board's name, a spec or a `Board` holding `repartition`'s pins.
    """
    if not isinstance(partitions, int) or partitions < 1:
        raise InvalidPipelineInput(f"partitions must be a positive integer, got {partitions!r}")
    if not isinstance(partition, int) or not 0 <= partition < partitions:
        raise InvalidPipelineInput(f"partition must be in [0, {partitions}) (0-based), got {partition!r}")
    table = boards.pin_get(CATEGORIES_PIN, board=board)
    if not hasattr(table, "columns") or not {"id", "name"} <= set(table.columns):
        raise InvalidPipelineInput(f"pin {CATEGORIES_PIN!r} on board {board!r} is not a categories table "
                                   "(id, name, images); was the board made by repartition()?")
    table = table.sort_values("id").reset_index(drop=True)
    classes = [str(c) for c in table["id"]]
    if partitions > len(classes):
        raise InvalidPipelineInput(f"{partitions} partitions of {len(classes)} categories would leave some empty")
    start, stop = partition * len(classes) // partitions, (partition + 1) * len(classes) // partitions
    mine = classes[start:stop]
    counts = dict(zip(classes, table["images"])) if "images" in table.columns else {}
    wanted = [wnid for wnid in mine if counts.get(wnid, 1) > 0]   # empty categories have no pin
    names = {str(i): str(n) for i, n in zip(table["id"], table["name"])}
    return classes, mine, wanted, names


def category_files(fetched) -> list[str]:
    """The image files of one fetched category pin (what `pin_get` returned), sorted, as `imagenet_partition`
    lists them."""
    paths = [fetched] if isinstance(fetched, (str, os.PathLike)) else fetched
    return sorted(p for p in map(os.fspath, paths) if is_image_name(os.path.basename(p)))
