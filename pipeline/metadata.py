"""The schema of a converted dataset and the metadata that marks it complete.

A dataset is a folder of ``part-NNNNN.parquet`` files plus ``_common_metadata``, written last. That
one file carries what each reader needs in Parquet key-value metadata:

* petastorm's Unischema (pickled, key ``dataset-toolkit.unischema.v1``) and row groups per file
  (``dataset-toolkit.num_row_groups_per_file.v1``), exactly what petastorm's
  ``etl/dataset_metadata.py`` writes, so ``petastorm.make_reader`` opens it without Spark;
* pinstorm's own JSON (key ``pinstorm.dataset.v1``): classes, names, rows, rows per row group, ...
  read back by `dataset_info`.

The image field uses petastorm's stock ``CompressedImageCodec('jpeg')``; pinstorm never calls its
``encode`` (bytes are written as they are), and its ``decode`` (OpenCV) handles every stored row
because `pipeline.images` stores only three-channel JPEGs. A stock codec means any petastorm
installation can open the dataset, with or without pinstorm.
"""

from __future__ import annotations

import json
import pickle

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
FORMAT_VERSION = 1


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
    """The petastorm Unischema of a pinstorm dataset (imports petastorm and pyspark's types)."""
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


def part_name(index: int, partitions: int) -> str:
    """``part-00003.parquet``: zero-padded so that name order is part order (petastorm sorts by path)."""
    return f"{PART_PREFIX}{index:0{max(5, len(str(partitions - 1)))}d}.parquet"


def write_common_metadata(location, info: dict, row_groups_per_file: dict[str, int]) -> None:
    """Write ``_common_metadata`` (via a temporary name): the marker that the dataset is complete."""
    metadata = {
        UNISCHEMA_KEY: pickle.dumps(unischema()),
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
