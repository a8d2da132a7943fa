"""Write images as Parquet row groups in petastorm's format, atomically and resumably, without Spark.

Rows: ``image`` (the JPEG bytes as they were, see `pipeline.images`), ``label`` (index of the wnid
in `classes`), ``wnid``, ``filename`` (the original file name), ``height``, ``width``.

* Rows are shuffled with a seeded generator before they are cut into row groups, so every row
  group mixes classes and shuffling row groups at read time yields well-mixed batches.
* Row groups hold about `row_group_size_mb` each and have the same number of rows (+-1); there are
  at least `min_row_groups` (row groups are the unit readers shard and shuffle by), a multiple of
  `partitions`. Part file *p* holds the p-th slice of row groups, so N partitions are N balanced
  shards.
* Files that do not decode to an image are skipped and listed in ``_pinstorm_report.json`` and in
  the returned `ConvertResult` - never a crash, never a silent drop.
* Each part is written under a temporary name and renamed when whole; progress is recorded in
  ``_pinstorm_progress.json``; ``_common_metadata``, written last, is what makes the folder a
  dataset. Re-running an interrupted conversion with the same inputs keeps the finished parts and
  writes the rest; with different inputs it starts over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from .images import UndecodableImage, check_image
from .layout import Layout, scan
from .metadata import (ARROW_SCHEMA, COMMON_METADATA, FORMAT_VERSION, PART_PREFIX, PROGRESS, REPORT, TMP_PREFIX,
                       part_name, read_info, write_common_metadata)
from pinstorm.progress import progress_bar
from .storage import is_board_url, parse_board_url, resolve
from pinstorm.errors import PinstormError

log = logging.getLogger(__name__)

PLAN_VERSION = 1


class DatasetExistsError(PinstormError, FileExistsError):
    """The output already holds a finished dataset from other inputs, or files pinstorm did not write."""


@dataclass
class ConvertResult:
    """What a conversion wrote, and what it skipped or re-encoded (also in ``_pinstorm_report.json``)."""

    url: str
    rows: int
    row_groups: int
    partitions: int
    bytes: int
    classes: list[str]
    skipped: list[dict] = field(default_factory=list)     # {"path", "reason"}
    reencoded: list[dict] = field(default_factory=list)   # {"path", "format", "mode"}
    seconds: float = 0.0
    images_read: int = 0          # images read in this run (0 when the dataset was already complete)
    parts_reused: int = 0         # parts kept from an interrupted earlier run
    report_url: str = ""

    @property
    def images_per_second(self) -> float:
        return self.images_read / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Sources


def _source_items(source, classes, split):
    """(items [(path, wnid)], classes, names, description) from a Layout, a data map or a folder."""
    if isinstance(source, (str, os.PathLike)) and not is_board_url(source):
        source = scan(source)
    if isinstance(source, Layout):
        items = source.items(split)
        default_classes, names = source.classes, dict(source.names)
        description = f"{source.root} ({source.kind}, {split})"
    elif isinstance(source, Mapping):
        missing = {"image", "category"} - set(source)
        if missing:
            raise ValueError(f"a data map needs keys 'image' and 'category'; missing {sorted(missing)}")
        images, categories = list(source["image"]), list(source["category"])
        if len(images) != len(categories):
            raise ValueError(f"data map: {len(images)} images but {len(categories)} categories")
        items = [(os.fspath(p), str(c)) for p, c in zip(images, categories)]
        # `classes` (all wnids, set by imagenet_partition) keeps labels global when one slice is converted.
        default_classes = list(source.get("classes") or source.get("categories") or sorted(set(categories)))
        names = dict(source.get("names") or {})
        description = f"data map of {len(items)} images"
    else:
        raise TypeError(f"source must be a Layout, a data map or a folder, not {type(source).__name__}")
    if not items:
        raise ValueError(f"{description}: no images to convert")
    classes = list(classes) if classes is not None else list(default_classes)
    if len(set(classes)) != len(classes):
        raise ValueError("classes contains duplicates")
    known = set(classes)
    unknown = sorted({wnid for _, wnid in items if wnid not in known})
    if unknown:
        raise ValueError(f"{description}: images of classes missing from `classes`: "
                         f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
    names = {wnid: names.get(wnid, wnid) for wnid in classes}
    return items, classes, names, description


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


def _plan(items, classes, partitions, row_group_size_mb, min_row_groups, seed) -> _Plan:
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    n = len(items)
    if n < partitions:
        raise ValueError(f"{n} images cannot fill {partitions} partitions")
    label_of = {wnid: i for i, wnid in enumerate(classes)}
    rows = sorted((path, wnid, label_of[wnid]) for path, wnid in items)
    random.Random(seed).shuffle(rows)

    sizes = []
    for path, _, _ in rows[:256]:   # already shuffled: a fair sample
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            pass
    mean_bytes = max(1.0, sum(sizes) / len(sizes)) if sizes else 110e3
    rows_per_group = max(1, int(row_group_size_mb * 2**20 / mean_bytes))
    groups = max(math.ceil(n / rows_per_group), min(min_row_groups, n), partitions)
    groups = math.ceil(groups / partitions) * partitions
    if groups > n:
        groups = n // partitions * partitions
    bounds = [(g * n // groups, (g + 1) * n // groups) for g in range(groups)]

    digest = hashlib.sha256()
    digest.update(json.dumps([PLAN_VERSION, classes, partitions, bounds]).encode())
    for path, _, label in rows:
        digest.update(f"{path}\0{label}\n".encode())
    return _Plan(rows, bounds, partitions, digest.hexdigest()[:32])


# ---------------------------------------------------------------------------------------------
# Writing


def _load(row):
    """Read and check one file: (row, CheckedImage) or (row, reason it was skipped)."""
    path = row[0]
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        return row, check_image(data, name=os.path.basename(path))
    except UndecodableImage as error:
        return row, str(error).split(": ", 1)[-1]
    except OSError as error:
        return row, f"unreadable: {error.strerror or error}"


def _write_part(location, plan, part, pool, advance) -> dict:
    """Write one part file (temporary name, then rename); return its entry for the progress file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name = part_name(part, plan.partitions)
    tmp = location.join(TMP_PREFIX + name)
    groups = list(plan.part_groups(part))
    entry = {"rows": 0, "row_group_rows": [], "skipped": [], "reencoded": [], "class_rows": {}}

    def submit(g):
        start, stop = plan.bounds[g]
        return [pool.submit(_load, row) for row in plan.rows[start:stop]]

    pending = submit(groups[0]) if groups else []
    # A native file for local folders: pyarrow then writes without Python file objects (or the GIL).
    with (pa.OSFile(tmp, "wb") if location.is_local else location.fs.open(tmp, "wb")) as handle:
        writer = pq.ParquetWriter(handle, ARROW_SCHEMA, compression={"image": "NONE", "label": "SNAPPY",
                                  "wnid": "SNAPPY", "filename": "SNAPPY", "height": "SNAPPY", "width": "SNAPPY"},
                                  use_dictionary=["wnid"], write_statistics=["label", "height", "width"])
        try:
            for position, g in enumerate(groups):
                current = pending
                pending = submit(groups[position + 1]) if position + 1 < len(groups) else []
                columns = {key: [] for key in ARROW_SCHEMA.names}
                for future in current:
                    (path, wnid, label), checked = future.result()
                    advance(1)
                    if isinstance(checked, str):
                        entry["skipped"].append({"path": path, "reason": checked})
                        continue
                    if checked.reencoded:
                        entry["reencoded"].append({"path": path, "format": checked.original_format,
                                                   "mode": checked.original_mode})
                    columns["image"].append(checked.data)
                    columns["label"].append(label)
                    columns["wnid"].append(wnid)
                    columns["filename"].append(os.path.basename(path))
                    columns["height"].append(checked.height)
                    columns["width"].append(checked.width)
                    entry["class_rows"][wnid] = entry["class_rows"].get(wnid, 0) + 1
                if not columns["image"]:
                    continue   # every file of this row group was broken: no empty row group
                table = pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
                writer.write_table(table, row_group_size=len(table))
                entry["rows"] += len(table)
                entry["row_group_rows"].append(len(table))
        finally:
            writer.close()
            for future in pending:
                future.cancel()
    location.fs.mv(tmp, location.join(name))
    entry["bytes"] = location.fs.size(location.join(name))
    return entry


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
        if info.get("plan") == plan.digest and not overwrite:
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
            if name in names and location.fs.size(location.join(name)) == entry.get("bytes"):
                done[name] = entry
    stale = [n for n in names if _ours(n) and n not in done and n != PROGRESS]
    _clear(location, stale)
    location.fs.makedirs(location.path, exist_ok=True)
    _write_json(location, PROGRESS, {"plan": plan.digest, "parts": done})
    return None, done


def convert(source, output_url, *, partitions: int = 1, row_group_size_mb: float = 32,
            min_row_groups: int = 16, classes=None, split: str = "train", seed: int = 0,
            parallel: int | None = None, overwrite: bool = False, storage_options: dict | None = None,
            progress: bool | None = None, on_part: Callable[[str, dict], None] | None = None,
            description: str | None = None) -> ConvertResult:
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
    """
    started = time.monotonic()
    items, classes, names, source_description = _source_items(source, classes, split)
    plan = _plan(items, classes, partitions, row_group_size_mb, min_row_groups, seed)
    if is_board_url(output_url):
        result = _convert_to_board(plan, classes, names, split, output_url, parallel=parallel,
                                   overwrite=overwrite, progress=progress, on_part=on_part,
                                   description=description or source_description, started=started, seed=seed)
    else:
        result = _convert(plan, classes, names, split, resolve(output_url, storage_options), parallel=parallel,
                          overwrite=overwrite, progress=progress, on_part=on_part,
                          source=description or source_description, started=started, seed=seed)
    if result.skipped and result.images_read:
        log.warning("%s: skipped %d undecodable file(s), listed in %s", result.url, len(result.skipped),
                    result.report_url)
    return result


def _convert(plan, classes, names, split, location, *, parallel, overwrite, progress, on_part, source,
             started, seed) -> ConvertResult:
    existing, done = _prepare_output(location, plan, overwrite)
    if existing is not None:
        report = _read_json(location, REPORT) or {}
        return ConvertResult(location.url, existing["rows"], existing["row_groups"], existing["partitions"],
                             existing["bytes"], existing["classes"], report.get("skipped", []),
                             report.get("reencoded", []), time.monotonic() - started, 0, plan.partitions,
                             location.join(REPORT))

    todo = [p for p in range(plan.partitions) if part_name(p, plan.partitions) not in done]
    total = sum(plan.bounds[g][1] - plan.bounds[g][0] for p in todo for g in plan.part_groups(p))
    parts = dict(done)
    with ThreadPoolExecutor(max_workers=parallel or os.cpu_count() or 2) as pool, \
            progress_bar("convert", total, unit="images", enabled=progress) as advance:
        for part in todo:
            name = part_name(part, plan.partitions)
            parts[name] = _write_part(location, plan, part, pool, advance)
            _write_json(location, PROGRESS, {"plan": plan.digest, "parts": parts})
            if on_part is not None:
                on_part(name, parts[name])

    ordered = [part_name(p, plan.partitions) for p in range(plan.partitions)]
    skipped = [s for n in ordered for s in parts[n]["skipped"]]
    reencoded = [r for n in ordered for r in parts[n]["reencoded"]]
    class_rows = {wnid: sum(parts[n]["class_rows"].get(wnid, 0) for n in ordered) for wnid in classes}
    rows = sum(parts[n]["rows"] for n in ordered)
    if rows == 0:
        raise ValueError(f"none of the {len(plan.rows)} images could be read; see {location.join(PROGRESS)}")
    files = {n: {"rows": parts[n]["rows"], "row_groups": len(parts[n]["row_group_rows"]),
                 "bytes": parts[n]["bytes"]} for n in ordered}
    info = {
        "format": FORMAT_VERSION, "rows": rows, "num_classes": len(classes), "classes": classes,
        "names": names, "class_rows": [class_rows[w] for w in classes], "split": split,
        "partitions": plan.partitions, "row_groups": sum(f["row_groups"] for f in files.values()),
        "row_group_rows": [r for n in ordered for r in parts[n]["row_group_rows"]],
        "files": files, "bytes": sum(f["bytes"] for f in files.values()),
        "skipped": len(skipped), "reencoded": len(reencoded), "seed": seed, "plan": plan.digest,
        "source": source, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    _write_json(location, REPORT, {"rows": rows, "skipped": skipped, "reencoded": reencoded})
    write_common_metadata(location, info, {n: f["row_groups"] for n, f in files.items()})
    location.fs.rm(location.join(PROGRESS))
    images_read = sum(plan.bounds[g][1] - plan.bounds[g][0] for p in todo for g in plan.part_groups(p))
    return ConvertResult(location.url, rows, info["row_groups"], plan.partitions, info["bytes"], classes,
                         skipped, reencoded, time.monotonic() - started, images_read, len(done),
                         location.join(REPORT))


def _convert_to_board(plan, classes, names, split, url, *, parallel, overwrite, progress, on_part,
                      description, started, seed) -> ConvertResult:
    """Convert into a stable local folder (so an interrupted run resumes), then pin it unzipped.

    The dataset sits in a subfolder of the pin (``<pin>/part-*.parquet``): the pin's own version
    folder also holds its ``data.txt``, which petastorm would take for a Parquet file.
    """
    from pinstorm import boards
    board, pin = parse_board_url(url)
    staging = Path(tempfile.gettempdir()) / f"pinstorm-convert-{board}-{pin}"
    result = _convert(plan, classes, names, split, resolve(staging / pin), parallel=parallel, overwrite=overwrite,
                      progress=progress, on_part=on_part, source=description, started=started, seed=seed)
    info = read_info(resolve(staging / pin))
    boards.pin(str(staging), name=pin, board=board, zip=False,
               description=f"pinstorm dataset: {info['rows']} images of {info['num_classes']} classes "
                           f"({split}) from {description}",
               metadata={"pinstorm": {"rows": info["rows"], "num_classes": info["num_classes"],
                                      "partitions": info["partitions"], "row_groups": info["row_groups"],
                                      "split": split}})
    shutil.rmtree(staging, ignore_errors=True)
    result.url = url
    result.report_url = f"{url}/{REPORT}"
    return result
