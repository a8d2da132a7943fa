"""Write images as Parquet row groups in petastorm's format, atomically and resumably, without Spark.

Rows: ``image`` (the JPEG bytes as they were, see `pipeline.images`), ``label`` (index of the wnid
in `classes`), ``wnid``, ``filename`` (the original file name), ``height``, ``width``.

* Rows are shuffled with a seeded generator before they are cut into row groups, so every row
  group mixes classes and shuffling row groups at read time yields well-mixed batches.
* Row groups hold about `row_group_size_mb` each and have the same number of rows (+-1); there are
  at least `min_row_groups` (row groups are the unit readers shard and shuffle by), a multiple of
  `partitions`. Part file *p* holds the p-th slice of row groups, so N partitions are N balanced
  shards. A part holds at most `MAX_PART_ROW_GROUPS` (4,096, ~128 GB of 32 MB row groups): more
  partitions than asked are written rather than a footer readers refuse or spend long parsing.
* Labels are the index of the wnid in `classes`, an explicit list recorded in the metadata; classes
  without a single row keep their label and are reported (`ConvertResult.empty_classes`, a warning).
* Files that do not decode to an image are skipped and listed in ``_pinstorm_report.json`` and in
  the returned `ConvertResult` - never a crash, never a silent drop. Re-encoded images are listed
  with the reason (mode, format, EXIF orientation, high bit depth, downscaled).
* Memory is bounded whatever the inputs: an image over `max_pixels` is refused from its header
  (or, a JPEG, decoded at a reduced DCT scale), and the threads together hold at most
  `memory_budget_mb` of decoded pixels (`_MemoryBudget`), so one thread per CPU cannot add up to
  gigabytes on a tree of giant PNGs.
* `max_side` (off by default): images whose longer side exceeds it are downscaled once and stored
  as JPEG at `quality` (`images.check_image`), counted in ``ConvertResult.resized``.
* Each part's size, footer checksum and per-row-group content checksums are recorded (see
  `pipeline.verify`); readers check them before delivering rows.
* With a Spark session (`convert(..., spark=)`), each part is one task on the executors, written by the
  same `write_part_file` under a temporary name of its task attempt (a retry overwrites, never
  duplicates); the driver records the parts and commits the metadata once (`commit_dataset`).
* Each part is written under a temporary name and renamed when whole; progress is recorded in
  ``_pinstorm_progress.json``; ``_common_metadata``, written last, is what makes the folder a
  dataset. Re-running an interrupted conversion with the same inputs keeps the finished parts and
  writes the rest; with different inputs it starts over.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import xxhash

from .contracts import DataMap, DatasetInfo
from .errors import InvalidPipelineInput, PipelineError
from .images import DEFAULT_MAX_PIXELS, DOWNSCALE_QUALITY, UndecodableImage, check_image, decode_cost, read_header
from .layout import EmptyClassesWarning, Layout, ListedTree, is_image_name, scan, scan_listed
from .metadata import (ARROW_SCHEMA, COMMON_METADATA, FORMAT_VERSION, PART_PREFIX, PROGRESS, REPORT, TMP_PREFIX,
                       part_name, read_info, write_common_metadata)
from pinstorm.progress import progress_bar
from .storage import is_board_url, parse_board_url, resolve
from .verify import CHECKSUM, footer_digest, read_footer, table_digest, writer_options
from pinstorm.boards.safety import secrets
from pinstorm.boards.safety.parquet_limits import DEFAULT_FOOTER_BYTES
from pinstorm import boards

log = secrets.logger(__name__)

PLAN_VERSION = 2
# row groups a part holds at most: its footer (~0.5 KB a row group, ~2 MB here) stays far inside what readers
# accept (`parquet_limits.DEFAULT_FOOTER_BYTES`, 16 MiB) and cheap to parse (~9x its bytes in memory, ~40 ms)
# for readers that switch parts; ImageNet-21k as one part would hold ~45,000 (a 23 MB footer)
MAX_PART_ROW_GROUPS = DEFAULT_FOOTER_BYTES // 4096
DEFAULT_MEMORY_BUDGET_MB = 1024   # decoded pixels held by all threads at once


class DatasetExistsError(PipelineError, FileExistsError):
    """The output already holds a finished dataset from other inputs, or files pinstorm did not write."""


# What a re-encode changed is stored as flags on each report entry (`images.CheckedImage.resized`,
# `.reoriented`), so counts never search the reason text. Reports written before the flags existed
# are read through this table, the one place that still reads a reason.
REENCODE_FLAGS = {"resized": "(max_side ", "reoriented": "EXIF orientation"}


def reencode_flags(reason: str) -> dict[str, bool]:
    """``{"resized": ..., "reoriented": ...}`` of a re-encoded image in an older report (reason only)."""
    return {flag: marker in reason for flag, marker in REENCODE_FLAGS.items()}


def count_flag(reencoded: list[dict], flag: str) -> int:
    """How many report entries have ``flag`` (entries written before the flags existed: from their reason)."""
    return sum(bool(r[flag]) if flag in r else reencode_flags(r.get("reason", ""))[flag] for r in reencoded)


@dataclass
class ConvertResult:
    """What a conversion wrote, and what it skipped or re-encoded (also in ``_pinstorm_report.json``).

    Attributes:
        url: Where the dataset is.
        rows: Images stored.
        row_groups: Row groups written, over all parts.
        partitions: Part files.
        bytes: The parts' total size.
        classes: The wnids in label order.
        skipped: ``{"path", "reason"}`` of each image not stored.
        reencoded: ``{"path", "format", "mode", "reason", "resized", "reoriented"}`` of each image stored
            re-encoded.
        seconds: How long the conversion took, from the call (a ``board://`` source's fetch included).
        images_read: Images read in this run (0 when the dataset was already complete).
        parts_reused: Parts kept from an interrupted earlier run.
        report_url: Where the report (``_pinstorm_report.json``) is.
        empty_classes: Classes that got no row (their labels are kept).
        fetch_seconds: Of `seconds`, fetching and checking a ``board://`` source's category pins.
    """

    url: str
    rows: int
    row_groups: int
    partitions: int
    bytes: int
    classes: list[str]
    skipped: list[dict] = field(default_factory=list)     # {"path", "reason"}
    # {"path", "format", "mode", "reason", "resized", "reoriented"}
    reencoded: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    images_read: int = 0          # images read in this run (0 when the dataset was already complete)
    parts_reused: int = 0         # parts kept from an interrupted earlier run
    report_url: str = ""
    empty_classes: list[str] = field(default_factory=list)   # classes that got no row (labels kept)
    fetch_seconds: float = 0.0    # of `seconds`: fetching and checking a board:// source's pins

    @property
    def reoriented(self) -> int:
        """Images re-encoded to apply their EXIF orientation."""
        return count_flag(self.reencoded, "reoriented")

    @property
    def resized(self) -> int:
        """Images downscaled to `max_side`."""
        return count_flag(self.reencoded, "resized")

    @property
    def images_per_second(self) -> float:
        return self.images_read / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Sources


def _binary_file_map(df) -> dict:
    """The data map of a ``spark.read.format("binaryFile")`` DataFrame of a class-per-folder tree: each
    file's path and its class, the name of its folder. Only the paths reach the driver; the executors read
    the files again by path (their content column is not shipped), so the paths must be on a file system
    the executors share."""
    from urllib.parse import unquote, urlparse

    if "path" not in df.columns:
        raise InvalidPipelineInput("a DataFrame source must come from spark.read.format('binaryFile') (a 'path' "
                                   f"column); this one has {', '.join(df.columns)}: see make_spark_converter(df)")
    local = []
    for (url,) in df.select("path").collect():
        parsed = urlparse(url)
        if parsed.scheme not in ("", "file"):
            raise InvalidPipelineInput(f"{url}: convert reads a binaryFile DataFrame's files by path on the "
                                       "executors' file system; for files in a bucket use make_spark_converter(df)")
        local.append(unquote(parsed.path))
    categories = [os.path.basename(os.path.dirname(path)) for path in local]
    return {"image": local, "category": categories, "classes": sorted(set(categories))}


_LABEL_FILE_LIMIT = 256 * 2**20   # LOC_val_solution.csv is ~10 MB for ImageNet


def is_remote_tree(source) -> bool:
    """A tree given as an fsspec URL other than a local folder or a board (``s3://bucket/tree``)."""
    from urllib.parse import urlparse

    if not isinstance(source, str) or is_board_url(source) or "://" not in source:
        return False
    return urlparse(source).scheme not in ("", "file")


def scan_remote(url: str, storage_options: dict | None = None) -> tuple[Layout, dict[str, int]]:
    """`scan` of a tree in a bucket (any fsspec URL): (a Layout whose paths are URLs, {URL: size}).

    One listing of the tree (fsspec's ``find``: names and sizes, no image read) is scanned as it is
    (`layout.scan_listed`): the very rules, classes and order of a local scan, with no local stand-in
    file; only the two small label files (``LOC_synset_mapping.txt``, ``LOC_val_solution.csv``) are read,
    when the scan uses them. A URL carrying a password or a secret query value is refused: every image
    path (hence the report) starts with the URL, so credentials go in `storage_options`."""
    if secrets.has_secret(url):
        raise InvalidPipelineInput(f"{secrets.redact_url(url)}: put credentials in storage_options, not in the "
                                   "tree's URL (each image's path, written in the report, starts with it)")
    location = resolve(url, storage_options)
    fs, root = location.fs, location.path
    listing = fs.find(root, withdirs=True, detail=True)
    prefix = location.url.rstrip("/")      # the URL as given: the executors open each image by it
    files, folders, label_files, sizes = [], [], {}, {}
    for path, detail in sorted(listing.items()):
        relative = path[len(root):].strip("/")
        if not relative or any(part in ("", ".", "..") for part in relative.split("/")):
            continue
        if detail.get("type") == "directory":
            folders.append(relative)
            continue
        name = os.path.basename(relative)
        if name in ("LOC_synset_mapping.txt", "LOC_val_solution.csv"):
            label_files[relative] = (path, int(detail.get("size") or 0))
            files.append(relative)
        elif is_image_name(name):
            files.append(relative)
            sizes[f"{prefix}/{relative}"] = int(detail.get("size") or 0)

    def read(relative: str) -> bytes:      # a label file the scan uses
        path, size = label_files[relative]
        if size > _LABEL_FILE_LIMIT:
            raise InvalidPipelineInput(f"{secrets.redact_url(url)}/{relative}: larger than "
                                       f"{_LABEL_FILE_LIMIT // 2**20} MB")
        return fs.cat_file(path)

    return scan_listed(ListedTree(prefix, files, folders, read)), sizes


def _source_items(source, classes, split):
    """(items [(path, wnid)], classes, names, description, scope) from a Layout, a data map or a folder.

    `scope`: the classes this source is expected to fill (a slice's own categories), for reporting
    empty classes; `classes`: every label, possibly more.
    """
    if isinstance(source, (str, os.PathLike)) and not is_board_url(source):
        source = scan(source)
    if isinstance(source, Layout):
        items = source.items(split)
        default_classes, names = source.classes, dict(source.names)
        description = f"{source.root} ({source.kind}, {split})"
        scope = None
    elif isinstance(source, Mapping):
        data_map = DataMap.from_source(source)   # a DataMap or a plain dict with its keys
        if data_map is None:
            missing = {"image", "category"} - set(source)
            raise InvalidPipelineInput(f"a data map needs keys 'image' and 'category'; missing {sorted(missing)}")
        items = list(zip(data_map.image, data_map.category))
        # `classes` (all wnids, set by imagenet_partition) keeps labels global when one slice is converted.
        default_classes = data_map.label_classes()
        if not default_classes and classes is None:
            default_classes = sorted(set(data_map.category))
            log.warning("data map without `classes`: labels number its own %d categories; pass classes= (or "
                        "a map from imagenet_partition) so that other conversions agree", len(default_classes))
        names = dict(data_map.names or {})
        description = f"data map of {len(items)} images"
        scope = [str(c) for c in data_map.categories] if data_map.categories is not None else None
    else:
        raise InvalidPipelineInput(f"source must be a Layout, a data map or a folder, not {type(source).__name__}")
    if not items:
        raise InvalidPipelineInput(f"{description}: no images to convert")
    classes = list(classes) if classes is not None else list(default_classes)
    if len(set(classes)) != len(classes):
        raise InvalidPipelineInput("classes contains duplicates")
    known = set(classes)
    unknown = sorted({wnid for _, wnid in items if wnid not in known})
    if unknown:
        raise InvalidPipelineInput(f"{description}: images of classes missing from `classes`: "
                         f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    names = {wnid: names.get(wnid, wnid) for wnid in classes}
    return items, classes, names, description, (classes if scope is None else scope)


# ---------------------------------------------------------------------------------------------
# Planning


@dataclass
class _Plan:
    rows: list[tuple[str, str, int]]        # (path, wnid, label), in storage order
    bounds: list[tuple[int, int]]           # row group g = rows[start:stop]
    partitions: int
    digest: str

    def part_groups(self, part: int) -> range:
        per_part = len(self.bounds) // self.partitions
        return range(part * per_part, (part + 1) * per_part)


def _plan(items, classes, partitions, row_group_size_mb, min_row_groups, seed, limits=(), sizes=None) -> _Plan:
    if partitions < 1:
        raise InvalidPipelineInput(f"partitions must be at least 1, got {partitions}")
    n = len(items)
    if n < partitions:
        raise InvalidPipelineInput(f"{n} images cannot fill {partitions} partitions")
    label_of = {wnid: i for i, wnid in enumerate(classes)}
    rows = sorted((path, wnid, label_of[wnid]) for path, wnid in items)
    random.Random(seed).shuffle(rows)

    known_sizes, sample = sizes, []   # `sizes`: {path: bytes} of a listed remote tree
    for path, _, _ in rows[:256]:   # already shuffled: a fair sample
        try:
            sample.append(known_sizes[path] if known_sizes is not None else os.path.getsize(path))
        except (OSError, KeyError):
            pass
    mean_bytes = max(1.0, sum(sample) / len(sample)) if sample else 110e3
    rows_per_group = max(1, int(row_group_size_mb * 2**20 / mean_bytes))
    groups = max(math.ceil(n / rows_per_group), min(min_row_groups, n), partitions)
    partitions = max(partitions, math.ceil(groups / MAX_PART_ROW_GROUPS))   # a footer every reader accepts
    groups = math.ceil(groups / partitions) * partitions
    if groups > n:
        groups = n // partitions * partitions
    bounds = [(g * n // groups, (g + 1) * n // groups) for g in range(groups)]

    digest = hashlib.sha256()
    digest.update(json.dumps([PLAN_VERSION, classes, partitions, bounds, limits]).encode())
    for path, _, label in rows:
        digest.update(f"{path}\0{label}\n".encode())
    return _Plan(rows, bounds, partitions, digest.hexdigest()[:32])


# ---------------------------------------------------------------------------------------------
# Writing


class _MemoryBudget:
    """Bytes of decoded pixels the reading threads may hold at once; a thread waits for its share.

    One image costs what `images.decode_cost` estimates from its header (12 bytes a pixel for a full
    decode, 1/64 of that for the 1/8-scale check of a normal JPEG). A cost over the whole budget
    waits until it runs alone.
    """

    def __init__(self, limit_bytes: int):
        self.limit, self.used, self.peak = max(1, int(limit_bytes)), 0, 0
        self._cond = threading.Condition()

    @contextmanager
    def hold(self, cost: int):
        cost = min(max(0, int(cost)), self.limit)
        with self._cond:
            self._cond.wait_for(lambda: self.used + cost <= self.limit)
            self.used += cost
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._cond:
                self.used -= cost
                self._cond.notify_all()


_TRIM_ABOVE = 64 * 2**20


def _release_freed_memory() -> None:
    """Hand memory freed by a large decode back to the OS (glibc ``malloc_trim``; elsewhere nothing).

    Without it, glibc keeps what each thread's arena freed: 8 threads decoding giant images one after
    another (as the memory budget lets them) still grew to ~1.9 GB of resident memory.
    """
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim = None


_READ_WHOLE_BELOW = 16 * 2**20   # smaller files are read at once and their header parsed once


def _load(row, max_pixels, budget, max_side=None, quality=DOWNSCALE_QUALITY, fs=None):
    """Read and check one file: (row, CheckedImage) or (row, reason it was skipped).

    The decode waits for its share of the memory budget, computed from the header before any pixel is
    decoded. A file over 16 MB has its header read first, so an image too large for `max_pixels` is
    refused without reading it whole; a smaller one is read at once and its header parsed once, by
    `check_image` (a second parse cost ~5 % of the check, pure Python under the GIL).
    `fs`: the fsspec filesystem of a remote tree (paths are its URLs); the same bounds hold.
    """
    path = row[0]
    name = os.path.basename(path)
    costs = []

    @contextmanager
    def hold(cost):
        costs.append(cost)
        with budget.hold(cost):
            yield

    check = functools.partial(check_image, name=name, max_pixels=max_pixels, max_side=max_side, quality=quality)
    try:
        with (open(path, "rb") if fs is None else fs.open(path, "rb")) as handle:
            size = os.fstat(handle.fileno()).st_size if fs is None else int(getattr(handle, "size", None)
                                                                              or fs.size(path) or 0)
            if size == 0:
                return row, "empty file"
            if size < _READ_WHOLE_BELOW:
                return row, check(handle.read(), hold=hold)
            header = read_header(handle, name=name)
            with hold(decode_cost(header, max_pixels, max_side)):
                handle.seek(0)
                return row, check(handle.read())
    except UndecodableImage as error:
        return row, str(error).split(": ", 1)[-1]
    except OSError as error:
        return row, f"unreadable: {error.strerror or error}"
    finally:
        if costs and costs[0] >= _TRIM_ABOVE:
            _release_freed_memory()


def _write_part(location, plan, part, pool, advance, load) -> dict:
    """Write one part file of `plan`, its images read and checked by `pool`; return its progress entry."""
    groups = [plan.rows[start:stop] for start, stop in (plan.bounds[g] for g in plan.part_groups(part))]
    return write_part_file(location, part_name(part, plan.partitions), _loaded_groups(groups, pool, load), advance)


def _loaded_groups(groups, pool, load):
    """Each row group (a list of (path, wnid, label) rows) as an iterator of (row, checked) pairs, the
    images of the next row group read ahead by `pool` while this one is written."""
    def submit(rows):
        return [pool.submit(load, row) for row in rows]

    pending = submit(groups[0]) if groups else []
    try:
        for position in range(len(groups)):
            current = pending
            pending = submit(groups[position + 1]) if position + 1 < len(groups) else []
            yield (future.result() for future in current)
    finally:
        for future in pending:
            future.cancel()


def write_part_file(location, name: str, groups, advance=None, tmp_name: str | None = None,
                    extra_fields=None) -> dict:
    """Write part `name` in `location` from `groups`: an iterable of row groups, each an iterable of
    ``((path, wnid, label), checked)`` pairs where `checked` is a `CheckedImage` or the reason the file
    was skipped. Returns the part's progress entry (rows, row groups, checksums, skipped, re-encoded).

    The part is written under `tmp_name` (default ``_tmp.<name>``) and renamed into place when whole, so
    a reader (or a retried writer: the Spark converter gives each attempt its own `tmp_name`) never
    sees half a part. `convert` and the Spark converter both write every part through here.
    `extra_fields` (Arrow fields; the Spark converter's extra DataFrame columns): each pair then carries a
    third item, the row's values of those columns, stored after pinstorm's six columns.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = location.join(tmp_name or TMP_PREFIX + name)
    extra_fields = list(extra_fields or [])
    schema = pa.schema(list(ARROW_SCHEMA) + extra_fields, metadata=ARROW_SCHEMA.metadata) if extra_fields \
        else ARROW_SCHEMA
    entry = {"rows": 0, "row_group_rows": [], "row_group_xxh3": [], "skipped": [], "reencoded": [],
             "class_rows": {}}
    try:
        with open_part_sink(location, tmp) as handle:
            writer = pq.ParquetWriter(handle, schema, compression={"image": "NONE", "label": "SNAPPY",
                                      "wnid": "SNAPPY", "filename": "SNAPPY", "height": "SNAPPY", "width": "SNAPPY",
                                      **{extra.name: "SNAPPY" for extra in extra_fields}},
                                      use_dictionary=["wnid"], write_statistics=["label", "height", "width"],
                                      **writer_options())
            row_group_written(handle)   # the file's magic: row group 0 starts after it
            try:
                for group in groups:
                    columns = {key: [] for key in schema.names}
                    for item in group:
                        (path, wnid, label), checked = item[0], item[1]
                        if advance is not None:
                            advance(1)
                        if isinstance(checked, str):
                            entry["skipped"].append({"path": path, "reason": checked})
                            continue
                        if checked.reencoded:
                            entry["reencoded"].append({"path": path, "format": checked.original_format,
                                                       "mode": checked.original_mode, "reason": checked.reason,
                                                       "resized": checked.resized,
                                                       "reoriented": checked.reoriented})
                        columns["image"].append(checked.data)
                        columns["label"].append(label)
                        columns["wnid"].append(wnid)
                        columns["filename"].append(os.path.basename(path))
                        columns["height"].append(checked.height)
                        columns["width"].append(checked.width)
                        for extra, value in zip(extra_fields, item[2] if extra_fields else ()):
                            columns[extra.name].append(value)
                        entry["class_rows"][wnid] = entry["class_rows"].get(wnid, 0) + 1
                    if not columns["image"]:
                        continue   # every file of this row group was broken: no empty row group
                    table = pa.Table.from_pydict(columns, schema=schema)
                    writer.write_table(table, row_group_size=len(table))
                    row_group_written(handle)
                    entry["rows"] += len(table)
                    entry["row_group_rows"].append(len(table))
                    entry["row_group_xxh3"].append(table_digest(table))
            finally:
                writer.close()
    finally:
        close = getattr(groups, "close", None)   # a generator: its read-ahead is cancelled
        if close is not None:
            close()
    return finish_part(location, tmp, name, entry, handle)


def open_part_sink(location, tmp: str):
    """Where a part is written: a native file for a local folder (pyarrow writes without Python file objects
    or the GIL; `finish_part` hashes it back from the page cache, at GB/s), else a `HashingSink` (no second
    download to hash a remote part). Call `row_group_written` after each row group the writer wrote."""
    import pyarrow as pa

    return pa.OSFile(tmp, "wb") if location.is_local else HashingSink(location.fs.open(tmp, "wb"))


def row_group_written(sink) -> None:
    """Tell `sink` (`open_part_sink`) that the writer's next bytes belong to the next row group."""
    if isinstance(sink, HashingSink):
        sink.cut()


def finish_part(location, tmp: str, name: str, entry: dict, sink=None) -> dict:
    """A written part's temporary file `tmp` renamed to `name`, and its size, footer checksum, whole-file
    xxh3-128 and the xxh3-128 of each row group's bytes (``row_group_bytes_xxh3``: what a part cache checks a
    row group piece against as it arrives) recorded in `entry`. `sink`: the `HashingSink` a remote part was
    written through (hashed as written); None for a local file, read back once for both checksums. Shared by
    every writer of parts (`write_part_file`, Spark's)."""
    import fsspec

    from .part_pieces import SpanDigests, row_group_spans

    where = f"{location.url}/{name}"
    if not isinstance(sink, HashingSink):   # the footer read once, before the rename (it stays the same)
        local = fsspec.filesystem("file")
        size = local.size(tmp)
        footer = read_footer(local, tmp, size)
        spans = SpanDigests(row_group_spans(footer, size, where))
        file_digest, at = xxhash.xxh3_128(), 0
        with open(tmp, "rb") as written:
            for block in iter(lambda: written.read(1 << 22), b""):
                file_digest.update(block)
                spans.update(at, block)
                at += len(block)
        span_digests: list[str] | None = spans.hexdigests()
    location.fs.mv(tmp, location.join(name))
    entry["bytes"] = location.fs.size(location.join(name))
    if isinstance(sink, HashingSink):
        footer = read_footer(location.fs, location.join(name), entry["bytes"])
        file_digest = sink.digest
        span_digests = sink.span_digests(row_group_spans(footer, entry["bytes"], where))
    entry["footer_xxh3"] = xxhash.xxh3_128(footer).hexdigest()
    entry["xxh3"] = file_digest.hexdigest()
    if span_digests is not None:   # None: a writer that buffered across row groups (the content checksum stays)
        entry["row_group_bytes_xxh3"] = span_digests
    return entry


class HashingSink:
    """A writable remote file that hashes what goes through it: whole, and by row group. A row group's bytes
    start where the writer was when it began the row group (`cut`) and end at the end of its last column
    chunk, one of the last writes before the next `cut` (pyarrow 14 writes that chunk's metadata after it):
    the running digest is kept at each of those writes, and `span_digests` picks the one the footer names."""

    # writes kept per row group: its span ends at one of its last; pyarrow 14 writes one more (the last
    # chunk's metadata), 26 none. A few digests a row group: 4,096 row groups keep ~6 MB, not one per page.
    TAIL_WRITES = 8

    def __init__(self, handle):
        self._handle, self.digest = handle, xxhash.xxh3_128()
        self._at, self._start = 0, 0
        self._running = xxhash.xxh3_128()
        self._ends: deque = deque(maxlen=self.TAIL_WRITES)
        self._row_groups: dict[int, dict[int, str]] = {}   # start -> {end: xxh3 of start..end}

    def write(self, data):
        self.digest.update(data)
        self._running.update(data)
        self._at += len(data)
        self._ends.append((self._at, self._running.copy()))
        return self._handle.write(data)

    def cut(self) -> None:
        """The bytes written from here on belong to the next row group."""
        self._row_groups[self._start] = {end: digest.hexdigest() for end, digest in self._ends}
        self._start, self._running = self._at, xxhash.xxh3_128()
        self._ends.clear()

    def span_digests(self, spans: list[tuple[int, int]]) -> list[str] | None:
        """The xxh3-128 of each row group span (`part_pieces.row_group_spans`), or None when one of them does not
        start where a row group began or end at a write boundary kept."""
        found = [self._row_groups.get(start, {}).get(end) for start, end in spans]
        return None if None in found else found

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._handle.close()
        return False


def _write_json(location, name, payload) -> None:
    tmp = location.join(TMP_PREFIX + name)
    with location.fs.open(tmp, "w") as handle:
        json.dump(payload, handle, indent=1)
    location.fs.mv(tmp, location.join(name))


def _read_json(location, name):
    try:
        with location.fs.open(location.join(name), "r") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None


def _ours(name: str) -> bool:
    return name.startswith((PART_PREFIX, TMP_PREFIX)) or name in (COMMON_METADATA, REPORT, PROGRESS)


def _listing(location) -> list[str]:
    location.fs.invalidate_cache(location.path)
    if not location.fs.exists(location.path):
        return []
    return [os.path.basename(p.rstrip("/")) for p in location.fs.ls(location.path, detail=False)]


def _clear(location, names) -> None:
    # The marker goes first: from then on nobody takes the folder for a finished dataset.
    for name in sorted(names, key=lambda n: n != COMMON_METADATA):
        location.fs.rm(location.join(name))


def _prepare_output(location, plan, overwrite):
    """Decide what of an existing output to keep. Returns (existing info or None, finished parts)."""
    names = _listing(location)
    if COMMON_METADATA in names:
        info = read_info(location)
        if info.plan == plan.digest and not overwrite:
            return info, {}
        if not overwrite:
            raise DatasetExistsError(f"{location.url} already holds a dataset converted from other inputs or "
                                     "settings; pass overwrite=True (--overwrite) to replace it")
        _clear(location, [n for n in names if _ours(n)])
        names = _listing(location)
    foreign = [n for n in names if not _ours(n)]
    if foreign:
        raise DatasetExistsError(f"{location.url} holds files pinstorm did not write ({', '.join(foreign[:3])}); "
                                 "choose an empty or new folder")
    progress = _read_json(location, PROGRESS)
    done = {}
    if progress and progress.get("plan") == plan.digest and not overwrite:
        for name, entry in progress.get("parts", {}).items():
            path = location.join(name)
            if name in names and location.fs.size(path) == entry.get("bytes") and \
                    _footer_or_none(location, path, entry["bytes"]) == entry.get("footer_xxh3"):
                done[name] = entry
    stale = [n for n in names if _ours(n) and n not in done and n != PROGRESS]
    _clear(location, stale)
    location.fs.makedirs(location.path, exist_ok=True)
    _write_json(location, PROGRESS, {"plan": plan.digest, "parts": done})
    return None, done


def _footer_or_none(location, path, size):
    try:
        return footer_digest(location.fs, path, size)
    except (OSError, ValueError):
        return None


def convert(source, output_url, *, partitions: int = 1, row_group_size_mb: float = 32,
            min_row_groups: int = 16, classes=None, split: str = "train", seed: int = 0,
            parallel: int | None = None, overwrite: bool = False, storage_options: dict | None = None,
            progress: bool | None = None, on_part: Callable[[str, dict], None] | None = None,
            description: str | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS,
            memory_budget_mb: float = DEFAULT_MEMORY_BUDGET_MB, max_side: int | None = None,
            quality: int = DOWNSCALE_QUALITY, spark=None, partition: tuple[int, int] | None = None) -> ConvertResult:
    """Convert images to a petastorm-format Parquet dataset at `output_url`; return a `ConvertResult`.

    `source`: a `Layout` (from `scan`), a data map ``{image: [paths], category: [wnids], ...}`` (from
    `imagenet_partition`), or a folder to scan. For a Layout, `split` ("train" or "val") chooses
    what to write. `classes` fixes the label of each wnid (its index); by default the sorted wnids
    of the source (a Layout's `classes`, a data map's `classes` or else `categories`, a folder's
    subfolders). Pass the same `classes` to every conversion whose labels must agree.

    `output_url`: a local folder, any fsspec URL (``file://``, ``s3://``, ``gs://`` with
    `storage_options`), or ``board://<board>/<pin>`` to pin the finished folder to a board.
    `partitions` part files of balanced row groups; `parallel` threads read and check images
    (default: CPU count). `on_part(name, entry)` is called after each part is safely stored.

    `max_pixels` (default 40 MP, None: no limit): a larger JPEG is decoded at a reduced DCT scale and
    re-encoded, a larger image of another format skipped ("too large"). `memory_budget_mb` (default
    1024): decoded pixels all threads may hold at once; with both, peak memory stays near 1.5 GB
    whatever the tree holds.

    `max_side` (default None: every normal JPEG is stored byte for byte): images whose longer side
    exceeds it are downscaled once (JPEGs at a reduced DCT scale first) and stored as JPEG at
    `quality` (default 90); `ConvertResult.resized` counts them, the report lists each. Readers then
    decode fewer pixels every epoch: keep `max_side` above the largest training size.

    `spark` (a SparkSession, the ``spark`` extra): each part is written by a Spark task on the
    executors (`parallel` threads each), the driver scans, plans and commits the metadata once; the
    dataset is the one a one-machine `convert` with the same arguments writes, checksums included.
    The executors must read the image paths and write `output_url` (a local folder on a one-machine
    cluster, a bucket); give `partitions` >= the executors' task slots, as parts are the unit of work.
    `source` may also be a ``spark.read.format("binaryFile")`` DataFrame of a class-per-folder tree
    (labels: the folder names, sorted, unless `classes`); it is converted on its own session.
    `source` may be a tree's fsspec URL (``s3://bucket/tree``, read with `storage_options`): listed here,
    each image read from there by whoever writes its part; or ``board://<board>`` of `repartition`'s
    category pins (`partition` picks a slice): with `spark` the executors fetch the pins themselves.

    A conversion interrupted part-way resumes: parts already stored whole (same inputs and settings) are
    kept, and a finished dataset of the same inputs and settings is returned as it is.

    Args:
        source: A `Layout` (from `scan`), a data map ``{image: [paths], category: [wnids], ...}`` (from
            `imagenet_partition`), a folder to scan, or a Spark ``binaryFile`` DataFrame.
        output_url: A local folder, an fsspec URL, or ``board://<board>/<pin>`` to pin the finished folder.
        partitions: Part files to write, of balanced row groups (the unit of work with `spark`); more when
            one would hold over `MAX_PART_ROW_GROUPS` row groups.
        row_group_size_mb: Target size of a row group in MB of images.
        min_row_groups: At least this many row groups (fewer only when there are fewer images), so that
            shards and shuffling have room.
        classes: The wnids in label order (None: the source's sorted wnids).
        split: For a Layout, ``"train"`` or ``"val"``.
        seed: Seeds the order in which images are spread over row groups.
        parallel: Threads reading and checking images (None: the CPU count).
        overwrite: Replace a dataset converted from other inputs or settings (else `DatasetExistsError`).
        storage_options: For fsspec (credentials, endpoints) when `output_url` is remote.
        progress: Show a progress bar (None: where one can be seen).
        on_part: Called as ``on_part(name, entry)`` after each part is safely stored.
        description: Recorded with the dataset (None: a description of `source`).
        max_pixels: Larger JPEGs are decoded at a reduced DCT scale and re-encoded, larger images of other
            formats skipped (default 40 MP; None: no limit).
        memory_budget_mb: Decoded pixels all threads may hold at once, in MB.
        max_side: Downscale images whose longer side exceeds it (None: store every normal JPEG byte for byte).
        quality: JPEG quality of downscaled or re-encoded images.
        spark: A SparkSession: parts are written by Spark tasks on the executors (the ``spark`` extra).
        partition: With a ``board://<board>`` source, ``(i, n)``: categories slice i of n, as
            `imagenet_partition` cuts them (None: the whole board).

    Returns:
        A `ConvertResult`: where the dataset is, its rows, classes and parts, and what was skipped or resized.

    Raises:
        DatasetExistsError: `output_url` holds a dataset of other inputs or settings (without `overwrite`),
            or files pinstorm did not write.
        InvalidPipelineInput: An argument out of range, or a source without images.
    """
    started = time.monotonic()
    if max_pixels is not None and max_pixels < 1:
        raise InvalidPipelineInput(f"max_pixels must be None or positive, got {max_pixels!r}")
    if memory_budget_mb <= 0:
        raise InvalidPipelineInput(f"memory_budget_mb must be positive, got {memory_budget_mb!r}")
    if max_side is not None and (isinstance(max_side, bool) or int(max_side) != max_side or max_side < 1):
        raise InvalidPipelineInput(f"max_side must be None or a positive integer, got {max_side!r}")
    if isinstance(quality, bool) or int(quality) != quality or not 1 <= quality <= 100:
        raise InvalidPipelineInput(f"quality must be an integer 1..100, got {quality!r}")
    if hasattr(source, "sparkSession") and hasattr(source, "columns"):   # a Spark DataFrame: binaryFile's
        spark = spark if spark is not None else source.sparkSession
        source = _binary_file_map(source)
    sizes = source_url = source_fs = board_fetch = None
    fetch_seconds = 0.0
    if is_board_url(source):     # categories slice `partition` of a `repartition` board
        board = source[len("board://"):].strip("/")
        if not board or "/" in board:
            raise InvalidPipelineInput(f"{source}: a board source is board://<board> (a board made by repartition)")
        index, count = partition if partition is not None else (0, 1)
        if spark is None:
            from .repartition import imagenet_partition

            source = imagenet_partition(index, count, board)
            fetch_seconds = time.monotonic() - started   # part of `seconds`, shown apart (ConvertResult)
        else:                    # the executors fetch the categories, the driver sees their names
            source, sizes, board_fetch = board_map_on_spark(spark, board, index, count)
    elif partition is not None:
        raise InvalidPipelineInput("partition= slices the categories of a board:// source")
    elif is_remote_tree(source):   # a tree in a bucket: listed here, each image read by whoever writes its part
        source_url = source
        source, sizes = scan_remote(source_url, storage_options)
        source_fs = resolve(source_url, storage_options).fs
    items, classes, names, source_description, scope = _source_items(source, classes, split)
    limits = [max_pixels] if max_side is None else [max_pixels, int(max_side), int(quality)]
    plan = _plan(items, classes, partitions, row_group_size_mb, min_row_groups, seed, limits, sizes)
    budget = _MemoryBudget(memory_budget_mb * 2**20)
    load = functools.partial(_load, max_pixels=max_pixels, budget=budget, max_side=max_side, quality=quality,
                             fs=source_fs)
    on_spark = {}
    if spark is not None:
        on_spark = {"spark": spark, "load_options": {"max_pixels": max_pixels, "memory_budget_mb": memory_budget_mb,
                                                     "max_side": max_side, "quality": quality,
                                                     "source_url": source_url,
                                                     "source_storage_options": storage_options if source_url else None,
                                                     "board_fetch": board_fetch}}
        if is_board_url(output_url) and not spark.sparkContext.master.startswith("local"):
            raise InvalidPipelineInput(f"{output_url}: a board output is staged on the driver's disk, which the executors of "
                             f"{spark.sparkContext.master} may not share; convert to a bucket or shared folder on "
                             "Spark, then pin that folder")
    if is_board_url(output_url):
        result = _convert_to_board(plan, classes, names, split, output_url, parallel=parallel,
                                   overwrite=overwrite, progress=progress, on_part=on_part,
                                   description=description or source_description, started=started, seed=seed,
                                   load=load, **on_spark)
    else:
        result = _convert(plan, classes, names, split, resolve(output_url, storage_options), parallel=parallel,
                          overwrite=overwrite, progress=progress, on_part=on_part,
                          source=description or source_description, started=started, seed=seed, load=load,
                          **on_spark)
    result.fetch_seconds = fetch_seconds
    if result.skipped and result.images_read:
        log.warning("%s: skipped %d file(s), listed in %s", result.url, len(result.skipped), result.report_url)
    in_scope = set(scope)
    empty = result.empty_classes = [wnid for wnid in result.empty_classes if wnid in in_scope]
    if empty and result.images_read:
        message = (f"{result.url}: {len(empty)} of {len(scope)} classes have no row and keep their "
                   f"label: {', '.join(empty[:5])}{' ...' if len(empty) > 5 else ''}")
        warnings.warn(message, EmptyClassesWarning, stacklevel=2)
        log.warning(message)
    return result


# ---------------------------------------------------------------------------------------------
# Writing on Spark (`convert(..., spark=)`, and the parts of `spark_converter.make_spark_converter`):
# pyspark is imported only inside these functions, and the tasks run on the executors.


class SparkConverterError(PipelineError, ValueError):
    """A DataFrame the Spark converter cannot take (column types, no cache folder), or a Spark job that failed."""


def _attempt_tmp_name(name: str) -> str:
    """The temporary name of `name` for this task attempt: unique per attempt, so two attempts of one
    task (a retry after a lost executor, a speculative copy) never write into each other's file."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:
        context = None
    token = f"{context.stageId()}-{context.taskAttemptId()}" if context is not None else uuid.uuid4().hex[:12]
    return f"{TMP_PREFIX}{name}.{token}"


def _convert_parts_task(jobs, *, url, storage_options, parallel, max_pixels, memory_budget_mb, max_side, quality,
                        source_url=None, source_storage_options=None, board_fetch=None):
    """Write the parts of `jobs` [(name, [row group rows])] with `convert`'s own reader and writer; the
    images of a remote tree (`source_url`) are read from it here, on the executor, and the categories of
    a board (`board_fetch`) fetched from it here, through this machine's cache."""
    jobs = list(jobs)
    if board_fetch:
        jobs = _refetched(jobs, **board_fetch)
    location = resolve(url, storage_options)
    budget = _MemoryBudget(memory_budget_mb * 2**20)
    source_fs = resolve(source_url, source_storage_options).fs if source_url else None
    load = functools.partial(_load, max_pixels=max_pixels, budget=budget, max_side=max_side, quality=quality,
                             fs=source_fs)
    with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 2) as pool:
        for name, groups in jobs:
            groups = [[(str(path), str(wnid), int(label)) for path, wnid, label in rows] for rows in groups]
            entry = write_part_file(location, name, _loaded_groups(groups, pool, load),
                                    tmp_name=_attempt_tmp_name(name))
            yield name, entry


def _spark_failure(exc: BaseException) -> str:
    """The line of a Spark job failure that says what went wrong (the Python exception, or Spark's reason)."""
    text = str(exc)
    if "Traceback (most recent call last)" in text:
        lines = [line.strip() for line in text[text.rindex("Traceback (most recent call last)"):].splitlines()
                 if line.strip() and not line.startswith((" ", "\t"))]
        errors = [line for line in lines if ":" in line and line.split(":")[0].endswith(("Error", "Exception"))]
        if errors:
            return errors[0]
    for line in text.splitlines():
        if "Job aborted" in line or "Exception" in line:
            return line.strip()[:500]
    return (text.strip().splitlines() or [type(exc).__name__])[0][:500]


def _run_job(spark, description: str, rdd, storage_options=None) -> list:
    """`rdd.collect()` under `description` (Spark's UI shows it: no secret in it); a failed job is a
    `SparkConverterError` naming the task's Python error, with URL passwords and `storage_options` secrets
    masked."""
    hidden = secrets.secret_values(storage_options or {})
    description = secrets.redact_text(description, hidden)
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        return rdd.collect()
    except Exception as exc:  # noqa: BLE001 - py4j's error: translated into one line
        if type(exc).__name__ not in ("Py4JJavaError", "PythonException", "Py4JError"):
            raise
        raise SparkConverterError(f"{description}: the Spark job failed: "
                                  f"{secrets.redact_text(_spark_failure(exc), hidden)}") from None
    finally:
        sc.setJobDescription(None)


def _category_pins(board_spec, board_name, wnids):
    """{wnid: (folder, [(file relative to folder, size)])} of category pins fetched (through this
    machine's cache) from the board, on whichever machine runs this."""
    from .repartition import category_files

    board = boards.board_from_spec(board_spec, name=board_name)
    fetched = boards.pin_get_many(list(wnids), board=board, extract=True)
    out = {}
    for wnid in wnids:
        files = category_files(fetched[wnid])
        if not files:
            out[wnid] = ("", [])
            continue
        folder = os.path.commonpath([os.path.dirname(f) for f in files])
        out[wnid] = (folder, [(os.path.relpath(f, folder), os.path.getsize(f)) for f in files])
    return out


def _fetch_categories_task(wnids, *, board_spec, board_name):
    """Spark task: fetch these categories on the executor; yield (wnid, (folder, files)) (names only)."""
    yield from _category_pins(board_spec, board_name, list(wnids)).items()


def board_map_on_spark(spark, board: str, partition: int = 0, partitions: int = 1) -> tuple[dict, dict, dict]:
    """The data map of categories slice `partition`/`partitions` of a `repartition` board, its pins fetched
    by the executors (one Spark job; only file names and sizes reach the driver): (data map as
    `imagenet_partition` returns it, {path: size}, what the part tasks need to fetch them again)."""
    from .repartition import category_slice

    handle = boards.resolve_board(board)
    spec, name = handle.spec, handle.name
    classes, mine, wanted, names = category_slice(partition, partitions, handle)
    found: dict = {}
    if wanted:
        tasks = max(1, min(len(wanted), spark.sparkContext.defaultParallelism))
        task = functools.partial(_fetch_categories_task, board_spec=spec, board_name=name)
        rdd = spark.sparkContext.parallelize(wanted, tasks).mapPartitions(task)
        found = dict(_run_job(spark, f"pinstorm convert: fetch {len(wanted)} categories of board {name}", rdd,
                              {"board": spec}))
    image, category, sizes, folders = [], [], {}, {}
    for wnid in wanted:
        folder, files = found[wnid]
        folders[wnid] = folder
        for relative, size in files:
            path = os.path.join(folder, relative)
            image.append(path)
            category.append(wnid)
            sizes[path] = size
    data = {"image": image, "category": category, "categories": mine, "classes": classes, "names": names}
    return data, sizes, {"board_spec": spec, "board_name": name, "folders": folders}


def _refetched(jobs, board_spec, board_name, folders):
    """`jobs` with each image path moved to where this executor's fetch of its category put it (the same
    place on the machine that listed it)."""
    wnids = sorted({str(wnid) for _, groups in jobs for rows in groups for _, wnid, _ in rows})
    here = {wnid: folder for wnid, (folder, _) in _category_pins(board_spec, board_name, wnids).items()}
    moved = []
    for name, groups in jobs:
        moved.append((name, [[(here[str(wnid)] + str(path)[len(folders[str(wnid)]):], wnid, label)
                              for path, wnid, label in rows] for rows in groups]))
    return moved


def _remove_attempt_temporaries(location) -> list[str]:
    """Remove the temporary part files of task attempts that died (the folder holds only pinstorm's files)."""
    location.fs.invalidate_cache(location.path)
    names = [os.path.basename(p.rstrip("/")) for p in location.fs.ls(location.path, detail=False)]
    strays = [n for n in names if n.startswith(TMP_PREFIX + "part-")]
    for name in strays:
        location.fs.rm(location.join(name))
    if strays:
        log.info("%s: removed %d temporary part(s) of failed task attempts", location.url, len(strays))
    return strays


def write_parts_on_spark(spark, location, plan, todo, stored, *, parallel=None, max_pixels=DEFAULT_MAX_PIXELS,
                         memory_budget_mb=1024, max_side=None, quality=DOWNSCALE_QUALITY, source_url=None,
                         source_storage_options=None, board_fetch=None) -> None:
    """`convert`'s parts `todo` of `plan`, one Spark task each; `stored(name, entry)` for each, in part order."""
    if not todo:
        return
    jobs = [(part_name(part, plan.partitions),
             [plan.rows[start:stop] for start, stop in (plan.bounds[g] for g in plan.part_groups(part))])
            for part in todo]
    task = functools.partial(_convert_parts_task, url=location.url, storage_options=location.storage_options,
                             parallel=parallel, max_pixels=max_pixels, memory_budget_mb=memory_budget_mb,
                             max_side=max_side, quality=quality, source_url=source_url,
                             source_storage_options=source_storage_options, board_fetch=board_fetch)
    rdd = spark.sparkContext.parallelize(jobs, len(jobs)).mapPartitions(task)
    hidden = dict(location.storage_options or {}, source=source_storage_options or {},
                  board=(board_fetch or {}).get("board_spec") or {})
    results = dict(_run_job(spark, f"pinstorm convert: {len(jobs)} part(s) to {location.url}", rdd, hidden))
    missing = [name for name, _ in jobs if name not in results]
    if missing:   # cannot happen with a finished job; never commit a dataset short of a part
        raise SparkConverterError(f"{location.url}: the Spark job returned no result for {', '.join(missing[:5])}")
    for name, _ in jobs:
        stored(name, results[name])
    _remove_attempt_temporaries(location)


def _convert(plan, classes, names, split, location, *, parallel, overwrite, progress, on_part, source,
             started, seed, load, spark=None, load_options=None) -> ConvertResult:
    existing, done = _prepare_output(location, plan, overwrite)
    if existing is not None:
        report = _read_json(location, REPORT) or {}
        return ConvertResult(location.url, existing.rows, existing.row_groups, existing.partitions,
                             existing.bytes, existing.classes, report.get("skipped", []),
                             report.get("reencoded", []), time.monotonic() - started, 0, plan.partitions,
                             location.join(REPORT), existing.empty_classes or [])

    todo = [p for p in range(plan.partitions) if part_name(p, plan.partitions) not in done]
    total = sum(plan.bounds[g][1] - plan.bounds[g][0] for p in todo for g in plan.part_groups(p))
    parts = dict(done)

    def stored(name, entry):
        parts[name] = entry
        _write_json(location, PROGRESS, {"plan": plan.digest, "parts": parts})
        if on_part is not None:
            on_part(name, entry)

    if spark is not None:   # each executor writes its parts; the driver records them as they come back
        write_parts_on_spark(spark, location, plan, todo, stored, parallel=parallel, **(load_options or {}))
    else:
        with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 2) as pool, \
                progress_bar("convert", total, unit="images", enabled=progress) as advance:
            for part in todo:
                name = part_name(part, plan.partitions)
                stored(name, _write_part(location, plan, part, pool, advance, load))

    ordered = [part_name(p, plan.partitions) for p in range(plan.partitions)]
    if sum(parts[n]["rows"] for n in ordered) == 0:
        raise InvalidPipelineInput(f"none of the {len(plan.rows)} images could be read; see {location.join(PROGRESS)}")
    info, skipped, reencoded = commit_dataset(location, parts, ordered, classes=classes, names=names, split=split,
                                              seed=seed, digest=plan.digest, source=source)
    images_read = sum(plan.bounds[g][1] - plan.bounds[g][0] for p in todo for g in plan.part_groups(p))
    return ConvertResult(location.url, info.rows, info.row_groups, plan.partitions, info.bytes, classes,
                         skipped, reencoded, time.monotonic() - started, images_read, len(done),
                         location.join(REPORT), list(info.empty_classes or []))


def commit_dataset(location, parts: dict, ordered: list[str], *, classes, names, split, seed, digest,
                   source, schema=None, extra=None) -> tuple[DatasetInfo, list, list]:
    """Make `location` a dataset from its written parts (`parts`: name -> `write_part_file` entry, in
    `ordered` order): the report, then ``_common_metadata`` (the completeness marker), once.
    A tabular dataset (no classes) gives its Arrow `schema` and `extra` keys (its checksum, columns).
    Returns (the pinstorm metadata as a `DatasetInfo`, skipped, re-encoded)."""
    skipped = [s for n in ordered for s in parts[n]["skipped"]]
    reencoded = [r for n in ordered for r in parts[n]["reencoded"]]
    class_rows = dict.fromkeys(classes, 0)  # one pass over the parts: not classes x parts (21,841 x 1,000+)
    for n in ordered:
        for wnid, count in parts[n]["class_rows"].items():
            if wnid in class_rows:
                class_rows[wnid] += count
    rows = sum(parts[n]["rows"] for n in ordered)
    files = {n: {"rows": parts[n]["rows"], "row_groups": len(parts[n]["row_group_rows"]),
                 "bytes": parts[n]["bytes"], "xxh3": parts[n]["xxh3"], "footer_xxh3": parts[n]["footer_xxh3"],
                 "row_group_xxh3": parts[n]["row_group_xxh3"],
                 **({"row_group_bytes_xxh3": parts[n]["row_group_bytes_xxh3"]}
                    if "row_group_bytes_xxh3" in parts[n] else {})} for n in ordered}
    empty_classes = [wnid for wnid in classes if not class_rows[wnid]]
    info = {
        "format": FORMAT_VERSION, "rows": rows, "num_classes": len(classes), "classes": classes,
        "names": names, "class_rows": [class_rows[w] for w in classes], "split": split,
        "partitions": len(ordered), "row_groups": sum(f["row_groups"] for f in files.values()),
        "row_group_rows": [r for n in ordered for r in parts[n]["row_group_rows"]],
        "files": files, "bytes": sum(f["bytes"] for f in files.values()),
        "skipped": len(skipped), "reencoded": len(reencoded), "empty_classes": empty_classes,
        "reoriented": count_flag(reencoded, "reoriented"),
        "resized": count_flag(reencoded, "resized"),
        "checksum": CHECKSUM, "seed": seed, "plan": digest,
        "source": source, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if not classes:
        del info["class_rows"]
    info.update(extra or {})
    _write_json(location, REPORT, {"rows": rows, "skipped": skipped, "reencoded": reencoded})
    write_common_metadata(location, info, {n: f["row_groups"] for n, f in files.items()}, schema=schema)
    if location.fs.exists(location.join(PROGRESS)):
        location.fs.rm(location.join(PROGRESS))
    return DatasetInfo.from_dict(info), skipped, reencoded


def _convert_to_board(plan, classes, names, split, url, *, parallel, overwrite, progress, on_part,
                      description, started, seed, load, **on_spark) -> ConvertResult:
    """Convert into a private staging folder, then pin it unzipped.

    The staging folder is a fresh `tempfile.mkdtemp` (mode 0700, unpredictable name), removed
    afterwards: a fixed name in a shared /tmp let another local user plant files that were then
    published inside the pin. An interrupted board conversion therefore starts over; to resume a
    long one, convert to a folder (which resumes) and pin that.
    The dataset sits in a subfolder of the pin (``<pin>/part-*.parquet``): the pin's own version
    folder also holds its ``data.txt``, which petastorm would take for a Parquet file.
    """

    board, pin = parse_board_url(url)
    staging = Path(tempfile.mkdtemp(prefix="pinstorm-convert-"))
    try:
        result = _convert(plan, classes, names, split, resolve(staging / pin), parallel=parallel,
                          overwrite=overwrite, progress=progress, on_part=on_part, source=description,
                          started=started, seed=seed, load=load, **on_spark)
        info = read_info(resolve(staging / pin))
        boards.pin(str(staging), name=pin, board=board, zip=False,
                   description=f"pinstorm dataset: {info.rows} images of {info.num_classes} classes "
                               f"({split}) from {description}",
                   metadata={"pinstorm": {"rows": info.rows, "num_classes": info.num_classes,
                                          "partitions": info.partitions, "row_groups": info.row_groups,
                                          "split": split}})
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result.url = url
    result.report_url = f"{url}/{REPORT}"
    return result
