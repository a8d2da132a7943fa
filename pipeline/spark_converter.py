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
* A DataFrame without images (`is_tabular`) is stored column for column: the executors receive its
  partitions through Spark's Arrow transfer (``mapInArrow``, types by pyspark's ``to_arrow_type``) and
  write them with `write_table_part` (the same temporary names, renames and checksums, over every
  column, `column_digest`); the driver commits through the same `convert.commit_dataset`.
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
import warnings
from datetime import datetime, timezone

import pyarrow as pa

from pinstorm.boards.safety import secrets

from .column_digest import TABLE_CHECKSUM, columns_digest
from .contracts import DatasetInfo
from .convert import (SparkConverterError, _attempt_tmp_name, _remove_attempt_temporaries, _run_job, commit_dataset,
                      finish_part, open_part_sink, row_group_written, write_part_file)
from .errors import InvalidPipelineInput
from .images import DEFAULT_MAX_PIXELS, DOWNSCALE_QUALITY, UndecodableImage, check_image
from .metadata import COMMON_METADATA, part_name
from .storage import resolve
from .verify import writer_options

log = secrets.logger(__name__)

PARENT_CACHE_DIR_URL_CONF = "pinstorm.spark.converter.parentCacheDirUrl"
PETASTORM_PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"   # read too, for migration
DEFAULT_ROW_GROUP_BYTES = 32 * 2**20   # petastorm's parquet_row_group_size_bytes default
CACHE_PREFIX = "pinstorm-converter-"
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")


# ---------------------------------------------------------------------------------------------
# Tasks (run on the executors; module-level so Spark ships them by reference)


def _local_to_utc(value, data_type):
    """A Row value as Arrow takes it: Spark hands TimestampType values to Python as naive local times,
    which Arrow's ``timestamp(tz="UTC")`` would read as UTC; nested values are walked by their type."""
    if value is None:
        return None
    kind = type(data_type).__name__
    if kind == "TimestampType":
        return value.astimezone(timezone.utc)   # naive: this process's local time, as pyspark made it
    if kind == "ArrayType":
        return [_local_to_utc(v, data_type.elementType) for v in value]
    if kind == "MapType":
        return [(_local_to_utc(k, data_type.keyType), _local_to_utc(v, data_type.valueType)) for k, v in value.items()]
    if kind == "StructType":
        return {f.name: _local_to_utc(v, f.dataType) for f, v in zip(data_type.fields, value)}
    return value


def _has_timestamp(data_type) -> bool:
    return "TimestampType(" in repr(data_type)


def _checked_rows(index, rows, *, has_filename, classes, class_index, max_pixels, max_side, quality,
                  row_group_bytes, extras=0, extra_types=()):
    """A DataFrame partition's rows as row groups of ((filename, wnid, label), checked or reason) pairs,
    each about `row_group_bytes` of image bytes; with `extras` extra columns (the row's last ones, of Spark
    types `extra_types`), of triples ((filename, wnid, label), checked, their values)."""
    convert = [(i, t) for i, t in enumerate(extra_types) if _has_timestamp(t)]
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
        values = list(row[len(row) - extras:]) if extras else None
        for i, data_type in convert:
            values[i] = _local_to_utc(values[i], data_type)
        group.append(((filename, wnid, label), checked, tuple(values)) if extras
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


def write_table_part(location, name: str, tables, *, schema, tmp_name: str) -> dict:
    """Write part `name` of a tabular dataset from `tables` (Arrow tables, one row group each) under
    `tmp_name`, renamed into place when whole: `write_part_file`'s rules and entry (rows, row groups,
    their `column_digest` checksums, file and footer checksums), for columns of any type."""
    import pyarrow.parquet as pq

    tmp = location.join(tmp_name)
    entry = {"rows": 0, "row_group_rows": [], "row_group_xxh3": [], "skipped": [], "reencoded": [],
             "class_rows": {}}
    with open_part_sink(location, tmp) as handle:
        with pq.ParquetWriter(handle, schema, compression="snappy", **writer_options()) as writer:
            row_group_written(handle)   # the file's magic: row group 0 starts after it
            for table in tables:
                writer.write_table(table, row_group_size=len(table))
                row_group_written(handle)
                entry["rows"] += len(table)
                entry["row_group_rows"].append(len(table))
                entry["row_group_xxh3"].append(columns_digest(table))
    return finish_part(location, tmp, name, entry, handle)


def _row_groups(batches, schema, row_group_bytes: int):
    """Arrow record batches regrouped into tables of about `row_group_bytes` (in memory), cast to `schema`;
    a batch larger than that is cut (Spark hands a partition over in batches of up to 10,000 rows)."""
    held, size = [], 0
    for batch in batches:
        per_row = max(1, batch.nbytes // max(1, batch.num_rows))
        start = 0
        while start < batch.num_rows:
            take = max(1, min(batch.num_rows - start, -(-(row_group_bytes - size) // per_row)))
            held.append(batch.slice(start, take))
            start += take
            size += take * per_row
            if size >= row_group_bytes:
                yield pa.Table.from_batches(held).cast(schema)
                held, size = [], 0
    if held:
        yield pa.Table.from_batches(held).cast(schema)


def _table_part_task(batches, *, url, storage_options, parts, schema, row_group_bytes):
    """``mapInArrow`` task: write this Spark partition of a tabular DataFrame as ``part-<index>.parquet``
    (nothing for an empty partition); yields one record batch of (name, entry as JSON)."""
    from pyspark import TaskContext

    groups = _row_groups(batches, schema, row_group_bytes)
    first = next(groups, None)
    if first is None:
        return
    location = resolve(url, storage_options)
    name = part_name(TaskContext.get().partitionId(), parts)
    entry = write_table_part(location, name, itertools.chain([first], groups), schema=schema,
                             tmp_name=_attempt_tmp_name(name))
    yield pa.RecordBatch.from_pydict({"name": [name], "entry": [json.dumps(entry)]})


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
    `make_dataset`'s ``tf.data.Dataset`` and `make_torch_loader`'s DataLoader, or for a tabular
    DataFrame (``converter.tabular``) petastorm's batch shapes (`columns_reader`); ``delete()`` removes
    the cache folder.

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

    @property
    def tabular(self) -> bool:
        """Whether the dataset holds a DataFrame's columns rather than images (`is_tabular`)."""
        return self.info.checksum == TABLE_CHECKSUM

    def _column_batches(self, batch_size, arguments: dict, workers_count):
        """The `ColumnBatches` of a tabular dataset for the reader arguments (petastorm's names mapped)."""
        from .columns_reader import ColumnBatches

        arguments = dict(arguments)
        if arguments.pop("shuffle_buffer", None) is not None:
            raise InvalidPipelineInput(
                "a tabular dataset's reader takes no shuffling_queue_capacity > 0 (shuffle_buffer): it shuffles "
                "the row groups in a seeded order and the rows within each row group, which a resume state "
                "replays exactly; for finer mixing write smaller row groups (row_group_bytes), or pass "
                "shuffling_queue_capacity=0 / shuffle=False for the stored order")
        arguments.pop("prefetch", None)
        for name in ("parallel", "num_workers"):
            value = arguments.pop(name, None)
            workers_count = workers_count if workers_count is not None else value
        unknown = sorted(set(arguments) - {"num_epochs", "shard", "seed", "shuffle", "columns", "storage_options",
                                           "state"})
        if unknown:
            raise InvalidPipelineInput(f"a tabular dataset's reader takes no {', '.join(unknown)} (it takes "
                                       "num_epochs, shard / cur_shard and shard_count, seed, shuffle, columns, "
                                       "workers_count, state)")
        arguments.setdefault("storage_options", self.storage_options or None)
        return ColumnBatches(self.cache_dir_url, batch_size=batch_size, workers=workers_count, **arguments)

    def make_tf_dataset(self, batch_size: int = 32, num_epochs: int | None = None, *, workers_count: int | None = None,
                        shuffling_queue_capacity: int | None = None, prefetch: int | None = None,
                        cur_shard: int | None = None, shard_count: int | None = None, **options):
        """``with converter.make_tf_dataset(batch_size=64) as dataset:`` a `make_dataset` ``tf.data.Dataset``
        of (images, labels) batches; of a tabular DataFrame, batches as namedtuples of column tensors
        (petastorm's shape: ``dataset.map(lambda x: (x.features, x.label))``, `columns_reader`), taking
        ``seed``, ``shuffle``, ``columns``, ``state`` (to resume mid-epoch: ``dataset.pinstorm_position.state(k)``
        after k batches, `ColumnBatches.state`) and the arguments below. For images every `make_dataset`
        keyword is accepted (``image_size``, ``shard``, ``seed``, ``state`` to resume, ...). petastorm's
        defaults hold: 32 rows a batch, endless epochs (``num_epochs=None``). ``workers_count`` is ``parallel``
        (row groups read ahead, tabular); ``cur_shard``/``shard_count`` is ``shard``;
        ``shuffling_queue_capacity`` 0 turns shuffling off, n > 0 is ``shuffle_buffer`` (images only: a
        tabular reader shuffles row groups and the rows within them, and refuses it); ``prefetch``: that
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
        arguments = self._reader_arguments(num_epochs, workers_count, shuffling_queue_capacity, cur_shard,
                                           shard_count, options)
        if self.tabular:
            from .columns_reader import make_columns_dataset

            return contextlib.nullcontext(make_columns_dataset(
                self._column_batches(batch_size, arguments, workers_count), prefetch=prefetch))
        from .reader import make_dataset

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
        of (images, labels) batches; of a tabular DataFrame, a `TorchColumnsLoader` of dicts of column ->
        tensor (petastorm's ``BatchedDataLoader`` shape: ``batch['features']``), taking what
        `make_tf_dataset` takes for one (``loader.state_dict()`` / ``state=`` to resume). For images every
        `make_torch_loader` keyword is accepted, petastorm's names mapped as in `make_tf_dataset`
        (``workers_count`` is ``num_workers``).

        Args:
            batch_size: Rows per batch.
            num_epochs: Exact passes (None: endless).
            workers_count: `make_torch_loader`'s ``num_workers``.
            shuffling_queue_capacity: 0: no shuffling; n > 0: ``shuffle_buffer``.
            cur_shard: With `shard_count`: ``shard=(cur_shard, shard_count)``.
            shard_count: See `cur_shard`.
            **options: Any other `make_torch_loader` keyword (`ReaderOptions`).

        Returns:
            A context manager giving the `TorchLoader` (a `TorchColumnsLoader` for a tabular dataset).
        """
        arguments = self._reader_arguments(num_epochs, workers_count, shuffling_queue_capacity, cur_shard,
                                           shard_count, options)
        if self.tabular:
            from .columns_reader import TorchColumnsLoader

            return TorchColumnsLoader(self._column_batches(batch_size, arguments, workers_count))
        from .torch_loader import make_torch_loader

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


_PINSTORM_COLUMNS = ("image", "label", "wnid", "filename", "height", "width")


def arrow_field(field):
    """The Arrow field a Spark column is stored as: pyspark's own mapping (``to_arrow_type``, what Spark's
    Arrow transfers use), for every type Spark hands to Arrow (timestamps with and without time zone,
    dates, decimals, arrays, structs, maps, nested); `SparkConverterError` for the few it cannot (intervals
    of months, user-defined types)."""
    import inspect

    from pyspark.sql.pandas.types import to_arrow_type

    # pyspark 4 asks for the time zone of timestamps (an AssertionError without one); 3.5 always gives UTC
    options = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_type).parameters else {}
    try:
        with warnings.catch_warnings():   # pyspark 3.5 compares versions with distutils' deprecated classes
            warnings.simplefilter("ignore", DeprecationWarning)
            return pa.field(field.name, to_arrow_type(field.dataType, **options), nullable=field.nullable)
    except Exception as error:  # noqa: BLE001 - pyspark's TypeError / PySparkTypeError, by version
        reason = (str(error).splitlines() or [type(error).__name__])[0][:200]
        raise SparkConverterError(f"column {field.name!r} is {field.dataType.simpleString()}, which Spark cannot "
                                  f"hand to Arrow ({reason}); cast or drop it") from None


def _extra_columns(df, used: list[str], extra_cols) -> list:
    """The DataFrame's other columns to keep, as Arrow fields: `extra_cols` (None: every other column but
    those named like the dataset's own, which are left out with a log line)."""
    fields = {field.name: field for field in df.schema.fields}
    if extra_cols is not None:
        wanted = [str(c) for c in extra_cols]
        for column in wanted:
            if column not in fields:
                raise SparkConverterError(f"extra_cols: the DataFrame has no column {column!r}")
            if column in used or column in _PINSTORM_COLUMNS:
                raise SparkConverterError(f"extra_cols: {column!r} is one of the dataset's own columns "
                                          f"({', '.join(_PINSTORM_COLUMNS)}) or an *_col argument; rename it")
        return [arrow_field(fields[column]) for column in wanted]
    kept, left = [], []
    for column, field in fields.items():
        if column in used:
            continue
        if column in _PINSTORM_COLUMNS:
            left.append(column)
        else:
            kept.append(arrow_field(field))
    if left:
        log.warning("make_spark_converter: column(s) %s not stored (names of the dataset's own columns; "
                    "rename them to keep them)", ", ".join(left))
    return kept


def _table_schema(df, extra_cols):
    """A tabular DataFrame's Arrow schema: every column (or `extra_cols`, in that order)."""
    fields = {field.name: field for field in df.schema.fields}
    wanted = list(fields) if extra_cols is None else [str(c) for c in extra_cols]
    missing = [c for c in wanted if c not in fields]
    if missing:
        raise SparkConverterError(f"extra_cols: the DataFrame has no column {missing[0]!r}")
    if not wanted:
        raise SparkConverterError("the DataFrame has no column to store")
    return pa.schema([arrow_field(fields[c]) for c in wanted])


def _cached(plan, settings) -> SparkDatasetConverter | None:
    """The converter made in this process for the same analysed plan and settings, if its dataset is whole."""
    with _lock:
        for cached_plan, cached_settings, converter in _converters:
            if cached_settings == settings and _same_result(cached_plan, plan):
                location = resolve(converter.cache_dir_url, converter.storage_options)
                if location.fs.exists(location.join(COMMON_METADATA)):
                    log.info("%s: reusing the dataset of the same DataFrame", converter.cache_dir_url)
                    return converter
    return None


def _new_folder(parent: str, storage_options):
    """A fresh cache folder under `parent`, recorded as this process's (removed at exit)."""
    parent_location = resolve(parent, storage_options)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    name = f"{CACHE_PREFIX}{stamp}-{uuid.uuid4().hex[:12]}"
    location = resolve(f"{parent_location.url.rstrip('/')}/{name}", storage_options)
    location.fs.makedirs(location.path, exist_ok=False)
    with _lock:
        _created[location.url] = dict(storage_options or {})
    return location


def _abandon(location) -> None:
    """Remove a cache folder whose conversion failed."""
    with _lock:
        _created.pop(location.url, None)
    with contextlib.suppress(Exception):
        location.fs.rm(location.path, recursive=True)


def _tabular_converter(df, *, parent, row_group_bytes: int, storage_options, extra_cols) -> SparkDatasetConverter:
    """`make_spark_converter` for a DataFrame without images: every column (or `extra_cols`) as it is,
    written by the executors through Spark's Arrow transfer (``mapInArrow``), checksummed by
    `column_digest`, committed once by the driver as image datasets are."""
    schema = _table_schema(df, extra_cols)
    plan = _analysed_plan(df)
    settings = (parent, json.dumps(storage_options or {}, sort_keys=True, default=str), "tabular",
                int(row_group_bytes), str(schema))
    cached = _cached(plan, settings)
    if cached is not None:
        return cached
    started = time.monotonic()
    location = _new_folder(parent, storage_options)
    try:
        selected = df.select(*schema.names)
        parts = selected.rdd.getNumPartitions()
        task = functools.partial(_table_part_task, url=location.url, storage_options=location.storage_options,
                                 parts=parts, schema=schema, row_group_bytes=int(row_group_bytes))
        results = _run_job(df.sparkSession, f"pinstorm make_spark_converter: {parts} partition(s) to {location.url}",
                           selected.mapInArrow(task, "name string, entry string").rdd, storage_options)
        written = {name: json.loads(entry) for name, entry in results}
        if not written:
            raise SparkConverterError("the DataFrame has no rows")
        ordered = sorted(written)
        digest = hashlib.sha256(json.dumps([str(plan.toString()), settings[2:]], default=str).encode()).hexdigest()
        info, _, _ = commit_dataset(
            location, written, ordered, classes=[], names={}, split=None, seed=None, digest=digest[:32],
            source=f"Spark DataFrame ({parts} partitions, columns {', '.join(schema.names)})", schema=schema,
            extra={"checksum": TABLE_CHECKSUM, "columns": list(schema.names)})
        _remove_attempt_temporaries(location)
    except BaseException:
        _abandon(location)
        raise
    converter = SparkDatasetConverter(location.url, info, storage_options=storage_options,
                                      seconds=time.monotonic() - started)
    with _lock:
        _converters.append((plan, settings, converter))
    return converter


def is_tabular(df, image_col: str | None) -> bool:
    """The rule for a DataFrame without images: `image_col` is None, or left at ``"image"`` and the
    DataFrame has no column of that name."""
    return image_col is None or (image_col == "image" and "image" not in df.columns)


def make_spark_converter(df, *, cache_url=None, image_col: str | None = "image", label_col: str = "label",
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

    The DataFrame's other columns are stored too, of any type Spark hands to Arrow (`arrow_field`:
    numbers, strings, binary, decimals, dates, timestamps with or without time zone, arrays, structs,
    maps, nested), as extra Parquet columns after pinstorm's six, which the image readers ignore
    (`extra_cols`: just these; names of the dataset's own columns are left out with a log line unless
    named there, which is an error).

    A DataFrame without images (`is_tabular`: ``image_col=None``, or no column named ``image`` while
    `image_col` is left at its default) is stored as it is: every column (or `extra_cols`), each Spark
    partition a part, each row group checksummed over all its columns; the converter's readers then give
    petastorm's batch shapes (namedtuples of column tensors in tf, dicts in torch, `columns_reader`).
    `label_col`, `filename_col`, `classes` and the image checks do not apply.

    Images are checked as `convert` checks files (`max_pixels`, `max_side`, `quality`): what does not
    decode, and rows with a null image or a label outside the classes, are skipped and listed in
    ``converter.skipped`` and the dataset's report.

    `cache_url`: the parent folder (a path or fsspec URL every executor can write); default the Spark
    conf ``pinstorm.spark.converter.parentCacheDirUrl`` (or petastorm's
    ``petastorm.spark.converter.parentCacheDirUrl``). The same DataFrame (the same analysed plan, as
    Spark's ``sameResult`` says) with the same arguments reuses its dataset within this process.

    Args:
        df: A Spark DataFrame with an image-bytes column and a label column, or any columns (tabular).
        cache_url: The parent folder of the cached datasets (None: the Spark conf above).
        image_col: The column of image bytes (BinaryType); None: the DataFrame is tabular.
        label_col: The column of labels: integer class indexes or class names.
        filename_col: A string column kept as each row's file name (None: ``row-<partition>-<n>``).
        classes: The class names in label order (None: string labels sorted).
        row_group_bytes: The target size of a row group in bytes.
        storage_options: For fsspec (credentials, endpoints) when `cache_url` is remote.
        max_pixels: As `convert`'s.
        max_side: As `convert`'s.
        quality: As `convert`'s.
        parquet_row_group_size_bytes: petastorm's name for `row_group_bytes`.
        extra_cols: The other columns to store (None: every one); of a tabular DataFrame, the columns.

    Returns:
        A `SparkDatasetConverter` (``make_tf_dataset``, ``make_torch_dataloader``, ``delete``).
    """
    if parquet_row_group_size_bytes is not None:
        row_group_bytes = parquet_row_group_size_bytes
    if isinstance(row_group_bytes, bool) or int(row_group_bytes) != row_group_bytes or row_group_bytes < 1:
        raise SparkConverterError(f"row_group_bytes must be a positive integer, got {row_group_bytes!r}")
    if max_side is not None and (isinstance(max_side, bool) or int(max_side) != max_side or max_side < 1):
        raise SparkConverterError(f"max_side must be None or a positive integer, got {max_side!r}")
    if is_tabular(df, image_col):
        return _tabular_converter(df, parent=_parent_cache_url(df, cache_url), row_group_bytes=int(row_group_bytes),
                                  storage_options=storage_options, extra_cols=extra_cols)
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
    cached = _cached(plan, settings)
    if cached is not None:
        return cached
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

    location = _new_folder(parent, storage_options)
    try:
        columns = [image_col, label_col] + ([filename_col] if filename_col else [])
        columns += [field.name for field in extra_fields]
        rdd = df.select(*columns).rdd
        parts = rdd.getNumPartitions()
        task = functools.partial(
            _dataframe_part_task, url=location.url, storage_options=location.storage_options, parts=parts,
            has_filename=filename_col is not None, classes=classes, class_index=class_index, max_pixels=max_pixels,
            max_side=max_side, quality=quality, row_group_bytes=int(row_group_bytes), extra_fields=extra_fields,
            extra_types=[df.schema[field.name].dataType for field in extra_fields])
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
        _abandon(location)
        raise
    if skipped:
        log.warning("%s: skipped %d row(s) of the DataFrame (listed in converter.skipped)", location.url,
                    len(skipped))
    converter = SparkDatasetConverter(location.url, info, storage_options=storage_options, skipped=skipped,
                                      reencoded=reencoded, seconds=time.monotonic() - started)
    with _lock:
        _converters.append((plan, settings, converter))
    return converter
