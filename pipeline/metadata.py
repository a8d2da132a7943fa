"""The schema of a converted dataset and the metadata that marks it complete.

A dataset is a folder of ``part-NNNNN.parquet`` files plus ``_common_metadata``, written last. That
one file carries what each reader needs in Parquet key-value metadata:

* petastorm's Unischema (pickled, key ``dataset-toolkit.unischema.v1``) and row groups per file
  (``dataset-toolkit.num_row_groups_per_file.v1``), exactly what petastorm's
  ``etl/dataset_metadata.py`` writes, so ``petastorm.make_reader`` opens it without Spark;
* pinstorm's own JSON (key ``pinstorm.dataset.v1``): classes, names, rows, rows per row group, and
  the checksums of every part (see `pipeline.verify`), read back by `dataset_info`.

The image field uses petastorm's stock ``CompressedImageCodec('jpeg')``; pinstorm never calls its
``encode`` (bytes are written as they are), and its ``decode`` (OpenCV) handles every stored row
because `pipeline.images` stores only three-channel JPEGs. A stock codec means any petastorm
installation can open the dataset, with or without pinstorm.

The Unischema is pickled *without* importing petastorm or pyspark (neither installs on numpy 2 and a
current pyarrow): `petastorm_unischema_pickle` writes the pickle opcodes for it directly, naming
petastorm's and pyspark's classes, and a test unpickles the bytes with real petastorm and compares
them with the Unischema petastorm itself builds.

Nothing from a dataset's files is trusted (it may come from someone else's board). `_common_metadata`
is read within `MAX_COMMON_METADATA_BYTES` and its JSON checked (`check_info`: types, and counts that
agree with each other). petastorm unpickles the Unischema bytes it finds there, with an "allow-list"
that admits ``builtins`` (so ``builtins.exec``) and all of ``pyspark``: pinstorm hands petastorm a
dataset only when those bytes are *exactly* the ones `petastorm_unischema_pickle` writes
(`check_petastorm_metadata`), and `petastorm_guard` re-checks the bytes at petastorm's one unpickling
call, so a file swapped in between is refused too. The pyarrow engine never unpickles anything.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import pickle
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pinstorm.boards.safety.parquet_limits import BoundedParquetFile
from .column_digest import TABLE_CHECKSUM
from .contracts import DatasetInfo
from .errors import PipelineError

COMMON_METADATA = "_common_metadata"
REPORT = "_pinstorm_report.json"
PROGRESS = "_pinstorm_progress.json"
PART_PREFIX = "part-"
TMP_PREFIX = "_tmp."
PINSTORM_KEY = b"pinstorm.dataset.v1"
UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
FORMAT_VERSION = 2   # 2: per-part footer and per-row-group checksums
MAX_COMMON_METADATA_BYTES = 64 << 20   # ImageNet at 32 MB row groups: ~0.3 MB
PART_NAME = re.compile(r"part-[0-9]{1,12}\.parquet")


class DatasetNotFound(PipelineError, FileNotFoundError):
    """Nothing at a dataset's URL."""


class IncompleteDatasetError(PipelineError, FileNotFoundError):
    """A folder that is not a finished dataset: no ``_common_metadata`` (conversion never finished)."""


class MalformedDatasetError(PipelineError, ValueError):
    """``_common_metadata`` too large, unreadable, or with metadata that contradicts itself."""


class UntrustedSchemaError(PipelineError, ValueError):
    """A pickled Unischema that is not byte-for-byte pinstorm's own: petastorm would run it."""


ARROW_SCHEMA = pa.schema([
    pa.field("image", pa.binary(), nullable=False),
    pa.field("label", pa.int32(), nullable=False),
    pa.field("wnid", pa.string(), nullable=False),
    pa.field("filename", pa.string(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
])


def unischema():
    """The petastorm Unischema of a pinstorm dataset, built by petastorm itself (imports petastorm and pyspark).

    Only tests and users who want the object need this; writing a dataset uses
    `petastorm_unischema_pickle`, which needs neither.
    """
    from petastorm.codecs import CompressedImageCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import IntegerType, StringType

    return Unischema("PinstormImages", [
        UnischemaField("image", np.uint8, (None, None, 3), CompressedImageCodec("jpeg", quality=95), False),
        UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("wnid", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("filename", np.str_, (), ScalarCodec(StringType()), False),
        UnischemaField("height", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("width", np.int32, (), ScalarCodec(IntegerType()), False),
    ])


# ---- the Unischema as pickle opcodes, without petastorm or pyspark --------------------------------------
# A tiny pickle writer for the one object graph we need. Not the stdlib's pure-Python pickler with an
# overridden save_global: dill (imported by petastorm) patches that pickler's dispatch table process-wide.


@dataclass(frozen=True)
class _Global:
    module: str
    name: str


@dataclass(frozen=True)
class _New:
    """``cls.__new__(cls, *args)`` then ``obj.__dict__.update(state)``: how pickle stores plain objects."""
    cls: _Global
    args: tuple = ()
    state: dict | None = None


@dataclass(frozen=True)
class _Call:
    """``func(*args)`` (pickle's REDUCE), then ``obj[k] = v`` for `items`."""
    func: _Global
    args: tuple = ()
    items: tuple = ()


def _emit(obj, out: bytearray) -> None:
    if obj is None:
        out += pickle.NONE
    elif obj is True or obj is False:
        out += pickle.NEWTRUE if obj else pickle.NEWFALSE
    elif isinstance(obj, int):
        out += pickle.BININT1 + bytes([obj]) if 0 <= obj < 256 else pickle.BININT + obj.to_bytes(4, "little",
                                                                                                    signed=True)
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        out += pickle.BINUNICODE + len(data).to_bytes(4, "little") + data
    elif isinstance(obj, tuple):
        out += pickle.MARK
        for item in obj:
            _emit(item, out)
        out += pickle.TUPLE
    elif isinstance(obj, dict):
        out += pickle.EMPTY_DICT
        if obj:
            out += pickle.MARK
            for key, value in obj.items():
                _emit(key, out)
                _emit(value, out)
            out += pickle.SETITEMS
    elif isinstance(obj, _Global):
        out += pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("ascii")
    elif isinstance(obj, _New):
        _emit(obj.cls, out)
        _emit(obj.args, out)
        out += pickle.NEWOBJ
        if obj.state:
            _emit(obj.state, out)
            out += pickle.BUILD
    elif isinstance(obj, _Call):
        _emit(obj.func, out)
        _emit(obj.args, out)
        out += pickle.REDUCE
        if obj.items:
            out += pickle.MARK
            for key, value in obj.items:
                _emit(key, out)
                _emit(value, out)
            out += pickle.SETITEMS
    else:
        raise TypeError(f"cannot emit {type(obj).__name__}")


@functools.lru_cache(maxsize=1)
def petastorm_unischema_pickle() -> bytes:
    """The pickled Unischema of a pinstorm dataset, as petastorm's ``dataset_metadata`` stores it,
    written without importing petastorm or pyspark (protocol 2, globals only from modules petastorm's
    restricted unpickler allows: petastorm, collections, numpy, pyspark)."""
    # Spark types are *called* (not rebuilt from a pickled __dict__): each pyspark version then builds
    # its own state (pyspark 4 gives StringType a `collation`, 3.5 does not know it).
    integer = _Call(_Global("pyspark.sql.types", "IntegerType"))
    string = _Call(_Global("pyspark.sql.types", "StringType"))

    def scalar(spark_type):
        return _New(_Global("petastorm.codecs", "ScalarCodec"), (), {"_spark_type": spark_type})

    image_codec = _New(_Global("petastorm.codecs", "CompressedImageCodec"), (),
                       {"_image_codec": ".jpeg", "_quality": 95})
    fields = [
        ("image", _Global("numpy", "uint8"), (None, None, 3), image_codec),
        ("label", _Global("numpy", "int32"), (), scalar(integer)),
        ("wnid", _Global("numpy", "str_"), (), scalar(string)),
        ("filename", _Global("numpy", "str_"), (), scalar(string)),
        ("height", _Global("numpy", "int32"), (), scalar(integer)),
        ("width", _Global("numpy", "int32"), (), scalar(integer)),
    ]
    field_objects = tuple((name, _New(_Global("petastorm.unischema", "UnischemaField"),
                                      (name, dtype, shape, codec, False)))
                          for name, dtype, shape, codec in fields)
    # Unischema.__init__ also sets one attribute per field (``schema.image``); pickle keeps them in its state.
    schema = _New(_Global("petastorm.unischema", "Unischema"), (),
                  {"_name": "PinstormImages",
                   "_fields": _Call(_Global("collections", "OrderedDict"), (), field_objects),
                   **dict(field_objects)})
    out = bytearray(pickle.PROTO + bytes([2]))
    _emit(schema, out)
    out += pickle.STOP
    return bytes(out)


def part_name(index: int, partitions: int) -> str:
    """``part-00003.parquet``: zero-padded so that name order is part order (petastorm sorts by path)."""
    return f"{PART_PREFIX}{index:0{max(5, len(str(partitions - 1)))}d}.parquet"


def write_common_metadata(location, info: Mapping, row_groups_per_file: dict[str, int], schema=None) -> None:
    """Write ``_common_metadata`` (via a temporary name): the marker that the dataset is complete.
    `schema`: a tabular dataset's Arrow schema (no Unischema then: petastorm infers one from Parquet)."""
    metadata = {
        **({} if schema is not None else {UNISCHEMA_KEY: petastorm_unischema_pickle()}),
        ROW_GROUPS_PER_FILE_KEY: json.dumps(row_groups_per_file).encode(),
        PINSTORM_KEY: json.dumps(dict(info)).encode(),
    }
    import pyarrow.parquet as pq

    tmp = location.join(TMP_PREFIX + COMMON_METADATA)
    with location.fs.open(tmp, "wb") as handle:
        pq.write_metadata((ARROW_SCHEMA if schema is None else schema).with_metadata(metadata), handle)
    location.fs.mv(tmp, location.join(COMMON_METADATA))


def read_common_metadata(location) -> dict:
    """The key-value metadata of ``_common_metadata`` (bytes -> bytes), read within
    `MAX_COMMON_METADATA_BYTES`; `IncompleteDatasetError` when there is none."""

    marker = location.join(COMMON_METADATA)
    try:
        size = location.fs.size(marker)
        if size is not None and size > MAX_COMMON_METADATA_BYTES:
            raise MalformedDatasetError(f"{location.url}/{COMMON_METADATA}: {size:,} bytes, over the limit of "
                                        f"{MAX_COMMON_METADATA_BYTES:,} bytes (pinstorm writes well under 1 MB)")
        with location.fs.open(marker, "rb") as handle:
            with BoundedParquetFile(handle, f"{location.url}/{COMMON_METADATA}", size=size,
                                    max_footer_bytes=MAX_COMMON_METADATA_BYTES) as parquet:
                return dict(parquet.metadata.metadata or {})
    except FileNotFoundError:
        if location.fs.exists(location.path):
            raise IncompleteDatasetError(
                f"{location.url}: no {COMMON_METADATA}, so this is not a finished pinstorm dataset "
                "(a conversion was interrupted, or this is another folder); run `pinstorm convert` "
                "again to finish it") from None
        raise DatasetNotFound(f"{location.url}: no such dataset") from None


def read_info(location) -> DatasetInfo:
    """The pinstorm JSON of a complete dataset, checked (`check_info`), or `IncompleteDatasetError`.

    Args:
        location: Where the dataset is (`locate`).

    Returns:
        The dataset's info (a frozen `DatasetInfo`, also a mapping of the JSON's keys): rows, classes,
        row groups, parts with their sizes and checksums.

    Raises:
        IncompleteDatasetError: No finished dataset there.
        MalformedDatasetError: Metadata too large, unreadable or contradicting itself.
    """
    kv = read_common_metadata(location)
    if PINSTORM_KEY not in kv:
        raise IncompleteDatasetError(f"{location.url}: {COMMON_METADATA} has no pinstorm metadata "
                                     "(a petastorm dataset pinstorm did not write?)")
    where = f"{location.url}/{COMMON_METADATA}"
    try:
        info = json.loads(kv[PINSTORM_KEY])
    except (ValueError, RecursionError) as error:
        raise MalformedDatasetError(f"{where}: the pinstorm metadata is not JSON: {error}") from None
    check_info(info, where)
    return DatasetInfo.from_dict(info)


def _count(value, what: str, where: str) -> int:
    if type(value) is not int or not 0 <= value < 2**53:
        raise MalformedDatasetError(f"{where}: {what} must be a count, got {str(value)[:60]!r}")
    return value


def _strings(value, what: str, where: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MalformedDatasetError(f"{where}: {what} must be a list of strings")
    return value


def check_info(info, where: str) -> None:
    """The pinstorm JSON has the types readers rely on and counts that agree: rows = sum of
    row_group_rows = sum of the parts' rows; row_groups = len(row_group_rows) = sum of the parts'
    row groups; one checksum per row group; classes, class_rows and num_classes agree; part names
    are ``part-N.parquet``. Each part's footer is checked against these when it is opened."""
    if not isinstance(info, dict):
        raise MalformedDatasetError(f"{where}: the pinstorm metadata must be a JSON object")
    files = info.get("files")
    if not isinstance(files, dict) or not files:
        raise MalformedDatasetError(f"{where}: 'files' must name the dataset's parts")
    group_rows = info.get("row_group_rows")
    if not isinstance(group_rows, list):
        raise MalformedDatasetError(f"{where}: 'row_group_rows' must be a list of counts")
    for i, rows in enumerate(group_rows):
        _count(rows, f"row_group_rows[{i}]", where)
    at = 0
    for name in sorted(files):
        entry = files[name]
        if not isinstance(name, str) or not PART_NAME.fullmatch(name):
            raise MalformedDatasetError(f"{where}: {str(name)[:80]!r} is not a part name (part-N.parquet)")
        if not isinstance(entry, dict):
            raise MalformedDatasetError(f"{where}: part {name}: its entry must be an object")
        groups = _count(entry.get("row_groups"), f"part {name} row_groups", where)
        for key in ("rows", "bytes"):
            if key in entry:
                _count(entry[key], f"part {name} {key}", where)
        for key in ("xxh3", "footer_xxh3"):
            if key in entry and not isinstance(entry[key], str):
                raise MalformedDatasetError(f"{where}: part {name} {key} must be a string")
        for key in ("row_group_xxh3", "row_group_bytes_xxh3"):
            if key in entry and len(_strings(entry[key], f"part {name} {key}", where)) != groups:
                raise MalformedDatasetError(f"{where}: part {name} has {groups} row groups but "
                                            f"{len(entry[key])} row-group checksums ({key})")
        if "rows" in entry and sum(group_rows[at:at + groups]) != entry["rows"]:
            raise MalformedDatasetError(f"{where}: part {name} declares {entry['rows']} rows, its row groups "
                                        f"{sum(group_rows[at:at + groups])}")
        at += groups
    if at != len(group_rows) or _count(info.get("row_groups"), "row_groups", where) != at:
        raise MalformedDatasetError(f"{where}: {info.get('row_groups')} row groups declared, the parts hold {at} "
                                    f"and row_group_rows lists {len(group_rows)}")
    if _count(info.get("rows"), "rows", where) != sum(group_rows):
        raise MalformedDatasetError(f"{where}: {info['rows']} rows declared, the row groups hold {sum(group_rows)}")
    _count(info.get("bytes", 0), "bytes", where)
    classes = _strings(info.get("classes", []), "classes", where)
    if _count(info.get("num_classes", len(classes)), "num_classes", where) != len(classes):
        raise MalformedDatasetError(f"{where}: num_classes is {info['num_classes']} but {len(classes)} classes "
                                    "are listed")
    if "class_rows" in info:
        class_rows = info["class_rows"]
        if not isinstance(class_rows, list) or len(class_rows) != len(classes) or \
                sum(_count(r, "class_rows", where) for r in class_rows) != info["rows"]:
            raise MalformedDatasetError(f"{where}: class_rows must count the rows of each of the "
                                        f"{len(classes)} classes, {info['rows']} in all")
    names = info.get("names", {})
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise MalformedDatasetError(f"{where}: names must map class ids to names (strings)")
    # the other keys `DatasetInfo` types: absent or null, else of their type
    for key in ("format", "partitions", "skipped", "reencoded", "reoriented", "resized", "seed"):
        if info.get(key) is not None and type(info[key]) is not int:
            raise MalformedDatasetError(f"{where}: {key} must be an integer, got {str(info[key])[:60]!r}")
    for key in ("split", "checksum", "plan", "source", "created", "url"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise MalformedDatasetError(f"{where}: {key} must be a string, got {str(info[key])[:60]!r}")
    if info.get("empty_classes") is not None:
        _strings(info["empty_classes"], "empty_classes", where)
    _check_columns(info, where)


MAX_COLUMNS = 10_000       # columns a tabular dataset's info may list (Spark DataFrames reach thousands)
MAX_COLUMN_NAME = 1_024    # characters in one column's name


def _check_columns(info: dict, where: str) -> None:
    """A tabular dataset's ``columns`` (the columns its row-group checksums cover, `verify.checksummed`):
    a non-empty list of distinct, non-empty names of bounded length and count; required by, and only
    allowed with, the tabular checksum (`column_digest.TABLE_CHECKSUM`)."""
    columns = info.get("columns")
    tabular = info.get("checksum") == TABLE_CHECKSUM
    if columns is None:
        if tabular:
            raise MalformedDatasetError(f"{where}: a tabular dataset must list its 'columns'")
        return
    if not tabular:
        raise MalformedDatasetError(f"{where}: 'columns' belongs to tabular datasets (checksum "
                                    f"{TABLE_CHECKSUM!r}), not to one of checksum {str(info.get('checksum'))[:60]!r}")
    if not isinstance(columns, list) or not 0 < len(columns) <= MAX_COLUMNS:
        raise MalformedDatasetError(f"{where}: 'columns' must be a list of 1 to {MAX_COLUMNS} column names")
    _strings(columns, "columns", where)
    bad = [c for c in columns if not 0 < len(c) <= MAX_COLUMN_NAME]
    if bad:
        raise MalformedDatasetError(f"{where}: column names must have 1 to {MAX_COLUMN_NAME} characters, got "
                                    f"{bad[0][:60]!r} ({len(bad[0])})")
    if len(set(columns)) != len(columns):
        raise MalformedDatasetError(f"{where}: 'columns' names a column twice")


def check_petastorm_metadata(location, info: Mapping) -> None:
    """What petastorm will read from ``_common_metadata`` is pinstorm's own: the Unischema pickle
    byte-for-byte (else `UntrustedSchemaError`: petastorm would unpickle, i.e. run, it) and the row
    groups per file equal to the checked pinstorm metadata."""
    kv = read_common_metadata(location)
    where = f"{location.url}/{COMMON_METADATA}"
    if kv.get(UNISCHEMA_KEY) != petastorm_unischema_pickle():
        raise UntrustedSchemaError(
            f"{where}: its pickled Unischema ({UNISCHEMA_KEY.decode()}, {len(kv.get(UNISCHEMA_KEY) or b'')} "
            "bytes) is not the one pinstorm writes, and petastorm would unpickle (run) it; read the dataset "
            "with engine='pyarrow', which never unpickles, or convert it again")
    try:
        per_file = json.loads(kv.get(ROW_GROUPS_PER_FILE_KEY) or b"null")
    except ValueError:
        per_file = None
    if per_file != {name: entry["row_groups"] for name, entry in info["files"].items()}:
        raise MalformedDatasetError(f"{where}: petastorm's row groups per file "
                                    f"({ROW_GROUPS_PER_FILE_KEY.decode()}) disagree with pinstorm's metadata")


_guarding = contextvars.ContextVar("pinstorm_petastorm_guard", default=None)
_guard_lock = threading.Lock()


@contextlib.contextmanager
def petastorm_guard(where: str):
    """Within: petastorm's Unischema unpickler (``dataset_metadata.depickle_legacy_package_name_compatible``)
    accepts only pinstorm's own bytes in this thread, else `UntrustedSchemaError` before unpickling.

    Installed once into petastorm's module; outside this context petastorm behaves as before (its
    own ``make_reader`` on another dataset). Wrap your own ``petastorm.make_reader`` calls in it to
    open only pinstorm datasets safely.
    """
    from petastorm.etl import dataset_metadata

    with _guard_lock:
        original = dataset_metadata.depickle_legacy_package_name_compatible
        if not getattr(original, "pinstorm_guard", False):
            def guarded(pickled, _original=original):
                place = _guarding.get()
                if place is not None and bytes(pickled) != petastorm_unischema_pickle():
                    raise UntrustedSchemaError(f"{place}: petastorm was about to unpickle a Unischema of "
                                               f"{len(pickled)} bytes that is not pinstorm's own; refused")
                return _original(pickled)

            guarded.pinstorm_guard = True
            dataset_metadata.depickle_legacy_package_name_compatible = guarded
    token = _guarding.set(where)
    try:
        yield
    finally:
        _guarding.reset(token)
