"""Datasets written by Spark executors: `make_spark_converter(df)` (and the session `pinstorm convert --spark` uses).

Why: a Spark cluster that already holds the images (a DataFrame of bytes, an ILSVRC tree on shared
storage) should prepare the dataset itself, each executor writing its own parts, rather than one
machine reading 1.28 M images. petastorm's `make_spark_converter` is the familiar entry point; this is
its pinstorm counterpart, writing pinstorm's format (petastorm's metadata plus pinstorm's checksums)
through the same per-part writer as `convert` (`convert.write_part_file`), the images bounded and
checked by `images.check_image`, and the metadata committed once, by the driver
(`convert.commit_dataset`).

`convert(..., spark=session)` shares all of this; its tasks live in `convert` beside the one-machine
writer (`convert.write_parts_on_spark`), which this module imports.

* A part is named after its Spark partition (`part-00003.parquet`) and written under a temporary name
  of its own task attempt, then renamed into place: a retried or speculative attempt overwrites the
  same name with the same bytes, never adds a duplicate. The driver commits exactly the parts whose
  results it collected and then removes the temporaries of attempts that died.
* The converter's cache: a DataFrame with the same analysed plan (Spark's ``sameResult``) and the same
  settings reuses the dataset made for it in this process; each cache folder is a fresh folder under
  `cache_url` (or the Spark conf ``pinstorm.spark.converter.parentCacheDirUrl``), and
  `SparkDatasetConverter.delete()` or interpreter exit remove only the folders this process made.

Importing this module imports neither pyspark nor TensorFlow nor torch.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

from pinstorm.boards.safety import secrets

from .contracts import DatasetInfo
from .convert import (SparkConverterError, _attempt_tmp_name, _remove_attempt_temporaries, _run_job,
                      commit_dataset, write_part_file)
from .errors import InvalidPipelineInput
from .images import DEFAULT_MAX_PIXELS, DOWNSCALE_QUALITY, UndecodableImage, check_image
from .metadata import COMMON_METADATA, part_name
from .storage import resolve

log = secrets.logger(__name__)

PARENT_CACHE_DIR_URL_CONF = "pinstorm.spark.converter.parentCacheDirUrl"
PETASTORM_PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"   # read too, for migration
DEFAULT_ROW_GROUP_BYTES = 32 * 2**20   # petastorm's parquet_row_group_size_bytes default
CACHE_PREFIX = "pinstorm-converter-"
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")


# ---------------------------------------------------------------------------------------------
# Tasks (run on the executors; module-level so Spark ships them by reference)


def _checked_rows(index, rows, *, has_filename, classes, class_index, max_pixels, max_side, quality,
                  row_group_bytes, extras=0):
    """A DataFrame partition's rows as row groups of ((filename, wnid, label), checked or reason) pairs,
    each about `row_group_bytes` of image bytes; with `extras` extra columns (the row's last ones), of
    triples ((filename, wnid, label), checked, their values)."""
    group, size = [], 0
    for i, row in enumerate(rows):
        image, value = row[0], row[1]
        filename = str(row[2])[:255] if has_filename and row[2] is not None else f"row-{index:05d}-{i:09d}"
        label, wnid, checked = -1, "", None
        if value is None:
            checked = "no label (null)"
        elif class_index is not None:               # string labels, or integer labels with a class list
            label = class_index.get(value, -1)
            if label < 0:
                checked = f"label {repr(value)[:80]} is not one of the {len(classes)} classes"
            else:
                wnid = classes[label]
        elif isinstance(value, int) and 0 <= value < 2**31:
            label, wnid = int(value), str(value)
        else:
            checked = f"label {value!r} is not a class index (0 .. 2**31 - 1)"
        if checked is None:
            if image is None:
                checked = "no image (null)"
            else:
                try:
                    checked = check_image(bytes(image), name=filename, max_pixels=max_pixels, max_side=max_side,
                                          quality=quality)
                except UndecodableImage as error:
                    checked = str(error).split(": ", 1)[-1]
        group.append(((filename, wnid, label), checked, tuple(row[len(row) - extras:])) if extras
                     else ((filename, wnid, label), checked))
        size += len(image) if image is not None else 0
        if size >= row_group_bytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def _dataframe_part_task(index, rows, *, url, storage_options, parts, extra_fields=(), **options):
    """Write Spark partition `index` of the DataFrame as ``part-<index>.parquet`` (nothing for an empty
    partition); yields (name, entry), entry ``{"skipped": [...], "empty": True}`` when every row was
    skipped (no part kept)."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return
    location = resolve(url, storage_options)
    name = part_name(index, parts)
    entry = write_part_file(location, name, _checked_rows(index, itertools.chain([first], rows),
                                                          extras=len(extra_fields), **options),
                            tmp_name=_attempt_tmp_name(name), extra_fields=list(extra_fields))
    if entry["rows"] == 0:
        location.fs.rm(location.join(name))
        yield name, {"skipped": entry["skipped"], "empty": True}
    else:
        yield name, entry


# ---------------------------------------------------------------------------------------------
# Driver side


def spark_session_for(master: str, app_name: str = "pinstorm-convert"):
    """A SparkSession on `master` whose executors run this interpreter (unless ``PYSPARK_PYTHON`` says
    otherwise); on ``local[...]`` or a master on loopback the driver binds 127.0.0.1 only. For
    `pinstorm convert --spark` (the pipeline does not import `training.spark_session`, which is made for
    barrier training)."""
    from pinstorm.extras import require

    SparkSession = require("pyspark.sql", "spark", "conversion on Spark").SparkSession
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.ui.showConsoleProgress", "false")
    hosts = [entry.rsplit(":", 1)[0].strip("[]") for entry in master[len("spark://"):].split(",")] \
        if master.startswith("spark://") else []
    if master.startswith("local") or (hosts and all(h in ("127.0.0.1", "localhost", "::1") for h in hosts)):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")        # nothing listens beyond loopback
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1") \
            .config("spark.ui.enabled", "false")
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


# ---- the DataFrame converter ------------------------------------------------------------------

_lock = threading.Lock()
_created: dict[str, dict] = {}      # cache folders this process made: url -> storage options
_converters: list[tuple[object, tuple, "SparkDatasetConverter"]] = []   # (analysed plan, settings, converter)


def _remove_created() -> None:
    """At interpreter exit: remove the cache folders this process made, and nothing else."""
    with _lock:
        folders = list(_created.items())
        _created.clear()
        _converters.clear()
    for url, options in folders:
        with contextlib.suppress(Exception):   # best effort at exit: a vanished bucket must not raise here
            location = resolve(url, options)
            if location.fs.exists(location.path):
                location.fs.rm(location.path, recursive=True)


atexit.register(_remove_created)


class SparkDatasetConverter:
    """A DataFrame materialised as a pinstorm dataset in a cache folder (petastorm's class of the same name).

    ``len(converter)`` / ``converter.dataset_size``: rows; ``converter.cache_dir_url``: the dataset;
    ``make_tf_dataset(...)`` and ``make_torch_dataloader(...)``: context managers giving
    `make_dataset`'s ``tf.data.Dataset`` and `make_torch_loader`'s DataLoader; ``delete()`` removes the
    cache folder.

    Made by `make_spark_converter`, whose results these are.

    Args:
        cache_dir_url: Where the dataset is.
        info: The dataset's summary (`dataset_info`).
        storage_options: For fsspec when `cache_dir_url` is remote.
        skipped: The rows skipped, and why.
        reencoded: The images stored re-encoded, and why.
        seconds: How long writing the dataset took.
    """

    PARENT_CACHE_DIR_URL_CONF = PARENT_CACHE_DIR_URL_CONF

    def __init__(self, cache_dir_url: str, info: DatasetInfo, *, storage_options: dict | None = None,
                 skipped: list | None = None, reencoded: list | None = None, seconds: float = 0.0):
        self.cache_dir_url = cache_dir_url
        self.storage_options = dict(storage_options or {})
        self.info = info
        self.dataset_size = int(info.rows)
        self.classes = list(info.classes)
        self.skipped = list(skipped or [])
        self.reencoded = list(reencoded or [])
        self.seconds = seconds
        location = resolve(cache_dir_url, storage_options)
        self.file_urls = [f"{location.url}/{name}" for name in sorted(info.files)]

    def __len__(self) -> int:
        return self.dataset_size

    def __repr__(self) -> str:
        return (f"SparkDatasetConverter({self.cache_dir_url!r}, rows={self.dataset_size}, "
                f"classes={len(self.classes)}, parts={len(self.file_urls)})")

    @staticmethod
    def _reader_arguments(num_epochs, workers_count, shuffling_queue_capacity, cur_shard, shard_count,
                          options: dict) -> dict:
        """petastorm's argument names mapped onto pinstorm's readers; pinstorm's own names pass through."""
        arguments = dict(options)
        arguments["num_epochs"] = num_epochs
        if (cur_shard is None) != (shard_count is None):
            raise InvalidPipelineInput("give both cur_shard and shard_count, or neither")
        if cur_shard is not None:
            if "shard" in options:
                raise InvalidPipelineInput("give shard=(index, count) or cur_shard/shard_count, not both")
            arguments["shard"] = (int(cur_shard), int(shard_count))
        if shuffling_queue_capacity is not None:
            if shuffling_queue_capacity == 0:
                arguments.setdefault("shuffle", False)
            else:
                arguments.setdefault("shuffle_buffer", int(shuffling_queue_capacity))
        return arguments

    def make_tf_dataset(self, batch_size: int = 32, num_epochs: int | None = None, *, workers_count: int | None = None,
                        shuffling_queue_capacity: int | None = None, prefetch: int | None = None,
                        cur_shard: int | None = None, shard_count: int | None = None, **options):
        """``with converter.make_tf_dataset(batch_size=64) as dataset:`` a `make_dataset` ``tf.data.Dataset``
        of (images, labels) batches. Every `make_dataset` keyword is accepted (``image_size``, ``shard``,
        ``seed``, ``state`` to resume, ...); petastorm's defaults hold: 32 rows a batch, endless epochs
        (``num_epochs=None``). ``workers_count`` is ``parallel``; ``cur_shard``/``shard_count`` is ``shard``;
        ``shuffling_queue_capacity`` 0 turns shuffling off, n > 0 is ``shuffle_buffer``; ``prefetch``: that
        many batches prefetched (default: tf.data's autotuning, already on).

        Args:
            batch_size: Rows per batch.
            num_epochs: Exact passes (None: endless).
            workers_count: `make_dataset`'s ``parallel``.
            shuffling_queue_capacity: 0: no shuffling; n > 0: ``shuffle_buffer``.
            prefetch: Batches prefetched (None: tf.data's autotuning).
            cur_shard: With `shard_count`: ``shard=(cur_shard, shard_count)``.
            shard_count: See `cur_shard`.
            **options: Any other `make_dataset` keyword (`ReaderOptions`).

        Returns:
            A context manager giving the ``tf.data.Dataset``.
        """
        from .reader import make_dataset

        arguments = self._reader_arguments(num_epochs, workers_count, shuffling_queue_capacity, cur_shard,
                                           shard_count, options)
        if workers_count is not None:
            arguments.setdefault("parallel", int(workers_count))
        arguments.setdefault("storage_options", self.storage_options or None)
        dataset = make_dataset(self.cache_dir_url, batch_size=batch_size, **arguments)
        if prefetch is not None:
            dataset = dataset.prefetch(int(prefetch))
        return contextlib.nullcontext(dataset)

    def make_torch_dataloader(self, batch_size: int = 32, num_epochs: int | None = None, *,
                              workers_count: int | None = None, shuffling_queue_capacity: int | None = None,
                              cur_shard: int | None = None, shard_count: int | None = None, **options):
        """``with converter.make_torch_dataloader(batch_size=64) as loader:`` a `make_torch_loader` DataLoader
        of (images, labels) batches; every `make_torch_loader` keyword is accepted, petastorm's names
        mapped as in `make_tf_dataset` (``workers_count`` is ``num_workers``).

        Args:
            batch_size: Rows per batch.
            num_epochs: Exact passes (None: endless).
            workers_count: `make_torch_loader`'s ``num_workers``.
            shuffling_queue_capacity: 0: no shuffling; n > 0: ``shuffle_buffer``.
            cur_shard: With `shard_count`: ``shard=(cur_shard, shard_count)``.
            shard_count: See `cur_shard`.
            **options: Any other `make_torch_loader` keyword (`ReaderOptions`).

        Returns:
            A context manager giving the `TorchLoader`.
        """
        from .torch_loader import make_torch_loader

        arguments = self._reader_arguments(num_epochs, workers_count, shuffling_queue_capacity, cur_shard,
                                           shard_count, options)
        if workers_count is not None:
            arguments.setdefault("num_workers", int(workers_count))
        arguments.setdefault("storage_options", self.storage_options or None)
        return contextlib.nullcontext(make_torch_loader(self.cache_dir_url, batch_size=batch_size, **arguments))

    def delete(self) -> None:
        """Remove the cache folder, if this process made it (never anything else); later calls for the same
        DataFrame convert it again."""
        with _lock:
            options = _created.pop(self.cache_dir_url, None)
            _converters[:] = [entry for entry in _converters if entry[2] is not self]
        if options is None:
            return
        location = resolve(self.cache_dir_url, options)
        if location.fs.exists(location.path):
            location.fs.rm(location.path, recursive=True)


def _analysed_plan(df):
    try:
        return df._jdf.queryExecution().analyzed()
    except AttributeError:
        raise SparkConverterError("make_spark_converter needs a classic PySpark DataFrame (Spark Connect "
                                  "DataFrames do not expose their analysed plan)") from None


def _same_result(cached_plan, plan) -> bool:
    """Spark's ``sameResult`` of two analysed plans; False when the cached one cannot be asked (its session
    stopped)."""
    try:
        return bool(cached_plan.sameResult(plan))
    except Exception:  # noqa: BLE001 - py4j errors of a plan from a stopped context: not the same
        return False


def _parent_cache_url(df, cache_url) -> str:
    if cache_url is not None:
        return os.fspath(cache_url)
    conf = df.sparkSession.conf
    for key in (PARENT_CACHE_DIR_URL_CONF, PETASTORM_PARENT_CACHE_DIR_URL_CONF):
        value = conf.get(key, None)
        if value:
            return value
    raise SparkConverterError(f"no cache folder: pass cache_url= or set the Spark conf {PARENT_CACHE_DIR_URL_CONF} "
                              "to a folder or URL every executor can write (file:///shared/cache, s3://bucket/cache)")


def _check_columns(df, image_col: str, label_col: str, filename_col: str | None) -> str:
    """The label kind ("integer" or "string"); `SparkConverterError` for missing or mistyped columns."""
    fields = {field.name: type(field.dataType).__name__ for field in df.schema.fields}
    wanted = [(image_col, ("BinaryType",), "image bytes (BinaryType)"),
              (label_col, (*_INTEGRAL, "StringType"), "class indexes (an integer type) or class names (StringType)")]
    if filename_col is not None:
        wanted.append((filename_col, ("StringType",), "file names (StringType)"))
    for column, types, what in wanted:
        if column not in fields:
            raise SparkConverterError(f"the DataFrame has no column {column!r} (columns: {', '.join(fields)}); "
                                      f"name its column of {what} with the matching *_col argument")
        if fields[column] not in types:
            raise SparkConverterError(f"column {column!r} is {fields[column]}; it must hold {what}")
    return "string" if fields[label_col] == "StringType" else "integer"


_EXTRA_TYPES = ("BooleanType", *_INTEGRAL, "FloatType", "DoubleType", "StringType", "BinaryType", "DateType",
                "DecimalType")
_PINSTORM_COLUMNS = ("image", "label", "wnid", "filename", "height", "width")


def _extra_columns(df, used: list[str], extra_cols) -> list:
    """The DataFrame's other columns to keep, as Arrow fields: `extra_cols` (None: every other column of a
    scalar, string or bytes type; the rest are left out, said in a log line)."""
    import pyarrow as pa

    def arrow(data_type):
        kind = type(data_type).__name__
        if kind == "DecimalType":
            return pa.decimal128(data_type.precision, data_type.scale)
        return {"BooleanType": pa.bool_(), "ByteType": pa.int8(), "ShortType": pa.int16(), "IntegerType": pa.int32(),
                "LongType": pa.int64(), "FloatType": pa.float32(), "DoubleType": pa.float64(),
                "StringType": pa.string(), "BinaryType": pa.binary(), "DateType": pa.date32()}[kind]

    fields = {field.name: field.dataType for field in df.schema.fields}
    if extra_cols is not None:
        wanted = [str(c) for c in extra_cols]
        for column in wanted:
            if column not in fields:
                raise SparkConverterError(f"extra_cols: the DataFrame has no column {column!r}")
            if column in used or column in _PINSTORM_COLUMNS:
                raise SparkConverterError(f"extra_cols: {column!r} is one of the dataset's own columns "
                                          f"({', '.join(_PINSTORM_COLUMNS)}) or an *_col argument; rename it")
            if type(fields[column]).__name__ not in _EXTRA_TYPES:
                raise SparkConverterError(f"extra_cols: column {column!r} is {type(fields[column]).__name__}; extra "
                                          "columns hold scalars, strings or bytes (to_json() a nested column first)")
        return [pa.field(column, arrow(fields[column])) for column in wanted]
    kept, left = [], []
    for column, data_type in fields.items():
        if column in used:
            continue
        if column in _PINSTORM_COLUMNS or type(data_type).__name__ not in _EXTRA_TYPES:
            left.append(column)
        else:
            kept.append(pa.field(column, arrow(data_type)))
    if left:
        log.warning("make_spark_converter: column(s) %s not stored (a name of the dataset's own columns, or not "
                    "a scalar, string or bytes type)", ", ".join(left))
    return kept


def make_spark_converter(df, *, cache_url=None, image_col: str = "image", label_col: str = "label",
                         filename_col: str | None = None, classes=None,
                         row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES, storage_options: dict | None = None,
                         max_pixels: int | None = DEFAULT_MAX_PIXELS, max_side: int | None = None,
                         quality: int = DOWNSCALE_QUALITY, parquet_row_group_size_bytes: int | None = None,
                         extra_cols=None) -> SparkDatasetConverter:
    """Materialise `df` as a pinstorm dataset in a cache folder, written by the executors; return a
    `SparkDatasetConverter` to read it as tf.data or a PyTorch DataLoader.

    `df`: a column of image bytes (`image_col`, BinaryType) and one of labels (`label_col`): integer
    class indexes, or class names (strings) numbered in the order of `classes` (default: sorted).
    With integer labels `classes` (optional) names each index. `filename_col`: a string column kept as
    each row's file name (else ``row-<partition>-<n>``). Each Spark partition becomes one part file of
    row groups of about `row_group_bytes` (`parquet_row_group_size_bytes`, petastorm's name, is the same):
    ``df.repartition(n)`` first for more parts, i.e. more executors writing and more reader shards.
    Rows keep the DataFrame's order; the readers shuffle row groups and rows.

    The DataFrame's other columns of scalar, string or bytes types (boolean, integers, floats, decimal,
    date, string, binary) are stored too, as extra Parquet columns after pinstorm's six, which the readers
    ignore (`extra_cols`: just these; other types, and names of the dataset's own columns, are left out
    with a log line unless named there, which is an error).

    Images are checked as `convert` checks files (`max_pixels`, `max_side`, `quality`): what does not
    decode, and rows with a null image or a label outside the classes, are skipped and listed in
    ``converter.skipped`` and the dataset's report.

    `cache_url`: the parent folder (a path or fsspec URL every executor can write); default the Spark
    conf ``pinstorm.spark.converter.parentCacheDirUrl`` (or petastorm's
    ``petastorm.spark.converter.parentCacheDirUrl``). The same DataFrame (the same analysed plan, as
    Spark's ``sameResult`` says) with the same arguments reuses its dataset within this process.

    Args:
        df: A Spark DataFrame with an image-bytes column and a label column.
        cache_url: The parent folder of the cached datasets (None: the Spark conf above).
        image_col: The column of image bytes (BinaryType).
        label_col: The column of labels: integer class indexes or class names.
        filename_col: A string column kept as each row's file name (None: ``row-<partition>-<n>``).
        classes: The class names in label order (None: string labels sorted).
        row_group_bytes: The target size of a row group in bytes.
        storage_options: For fsspec (credentials, endpoints) when `cache_url` is remote.
        max_pixels: As `convert`'s.
        max_side: As `convert`'s.
        quality: As `convert`'s.
        parquet_row_group_size_bytes: petastorm's name for `row_group_bytes`.
        extra_cols: The other columns to store (None: every one of a scalar, string or bytes type).

    Returns:
        A `SparkDatasetConverter` (``make_tf_dataset``, ``make_torch_dataloader``, ``delete``).
    """
    if parquet_row_group_size_bytes is not None:
        row_group_bytes = parquet_row_group_size_bytes
    if isinstance(row_group_bytes, bool) or int(row_group_bytes) != row_group_bytes or row_group_bytes < 1:
        raise SparkConverterError(f"row_group_bytes must be a positive integer, got {row_group_bytes!r}")
    if max_side is not None and (isinstance(max_side, bool) or int(max_side) != max_side or max_side < 1):
        raise SparkConverterError(f"max_side must be None or a positive integer, got {max_side!r}")
    label_kind = _check_columns(df, image_col, label_col, filename_col)
    used = [image_col, label_col] + ([filename_col] if filename_col else [])
    extra_fields = _extra_columns(df, used, extra_cols)
    parent = _parent_cache_url(df, cache_url)
    plan = _analysed_plan(df)
    if classes is not None:
        classes = [str(c) for c in classes]
        if len(set(classes)) != len(classes):
            raise SparkConverterError("classes contains duplicates")
    settings = (parent, json.dumps(storage_options or {}, sort_keys=True, default=str), image_col, label_col,
                filename_col, tuple(classes) if classes is not None else None, int(row_group_bytes), max_pixels,
                max_side, quality, tuple(str(field) for field in extra_fields))
    with _lock:
        for cached_plan, cached_settings, converter in _converters:
            if cached_settings == settings and _same_result(cached_plan, plan):
                location = resolve(converter.cache_dir_url, converter.storage_options)
                if location.fs.exists(location.join(COMMON_METADATA)):
                    log.info("%s: reusing the dataset of the same DataFrame", converter.cache_dir_url)
                    return converter
    started = time.monotonic()
    if label_kind == "string" and classes is None:
        found = [row[0] for row in df.select(label_col).distinct().collect()]
        classes = sorted(str(value) for value in found if value is not None)
        if not classes:
            raise SparkConverterError(f"column {label_col!r} holds no label")
    class_index = None     # a label value -> its index in `classes`
    if classes is not None:
        class_index = {name: i for i, name in enumerate(classes)} if label_kind == "string" \
            else {i: i for i in range(len(classes))}

    parent_location = resolve(parent, storage_options)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{CACHE_PREFIX}{stamp}-{uuid.uuid4().hex[:12]}"
    location = resolve(f"{parent_location.url.rstrip('/')}/{name}", storage_options)
    location.fs.makedirs(location.path, exist_ok=False)
    with _lock:
        _created[location.url] = dict(storage_options or {})
    try:
        columns = [image_col, label_col] + ([filename_col] if filename_col else [])
        columns += [field.name for field in extra_fields]
        rdd = df.select(*columns).rdd
        parts = rdd.getNumPartitions()
        task = functools.partial(
            _dataframe_part_task, url=location.url, storage_options=location.storage_options, parts=parts,
            has_filename=filename_col is not None, classes=classes, class_index=class_index, max_pixels=max_pixels,
            max_side=max_side, quality=quality, row_group_bytes=int(row_group_bytes), extra_fields=extra_fields)
        results = _run_job(df.sparkSession, f"pinstorm make_spark_converter: {parts} partition(s) to {location.url}",
                           rdd.mapPartitionsWithIndex(task), storage_options)
        written = {name: entry for name, entry in results if not entry.get("empty")}
        all_skipped = [s for _, entry in sorted(results) for s in entry["skipped"]]
        if not written:
            raise SparkConverterError(f"none of the DataFrame's rows could be stored ({len(all_skipped)} skipped"
                                      + (f", e.g. {all_skipped[0]['path']}: {all_skipped[0]['reason']}"
                                         if all_skipped else ": it has no rows") + ")")
        if classes is None:   # integer labels without names: 0 .. the largest label
            top = max(int(wnid) for entry in written.values() for wnid in entry["class_rows"])
            classes = [str(i) for i in range(top + 1)]
        ordered = sorted(written)
        # the rows of wholly skipped partitions are reported too (they left no part behind)
        for name, entry in sorted(results):
            if entry.get("empty"):
                written[ordered[0]]["skipped"] = written[ordered[0]]["skipped"] + entry["skipped"]
        digest = hashlib.sha256(json.dumps([str(plan.toString()), settings[2:]], default=str).encode()).hexdigest()
        info, skipped, reencoded = commit_dataset(
            location, written, ordered, classes=classes, names={c: c for c in classes}, split="train", seed=None,
            digest=digest[:32], source=f"Spark DataFrame ({parts} partitions, columns {', '.join(columns)})")
        _remove_attempt_temporaries(location)
    except BaseException:
        with _lock:
            _created.pop(location.url, None)
        with contextlib.suppress(Exception):
            location.fs.rm(location.path, recursive=True)
        raise
    if skipped:
        log.warning("%s: skipped %d row(s) of the DataFrame (listed in converter.skipped)", location.url,
                    len(skipped))
    converter = SparkDatasetConverter(location.url, info, storage_options=storage_options, skipped=skipped,
                                      reencoded=reencoded, seconds=time.monotonic() - started)
    with _lock:
        _converters.append((plan, settings, converter))
    return converter
