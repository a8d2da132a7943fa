"""The content checksum of a row group of any Arrow columns (a tabular dataset's), independent of how
the table was built.

Why: an image dataset's row groups are checksummed over image bytes and labels (`verify.table_digest`);
a tabular dataset (the Spark converter's DataFrames without images) holds columns of any type Parquet can
store, nested ones included. Hashing Arrow buffers as they lie would not do: a table read back from
Parquet and the one written differ in offsets, padding and the bytes under null slots. This digest walks
each column to its leaves and hashes only what a value is: validity, list lengths, the non-null leaf
values (fixed-width bytes, or lengths and bytes of strings and binaries), so the writer's table and the
reader's agree exactly when their values do.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

TABLE_CHECKSUM = "xxh3_128 of every column's validity, list lengths and non-null values"


def _array(column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _update(digest, array: pa.Array) -> None:
    """Feed one array's values into `digest`, recursively."""
    kind = array.type
    digest.update(len(array).to_bytes(8, "little"))
    digest.update(np.asarray(array.is_valid(), dtype=np.uint8).tobytes())
    if pa.types.is_dictionary(kind):
        _update(digest, array.cast(kind.value_type))
        return
    if pa.types.is_struct(kind):
        for child in array.flatten():   # the parent's offset and nulls applied to each field
            _update(digest, child)
        return
    valid = array.drop_null()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind) \
            or pa.types.is_map(kind):
        offsets = np.arange(len(valid) + 1) * kind.list_size if pa.types.is_fixed_size_list(kind) \
            else np.asarray(valid.offsets)
        lengths = np.diff(offsets)
        digest.update(lengths.astype("<i8").tobytes())
        if pa.types.is_fixed_size_list(kind):
            _update(digest, valid.flatten())
        else:   # the values of the non-null lists only, from the sliced offsets
            _update(digest, valid.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if len(valid)
                    else valid.values.slice(0, 0))
        return
    if pa.types.is_binary(kind) or pa.types.is_string(kind) or pa.types.is_large_binary(kind) \
            or pa.types.is_large_string(kind):
        large = valid.cast(pa.large_binary())
        buffers = large.buffers()
        offsets = np.frombuffer(buffers[1], dtype="<i8")[large.offset:large.offset + len(large) + 1] \
            if len(large) else np.zeros(1, "<i8")
        digest.update(np.diff(offsets).astype("<i8").tobytes())
        if buffers[2] is not None and offsets[-1] > offsets[0]:
            digest.update(memoryview(buffers[2])[int(offsets[0]):int(offsets[-1])])
        return
    if pa.types.is_boolean(kind):
        digest.update(np.asarray(valid.to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes())
        return
    if pa.types.is_null(kind):
        return
    width = kind.bit_width // 8   # fixed width: ints, floats, dates, times, timestamps, durations, decimals
    data = valid.buffers()[1]
    if data is not None and len(valid):
        digest.update(memoryview(data)[valid.offset * width:(valid.offset + len(valid)) * width])


def columns_digest(table: pa.Table) -> str:
    """Content checksum of a row group read as an Arrow table: its column names and values.

    Args:
        table: The row group (every column the checksum covers, in the order recorded).

    Returns:
        The hex digest.
    """
    digest = xxhash.xxh3_128()
    for name, column in zip(table.column_names, table.columns):
        digest.update(name.encode("utf-8") + b"\0")
        _update(digest, _array(column))
    return digest.hexdigest()
