"""A bounded local cache of a remote dataset's parts, shared by every reader on the machine (``stream=True``).

Why: ImageNet-21k does not fit a training node's disk, and eight ranks on one node should not fetch the same
bytes eight times. Without streaming a remote dataset is read straight from object storage every epoch, and a
``board://`` pin is fetched whole; with it, a reader asks this cache for a local path of each part as its
epoch plan needs it, and tells it the plan so the next parts are fetched ahead (`PartStream`).

The rules, each kept under one machine-wide file lock (``<root>/.lock``, `filelock`, no shared memory):

* The cache never holds more than ``limit`` bytes: verified parts plus the reservations of downloads in
  flight (a download reserves the part's recorded size before its first byte). What it holds is kept by
  `part_ledger` (a journal each process reads incrementally), not found by a scan of every file. When a part does not fit,
  verified parts that no reader holds are evicted, least recently used first (`CacheFullError` when
  everything is held for longer than the wait, or when one part is larger than the limit).
* A reader *holds* each part it reads (a hold file naming its process); eviction never removes a part being
  read, and holds of processes that died are dropped. A part fetched ahead is held more lightly: it is
  evicted only for a reader waiting for the part it reads next, when nothing unheld is left (so readers
  stalled with parts ahead, a rank waiting in an all-reduce, never stall another); its reader then fetches
  it again. Only verified parts, which the source can give again, are evicted: the cache is a copy, never
  the only one.
* Threads of one process queue for a file lock on an in-process lock first (`machine_lock`): filelock's
  own waits poll, and a reader and its fetchers taking turns at 50 ms a poll cost a cold epoch over half
  its time where the reader waits for downloads (bench/bench_streaming_fetchers.py).
* One download per part on the machine: the part's own file lock; whoever waits for it finds the part in
  place. Downloads go to a temporary name carrying their owner (`boards.tempnames`) and are checked against
  the part's recorded whole-file xxh3-128 (else its size and footer checksum) before the atomic rename, so a
  process killed mid-download leaves nothing another uses. A part that fails its checksum is fetched once
  more, then named (`CorruptPartError`); a dropped connection resumes with a ranged read from the byte it
  reached; a disk without room for the part fails before a byte is written (`CacheFullError` naming cache
  and limit).

* The unit is a part, or a row group of a big part (`PartCache.whole`, `part_pieces`): a part of many row
  groups larger than `WHOLE_PART_BYTES` or a sixth of the limit is cached as its footer and one piece per
  row group, so each row group is fetched once an epoch in any order and a part larger than the cache
  streams. A piece is verified as a part is: a footer by its checksum, a row group by the xxh3-128 of its
  bytes taken as they arrive (`convert` records it; older datasets: its content checksum and page CRCs).

The root is ``$PINSTORM_CACHE/parts`` (the boards' cache rule); each dataset has a folder named by a hash of
its URL (credentials left out) and of its parts' identity, so another dataset or a changed one never reuses
a file.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import xxhash

from pinstorm.boards.safety import secrets
from pinstorm.boards.cache import default_cache_root
from pinstorm.boards.safety.diskspace import free_bytes, require_room
from pinstorm.boards.errors import DiskFull
from pinstorm.boards.tempnames import is_abandoned, sweep, tmp_name

from .contracts import DatasetInfo
from .errors import PipelineError
from .part_ledger import Ledger
from .part_pieces import TAIL, Piece, PieceSource, footer_span, piece_name, row_group_spans, split_piece
from .ranged_reads import reads_for
from .verify import CHECKSUMMED, CorruptPartError, OpenParts, footer_digest, open_part, read_row_group

WAIT_SECONDS = float(os.environ.get("PINSTORM_PART_CACHE_WAIT", "600"))   # for room held by other readers
AHEAD = 4                  # parts fetched ahead of the reader, at most
# downloads a reader keeps in flight: an object store's first byte takes tens of ms, and one stream of
# ranged GETs after another leaves most of a link idle (a TF reader is one stream)
FETCHERS = int(os.environ.get("PINSTORM_PART_CACHE_FETCHERS", "4"))
# a part of more bytes than this (or than limit / (AHEAD + 2)) is cached by row group, unless it has only one
WHOLE_PART_BYTES = int(os.environ.get("PINSTORM_PART_CACHE_WHOLE_PART", str(64 << 20)))
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
_CACHED = re.compile(_NAME.pattern + r"(\+(footer|[0-9]{1,9}))?")   # a whole part or a piece (`part_pieces`)
# a cached file as the ledger names it: <dataset folder>/<part or piece>, never a lock or a download in flight
_KEY = re.compile(r"[A-Za-z0-9_-]{1,100}/(?!.*\.lock$)(?!.*\.tmp-)" + _CACHED.pattern)
_HOLDS, _RESERVED = ".holds", ".reserved"
LOCK_POLL_SECONDS = 0.002   # between tries of a file lock another process holds (held for ms at a time)

log = secrets.logger("pinstorm.pipeline.part_cache")


class _Stopped(Exception):
    """Raised inside a download when its reader no longer wants the part (`PartStream.close`)."""


class CacheFullError(PipelineError, OSError):
    """The part cache cannot take a part: over its limit with every part held, or no room on its disk."""


class PartFetchError(PipelineError, OSError):
    """A part could not be downloaded into the part cache (the connection failed past the retries)."""


_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _forget_process_locks() -> None:   # a forked child: another thread may have held one at the fork
    global _process_locks, _process_locks_guard
    _process_locks, _process_locks_guard = {}, threading.Lock()


os.register_at_fork(after_in_child=_forget_process_locks)


@contextlib.contextmanager
def machine_lock(path: str | os.PathLike):
    """The file lock at `path`, taken by one thread of this process at a time: the others wait on a thread
    lock, woken the moment it is let go, instead of polling the file lock (filelock gives each thread its
    own, and its waits sleep); other processes are polled every `LOCK_POLL_SECONDS`."""
    from filelock import FileLock

    key = os.fspath(path)
    with _process_locks_guard:
        in_process = _process_locks.setdefault(key, threading.Lock())
    with in_process:
        lock = FileLock(key)
        lock.acquire(poll_interval=LOCK_POLL_SECONDS)
        try:
            yield
        finally:
            lock.release()


def default_root() -> Path:
    return default_cache_root() / "parts"


def default_limit(root: Path) -> int:
    """80% of what the cache's disk could give it: its free bytes (less the boards' reserve) plus what
    the cache holds already."""
    usage = free_bytes(root)
    have = _folder_bytes(root) if root.is_dir() else 0
    if usage is None:
        return 8 << 30
    free, total = usage
    return max(1, int(0.8 * (max(0, free - min(1 << 30, total // 50)) + have)))


def _folder_bytes(root: Path) -> int:
    total = 0
    for entry in root.iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            total += sum(f.stat().st_size for f in entry.iterdir() if f.is_file() and _CACHED.fullmatch(f.name)
                         and not f.name.endswith(".lock") and ".tmp-" not in f.name)
    return total


@dataclass
class Counters:
    """What this process's cache did (for tests and `bench/bench_streaming.py`)."""

    fetched_bytes: int = 0    # part bytes downloaded
    fetches: int = 0          # parts downloaded
    hits: int = 0             # parts found in place
    evicted: int = 0          # parts this process evicted
    refetched: int = 0        # parts downloaded again after a checksum mismatch
    resumed: int = 0          # ranged reads that resumed a cut-off download
    peak_bytes: int = 0       # the most bytes (parts + reservations) this process saw in the cache


COUNTERS = Counters()


def reset_counters() -> Counters:
    """Start counting afresh; returns the counters of before."""
    global COUNTERS
    before, COUNTERS = COUNTERS, Counters()
    return before


class PartCache:
    """The parts of one dataset (`location`, `info` from `pipeline.metadata.read_info`) in a bounded cache.

    Picklable (a DataLoader worker gets a copy): it holds only names, numbers and the source's filesystem.
    """

    def __init__(self, location, info: DatasetInfo, *, limit: int | None = None, root: str | os.PathLike | None = None,
                 retries: int = 2):
        self.location, self.retries, self.info = location, retries, info
        self.sizes = {name: entry.get("bytes") for name, entry in info.files.items()}
        self.entries = info.files
        self._forget()
        self.root = Path(root).expanduser().resolve() if root else default_root().expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.limit = default_limit(self.root) if limit is None else int(limit)
        for name in self.sizes:
            if not _NAME.fullmatch(name) or name.endswith(".lock") or ".tmp-" in name:
                raise CorruptPartError(f"{self.where}: part name {name!r} is not a plain file name")
        url = secrets.strip_url(location.url)
        identity = url + "\n" + "\n".join(f"{n} {e.get('bytes')} {e.get('xxh3') or e.get('footer_xxh3')}"
                                          for n, e in sorted(info.files.items()))
        tail = re.sub(r"[^A-Za-z0-9_-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[-40:] or "dataset"
        self.folder = self.root / f"{tail}-{xxhash.xxh3_64(identity.encode()).hexdigest()}"
        whole = [name for name in self.sizes if self.whole(name)]
        largest = max(whole, key=lambda n: self.sizes[n] or 0, default=None)
        if largest is not None and (self.sizes[largest] or 0) > self.limit:
            raise CacheFullError(f"part cache {self.root} (limit {self.limit:,} bytes): part {url}/{largest} of "
                                 f"{self.sizes[largest]:,} bytes (one row group) does not fit; raise cache_limit")

    @property
    def where(self) -> str:
        return secrets.strip_url(self.location.url)

    def __getstate__(self):
        state = dict(self.__dict__)
        for memo in ("_footers", "_spans", "_footer_spans", "_checkers", "_checking", "_ledger", "_reads",
                     "_choosing_reads"):
            state.pop(memo)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._forget()

    def _forget(self) -> None:
        """What this process learnt of parts cached by row group: footers, their spans, an open checker."""
        self._footers: dict[str, bytes] = {}
        self._spans: dict[str, list[tuple[int, int]]] = {}
        self._footer_spans: dict[str, tuple[int, int]] = {}
        self._checkers: OpenParts | None = None
        self._checking = threading.Lock()
        self._ledger: Ledger | None = None
        self._reads: tuple[int, object, object] | None = None   # (pid, filesystem, `ranged_reads` reader)
        self._choosing_reads = threading.Lock()

    # -- pieces: whole parts, or a part's footer and row groups (`part_pieces`) ----------------------
    def whole(self, name: str) -> bool:
        """Whether part `name` is cached whole: one row group, or small beside `WHOLE_PART_BYTES` and the
        limit (so a reader holds it and the parts ahead); else by row group, each fetched once an epoch."""
        size, entry = self.sizes[name], self.entries[name]
        return entry.get("row_groups", 1) <= 1 or size is None or \
            size <= min(WHOLE_PART_BYTES, self.limit // (AHEAD + 2))

    def pieces(self, planned) -> list[Piece]:
        """The cache files a pass over `planned` ((part, row group) in order) reads: one step for each run of
        row groups of a part cached whole, one step for each row group of a part cached by row group."""
        steps: list[Piece] = []
        for name, rg in planned:
            if not self.whole(name):
                steps.append(Piece(piece_name(name, rg), name, [rg]))
            elif steps and steps[-1].whole and steps[-1].part == name:
                steps[-1].row_groups.append(rg)
            else:
                steps.append(Piece(name, name, [rg]))
        return steps

    def describe(self, piece: str) -> str:
        """Piece `piece` as errors name it: the part's URL, and which row group or its footer."""
        part, what = split_piece(piece)
        return f"{self.where}/{part}" + ("" if what == "whole" else " footer" if what is None else f" row group {what}")

    def known_size(self, piece: str) -> int:
        """Bytes of `piece` (0 for a whole part of unrecorded size): a row group's come from its part's footer."""
        part, what = split_piece(piece)
        if what == "whole":
            return self.sizes[part] or 0
        start, end = self.span(piece)
        return end - start

    def span(self, piece: str) -> tuple[int, int]:
        """The byte range of a footer or row group piece in its part."""
        part, what = split_piece(piece)
        if what is None:
            if part not in self._footer_spans:
                size = self.sizes[part]
                cached = self.path(piece)
                if cached.is_file():   # verified when it came: its size is the footer's
                    self._footer_spans[part] = (size - cached.stat().st_size, size)
                else:
                    tail = self.location.fs.cat_file(self.location.join(part), start=size - TAIL, end=size)
                    COUNTERS.fetched_bytes += len(tail)
                    self._footer_spans[part] = footer_span(tail, size, f"{self.where}/{part}")
            return self._footer_spans[part]
        return self.spans(part)[what]

    def footer(self, part: str) -> bytes:
        """Part `part`'s footer and tail, verified (through the cache, so the machine fetches it once)."""
        if part not in self._footers:
            path, hold = self.acquire(piece_name(part))
            try:
                self._footers[part] = path.read_bytes()
            finally:
                self.release(hold)
        return self._footers[part]

    def spans(self, part: str) -> list[tuple[int, int]]:
        """(start, end) of each row group of `part` (a part cached by row group); one too big for the cache is
        refused before a byte of it is fetched."""
        if part not in self._spans:
            where = f"{self.where}/{part}"
            spans = row_group_spans(self.footer(part), self.sizes[part], where)
            for rg, (start, end) in enumerate(spans):
                if end - start > self.limit:
                    raise CacheFullError(f"part cache {self.root} (limit {self.limit:,} bytes): {where} row group "
                                         f"{rg} of {end - start:,} bytes does not fit; raise cache_limit")
            self._spans[part] = spans
        return self._spans[part]

    def open_pieces(self, part: str, columns=CHECKSUMMED):
        """A part cached by row group, open for reading `columns`: give its source (``handle.source``, a
        `PieceSource`) each row group's cached file (`PieceSource.add_file` at its `span`) before reading it."""
        return open_part(self.location, self.info, part, columns, source=self._source(part))

    def _source(self, part: str) -> PieceSource:
        source = PieceSource(self.sizes[part], f"{self.where}/{part}")
        footer = self.footer(part)
        source.add_bytes(self.sizes[part] - len(footer), footer)
        return source

    # -- paths and the machine-wide lock ----------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.folder / name

    def _lock(self):
        return machine_lock(self.root / ".lock")

    def _holds(self) -> Path:
        return self.root / _HOLDS

    def _reserved(self) -> Path:
        return self.root / _RESERVED

    def _entry(self, name: str) -> str:
        return f"{self.folder.name}@{name}@"

    # -- accounting (under the lock) -------------------------------------------------------------
    def _live(self, folder: Path) -> list[Path]:
        """Hold or reservation files whose owner runs; the rest are removed."""
        alive = []
        try:
            entries = list(folder.iterdir())
        except FileNotFoundError:
            return alive
        for entry in entries:
            if is_abandoned(entry) or entry.name.count("@") != 2:
                with contextlib.suppress(OSError):
                    entry.unlink()
                continue
            alive.append(entry)
        return alive

    def _synced(self) -> Ledger:
        """The cache's files and bytes (`part_ledger`), caught up with every process's changes."""
        if self._ledger is None:
            self._ledger = Ledger(self.root, _KEY)
        self._ledger.sync()
        return self._ledger

    def _key(self, name: str) -> str:
        return f"{self.folder.name}/{name}"

    def _state(self):
        """(the ledger, bytes in the cache with the reservations of downloads in flight, {(dataset folder, part)
        read now}, {(dataset folder, part) fetched ahead})."""
        ledger = self._synced()
        used = ledger.used
        for entry in self._live(self._reserved()):
            with contextlib.suppress(ValueError, IndexError):
                used += int(entry.name.split("@")[2].split(".tmp-")[0])
        reading, ahead = set(), set()
        for entry in self._live(self._holds()):
            folder, part, kind = entry.name.split("@")
            (ahead if kind.startswith("ahead") else reading).add((folder, part))
        return ledger, used, reading, ahead

    def _hold(self, name: str, kind: str = "read") -> Path:
        """Mark part `name` held by this reader (the caller holds the lock and saw the part in place): "read"
        (being read: never evicted) or "ahead" (fetched for later: evicted only when a reader waiting for its
        next part finds nothing else to evict, so no set of readers holding parts ahead can stall another)."""
        self._holds().mkdir(exist_ok=True)
        hold = Path(tmp_name(self._holds() / f"{self._entry(name)}{kind}"))   # names its owner: a dead one's is dropped
        hold.touch()
        self._synced().use(self._key(name))   # recently used: evicted last
        with contextlib.suppress(OSError):
            os.utime(self.path(name))   # the same for a ledger written again from the folders
        return hold

    def release(self, hold: Path) -> None:
        with contextlib.suppress(OSError):
            hold.unlink()

    def upgrade(self, name: str, hold: Path) -> Path | None:
        """Turn an "ahead" hold of part `name` into a "read" hold; None when the part was evicted meanwhile."""
        with self._lock():
            read = self._hold(name) if self.path(name).is_file() else None
        self.release(hold)
        return read

    def _reserve(self, name: str, size: int, *, wait: bool, stop=lambda: False) -> Path | None:
        """Room for `size` bytes, evicting unheld parts least recently used first; a reservation file, or
        None when `wait` is False and there is no room now."""
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            with self._lock():
                ledger, used, reading, ahead = self._state()
                # unheld parts first; then, for a reader waiting for its next part, parts only fetched ahead
                for spare in ((reading | ahead), reading) if wait else ((reading | ahead),):
                    victims = []
                    for key, victim_size in ledger.oldest():   # stops at the first bytes enough: no scan
                        if used + size <= self.limit:
                            break
                        if tuple(key.split("/", 1)) in spare or key == self._key(name):
                            continue
                        victims.append(key)
                        used -= victim_size
                    for key in victims:
                        with contextlib.suppress(FileNotFoundError):
                            (self.root / key).unlink()
                            COUNTERS.evicted += 1
                        ledger.remove(key)
                if used + size <= self.limit:
                    self._reserved().mkdir(exist_ok=True)
                    reservation = Path(tmp_name(self._reserved() / f"{self._entry(name)}{size}"))
                    reservation.touch()
                    COUNTERS.peak_bytes = max(COUNTERS.peak_bytes, used + size)
                    return reservation
            if not wait or stop():
                return None
            if time.monotonic() > deadline:
                raise CacheFullError(f"part cache {self.root} (limit {self.limit:,} bytes): no room for "
                                     f"{self.describe(name)} ({size:,} bytes) after {WAIT_SECONDS:.0f} s: {used:,} "
                                     "bytes are held by readers; raise cache_limit or run fewer readers")
            time.sleep(0.05)

    # -- the one entry point -----------------------------------------------------------------------
    def acquire(self, name: str, *, wait: bool = True, stop=lambda: False,
                kind: str = "read") -> tuple[Path, Path] | None:
        """(local path, hold) of verified part `name`, downloaded if absent (once on the machine); None when
        `wait` is False and the cache has no room now, or `stop()` turned true. The hold (`kind`, see `_hold`)
        keeps it from eviction: `release` it."""
        target = self.path(name)
        with self._lock():
            if target.is_file():
                COUNTERS.hits += 1
                return target, self._hold(name, kind)
        self.folder.mkdir(parents=True, exist_ok=True)
        with machine_lock(str(target) + ".lock"):   # one download of this part on the machine
            with self._lock():
                if target.is_file():   # another reader fetched it while we waited
                    COUNTERS.hits += 1
                    return target, self._hold(name, kind)
            size = self.known_size(name) or int(self.location.fs.size(self.location.join(name)))
            reservation = self._reserve(name, size, wait=wait, stop=stop)
            if reservation is None:
                return None
            try:
                sweep(self.folder)   # downloads that killed readers left
                try:
                    require_room(self.folder, size, what=f"part cache {self.root} (limit {self.limit:,} bytes): "
                                                         f"{self.describe(name)}")
                except DiskFull as error:
                    raise CacheFullError(str(error)) from None
                tmp = Path(tmp_name(target))
                try:
                    if not self._download(name, tmp, size, stop):
                        return None
                    with self._lock():
                        ledger = self._synced()
                        ledger.add(self._key(name), size)   # counted before it is there: a crash overcounts
                        try:
                            os.replace(tmp, target)
                        except BaseException:
                            ledger.remove(self._key(name))
                            raise
                        # in the ledger now: the reservation goes in the same locked step, or another reader
                        # counts the part twice meanwhile and, short of room, evicts a part fetched ahead
                        self.release(reservation)
                        return target, self._hold(name, kind)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        tmp.unlink()
            finally:
                self.release(reservation)

    def _download(self, name: str, tmp: Path, size: int, stop=lambda: False) -> bool:
        """The verified bytes of part `name` in `tmp`: fetched again once if they fail the checksum; False
        when `stop()` turned true first."""
        part, what = split_piece(name)
        for attempt in range(2):
            # a checksum of the bytes taken as they arrive: not read back from the disk (~0.25 ms a MB)
            digest = xxhash.xxh3_128() if self._recorded_digest(name) is not None else None
            if not self._fetch(name, tmp, size, stop, digest):
                return False
            problem = self._check(name, tmp, size, digest)
            if problem is None:
                COUNTERS.fetches += 1
                return True
            if attempt:
                raise CorruptPartError(f"{self.describe(name)}: {problem} after fetching it twice (the part changed "
                                       "after conversion, or the source serves damaged bytes)")
            log.warning("%s: %s; fetching it again", self.describe(name), problem)
            COUNTERS.refetched += 1

    def _ranged_reads(self):
        """How this process reads byte ranges of the parts (`ranged_reads`): chosen once per process and
        filesystem (a forked worker gets its own filesystem, `Location.in_this_process`)."""
        fs = self.location.fs
        reads = self._reads
        if reads is None or reads[0] != os.getpid() or reads[1] is not fs:
            with self._choosing_reads:
                reads = self._reads
                if reads is None or reads[0] != os.getpid() or reads[1] is not fs:
                    reads = self._reads = (os.getpid(), fs, reads_for(fs, self.location.join(next(iter(self.sizes)))))
        return reads[2]

    def _fetch(self, name: str, tmp: Path, size: int, stop=lambda: False, digest=None) -> bool:
        """Piece `name` into `tmp` by ranged reads (`ranged_reads`), its bytes also fed to `digest` if given (in
        file order); a read that fails or comes back short resumes from the byte reached (`retries` times in a
        row without progress). False when `stop()` turned true first."""
        part, what = split_piece(name)
        first = 0 if what == "whole" else self.span(name)[0]   # where the piece starts in its part
        reads, path = self._ranged_reads(), self.location.join(part)
        failures, at = 0, 0

        def take(data: memoryview) -> None:
            nonlocal at
            if at + len(data) > size:
                raise CorruptPartError(f"{self.describe(name)}: the source sent more than the {size - at:,} bytes "
                                       "asked for (it ignores Range requests?)")
            out.write(data)
            if digest is not None:
                digest.update(data)
            at += len(data)
            COUNTERS.fetched_bytes += len(data)
            if stop():
                raise _Stopped

        with open(tmp, "wb") as out:
            while at < size:
                if stop():
                    return False
                problem: object = None
                reached = at
                try:
                    reads.read(path, first + at, first + size, take)
                except _Stopped:
                    return False
                except FileNotFoundError:
                    from .verify import MissingPartError
                    raise MissingPartError(f"{self.where}/{part}: part file missing") from None
                except CorruptPartError:
                    raise
                except Exception as error:   # fsspec backends raise many types for a dropped connection
                    problem = error
                if at < size:
                    failures = failures + 1 if at == reached else 1
                    if failures > self.retries:
                        raise PartFetchError(f"{self.describe(name)}: download stopped at byte {at:,} of {size:,} "
                                             f"after {self.retries} resumed reads: {problem or 'short read'}")
                    COUNTERS.resumed += 1
                    log.warning("%s: download cut at byte %d (%s); resuming with a ranged read", self.describe(name),
                                at, problem or "short read")
        return True

    def _recorded_digest(self, name: str) -> str | None:
        """The xxh3-128 `convert` recorded of piece `name`'s bytes: a whole part's, or a row group's
        (``row_group_bytes_xxh3``; datasets written before those have only a content checksum); None if none."""
        part, what = split_piece(name)
        entry = self.entries[part]
        if what == "whole":
            return entry.get("xxh3")
        if what is not None and "row_group_bytes_xxh3" in entry:
            return entry["row_group_bytes_xxh3"][what]
        return None

    def _check(self, name: str, tmp: Path, size: int, digest=None) -> str | None:
        """Why the downloaded piece `name` in `tmp` is not what `convert` wrote, or None. `digest`: the xxh3 of
        its bytes as they were written (`_fetch`); None: read back from `tmp`."""
        part, what = split_piece(name)
        entry = self.entries[part]
        if tmp.stat().st_size != size:
            return f"{tmp.stat().st_size:,} bytes, expected {size:,}"
        if what is None:   # a footer
            data = tmp.read_bytes()
            if "footer_xxh3" in entry:
                return None if xxhash.xxh3_128(data).hexdigest() == entry["footer_xxh3"] else "footer checksum mismatch"
            return None if data[-4:] == b"PAR1" else "no Parquet magic at the end of the file"
        recorded = self._recorded_digest(name)
        if recorded is not None:
            if digest is None:
                digest = xxhash.xxh3_128()
                with open(tmp, "rb") as handle:
                    for block in iter(lambda: handle.read(1 << 22), b""):
                        digest.update(block)
            if digest.hexdigest() == recorded:
                return None
            return "file checksum mismatch" if what == "whole" else "row group checksum mismatch"
        if what != "whole":
            return self._check_row_group(part, what, tmp) if "row_group_xxh3" in entry else None
        if "footer_xxh3" in entry:
            import fsspec
            try:
                found = footer_digest(fsspec.filesystem("file"), str(tmp), size)
            except ValueError as error:
                return str(error)
            return None if found == entry["footer_xxh3"] else "footer checksum mismatch"
        return None

    def _check_row_group(self, part: str, rg: int, tmp: Path) -> str | None:
        """Row group `rg` read from `tmp` against its recorded content checksum, and every page against its CRC
        where pyarrow checks them (>= 15), for a dataset without checksums of its row groups' bytes (written
        before pinstorm recorded them). One open footer per part is kept for the next row group: a big footer
        is parsed once, not once a row group."""
        with self._checking:
            if self._checkers is None:   # every column read: page CRCs checked where pyarrow can
                self._checkers = OpenParts(lambda name: self.open_pieces(name, columns=None))
            handle = self._checkers.get(part)
            source, (start, end) = handle.source, self.spans(part)[rg]
            try:
                source.add_file(start, end, tmp)
                read_row_group(handle, self.location, self.info, part, rg, columns=handle.schema_arrow.names)
            except CorruptPartError as error:
                return str(error).split(f"row group {rg}: ", 1)[-1]
            finally:
                source.let_go()   # no file kept open (the download is renamed or removed next)
            return None

    def stream(self, names) -> "PartStream":
        return PartStream(self, list(names))


class PartStream:
    """The parts (or pieces of parts, `PartCache.pieces`) one pass reads, in its order (one may come again):
    fetched up to `AHEAD` ahead of the reader by `FETCHERS` threads, each held from its fetch until the reader
    moves past it. Use as a context manager; `next()` returns the local path of the next one of the plan."""

    def __init__(self, cache: PartCache, names: list[str]):
        self.cache, self.names = cache, names
        self.sizes = [cache.known_size(name) for name in names]   # a part cached by row group: its footer first
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        # the bytes one reader may hold ahead of the part it reads: its share of the limit, less a part, so the
        # holds of N local ranks together never exceed the limit and no rank waits for another's to go
        # (the largest one any rank may read: a whole part of the dataset, or a piece of this plan)
        largest = max([s for n, s in cache.sizes.items() if s is not None and cache.whole(n)] + self.sizes, default=0)
        self.budget = max(0, cache.limit // ranks - largest)
        self.ready: OrderedDict[int, tuple[Path, Path] | BaseException] = OrderedDict()
        self.at = 0   # the plan index the reader asks for next
        self.waiting = -1   # the plan index the reader is blocked on now (-1: none)
        self.current: Path | None = None
        self.stopping = False
        self.claimed = 0           # the next plan index a fetcher takes
        self.failed = len(names)   # the first plan index whose fetch failed
        self.in_flight: set[int] = set()
        self.changed = threading.Condition()
        self.threads = [threading.Thread(target=self._fetch_ahead, name=f"pinstorm-part-prefetch-{i}", daemon=True)
                        for i in range(max(1, min(FETCHERS, len(names))))]
        for thread in self.threads:
            thread.start()

    def _ahead_bytes(self) -> int:
        return sum(self.sizes[i] for i in self.ready) + sum(self.sizes[i] for i in self.in_flight)

    def _fetch_ahead(self) -> None:
        """One fetcher: takes the next index of the plan, waits until it is within the window (`AHEAD` of the
        reader, the bytes of the budget), fetches it; until the plan ends, a fetch fails or the stream closes."""
        while True:
            with self.changed:
                index = self.claimed
                if self.stopping or index >= len(self.names) or index > self.failed:
                    return
                self.claimed += 1
                name = self.names[index]
                while not self.stopping and index > self.at and index < self.failed and (
                        index - self.at > AHEAD or self._ahead_bytes() + self.sizes[index] > self.budget):
                    self.changed.wait(0.1)
                if self.stopping or index > self.failed:
                    return
                self.in_flight.add(index)
            try:
                got = None
                while got is None and not self.stopping:
                    # ahead of the reader: only into room free or unheld; the part it waits for: as long as it takes
                    got = self.cache.acquire(name, wait=index == self.waiting, stop=lambda: self.stopping,
                                             kind="ahead")
                    if got is None:
                        with self.changed:
                            self.changed.wait(0.05)
            except BaseException as error:   # handed to the reader, raised there
                got = error
            with self.changed:
                self.in_flight.discard(index)
                if got is None or (self.stopping and isinstance(got, tuple)):
                    if got is not None:
                        self.cache.release(got[1])
                    return
                self.ready[index] = got
                if isinstance(got, BaseException):   # nothing after it is fetched: the reader raises it there
                    self.failed = min(self.failed, index)
                self.changed.notify_all()

    def next(self) -> Path:
        """The local path of the next part of the plan, verified and held (the previous one is let go)."""
        with self.changed:
            self._let_go()
            index = self.at
            self.waiting = index
            self.changed.notify_all()
            while index not in self.ready:
                self.changed.wait(0.5)
                if not any(thread.is_alive() for thread in self.threads) and index not in self.ready:
                    raise PartFetchError(f"{self.cache.where}: the part prefetch stopped")
            self.waiting = -1
            got = self.ready.pop(index)
            if isinstance(got, BaseException):
                raise got
            path, hold = got
            # held for reading before the prefetch moves on: its next fetch may take back parts held ahead
            read = self.cache.upgrade(self.names[index], hold)
            if read is None:   # taken back for a reader that waited for room: fetched again
                path, read = self.cache.acquire(self.names[index])
            self.current = read
            self.at = index + 1
            self.changed.notify_all()
        return path

    def _let_go(self) -> None:
        if self.current is not None:
            self.cache.release(self.current)
            self.current = None

    def close(self) -> None:
        with self.changed:
            self.stopping = True
            self.changed.notify_all()
        for thread in self.threads:
            thread.join()
        with self.changed:
            self._let_go()
            for got in self.ready.values():
                if isinstance(got, tuple):
                    self.cache.release(got[1])
            self.ready.clear()

    def __enter__(self) -> "PartStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
