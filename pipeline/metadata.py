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
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pinstorm.errors import PinstormError

COMMON_METADATA = "_common_metadata"
REPORT = "_pinstorm_report.json"
PROGRESS = "_pinstorm_progress.json"
PART_PREFIX = "part-"
TMP_PREFIX = "_tmp."
PINSTORM_KEY = b"pinstorm.dataset.v1"
UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
FORMAT_VERSION = 2   # 2: per-part footer and per-row-group checksums


class IncompleteDatasetError(PinstormError, FileNotFoundError):
    """A folder that is not a finished dataset: no ``_common_metadata`` (conversion never finished)."""


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


def write_common_metadata(location, info: dict, row_groups_per_file: dict[str, int]) -> None:
    """Write ``_common_metadata`` (via a temporary name): the marker that the dataset is complete."""
    metadata = {
        UNISCHEMA_KEY: petastorm_unischema_pickle(),
        ROW_GROUPS_PER_FILE_KEY: json.dumps(row_groups_per_file).encode(),
        PINSTORM_KEY: json.dumps(info).encode(),
    }
    import pyarrow.parquet as pq

    tmp = location.join(TMP_PREFIX + COMMON_METADATA)
    with location.fs.open(tmp, "wb") as handle:
        pq.write_metadata(ARROW_SCHEMA.with_metadata(metadata), handle)
    location.fs.mv(tmp, location.join(COMMON_METADATA))


def read_info(location) -> dict:
    """The pinstorm JSON of a complete dataset, or `IncompleteDatasetError`."""
    import pyarrow.parquet as pq

    marker = location.join(COMMON_METADATA)
    try:
        with location.fs.open(marker, "rb") as handle:
            kv = pq.read_metadata(handle).metadata or {}
    except FileNotFoundError:
        if location.fs.exists(location.path):
            raise IncompleteDatasetError(
                f"{location.url}: no {COMMON_METADATA}, so this is not a finished pinstorm dataset "
                "(a conversion was interrupted, or this is another folder); run `pinstorm convert` "
                "again to finish it") from None
        raise FileNotFoundError(f"{location.url}: no such dataset") from None
    if PINSTORM_KEY not in kv:
        raise IncompleteDatasetError(f"{location.url}: {COMMON_METADATA} has no pinstorm metadata "
                                     "(a petastorm dataset pinstorm did not write?)")
    return json.loads(kv[PINSTORM_KEY])
