"""Checksums of part files, checked before any of their rows reach a reader.

Bytes flipped in a part file decode to a wrong image without a word (libjpeg only prints "Corrupt
JPEG data"), and a missing part used to show only mid-epoch. So `convert` records, per part, its
size, an xxh3-128 of its Parquet footer, and an xxh3-128 of every row group's *content* (image
lengths, image bytes, labels); and every reader of pinstorm checks:

* before an epoch starts: every part of the shard exists with its recorded size (one listing);
* when a part is opened: its footer checksum (a small ranged read);
* when a row group is read: its content checksum, before any of its rows is handed on.

`verify_dataset` also checks an xxh3-128 of each whole part file (recorded too), which covers every
byte, the small columns included; readers do not, as it would mean reading each part twice.

A content checksum (rather than one over file bytes) is the same whichever engine reads the row group
(pyarrow's batches or petastorm's), costs one pass of a hash running at several GB/s over bytes
already in memory, and stays valid under any pyarrow version. On pyarrow >= 15, parts are also
written with Parquet page CRCs (`PAGE_CRC`), verified whenever a read takes a column the content checksum
does not cover (wnid, filename, height, width) or a part has no content checksums; a read of image and
label alone skips them, as the content checksum covers those bytes already (`reader_options`).

Parts are opened as `boards.safety.parquet_limits.BoundedParquetFile`: a footer that disagrees with the
dataset's metadata (row groups, rows per row group) is a `CorruptPartError`, and a row group that
would decode past the memory budget (`PINSTORM_MAX_ROW_GROUP_BYTES`, default 512 MiB; dictionary
expansion included) is refused before it is decoded (`ParquetLimitExceeded`).

Errors name the dataset, the part and the row group: `MissingPartError`, `CorruptPartError`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import xxhash

from pinstorm.boards.errors import MalformedParquet, ParquetLimitExceeded
from pinstorm.boards.safety.parquet_limits import (BoundedParquetFile, UnreadableRowGroup, footer_length,
                                                   out_of_resources)
from pinstorm.errors import PinstormError

from .column_digest import TABLE_CHECKSUM, columns_digest
from .contracts import DatasetInfo
from .errors import PipelineError

CHECKSUM = "xxh3_128 of image lengths (int32 LE), image bytes, labels (int32 LE)"
CHECKSUMMED = ("image", "label")   # the columns a row group's content checksum covers
PAGE_CRC = tuple(int(v) for v in pa.__version__.split(".")[:2]) >= (15, 0)
_TAIL = 8   # Parquet ends with <footer length: uint32 LE> "PAR1"


class CorruptPartError(PipelineError, OSError):
    """A part file whose bytes differ from what `convert` wrote (size, footer or a row group)."""


class MissingPartError(PipelineError, FileNotFoundError):
    """A part file the dataset's metadata lists is not there."""


class MalformedPart(PipelineError, ValueError):
    """A file that cannot be a Parquet part: too small, no magic, or a footer longer than the file."""


def writer_options() -> dict:
    """Extra `pq.ParquetWriter` keywords: page CRCs where pyarrow has them."""
    return {"write_page_checksum": True} if PAGE_CRC else {}


def reader_options(entry: Mapping | None = None, columns=None) -> dict:
    """Extra `pq.ParquetFile` keywords: verify page CRCs where pyarrow can, unless every column read
    (`columns`) is covered by the part's row-group content checksums (`entry`, its metadata): those are
    checked anyway, and a CRC pass over the JPEG pages costs ~30 us an ImageNet-size row (CRC-32 at
    ~3.7 GB/s here, against ~9 for xxh3)."""
    covered = (entry is not None and "row_group_xxh3" in entry
               and columns is not None and set(columns) <= set(CHECKSUMMED))
    return {"page_checksum_verification": True} if PAGE_CRC and not covered else {}


def local_read_options() -> dict:
    """How a local part is opened, by the memory pool Arrow allocates from. mimalloc (recent pyarrow's
    default, 26 here) reuses freed row-group-sized buffers: memory-mapped, a row costs ~18 us to read. jemalloc
    (pyarrow 14, petastorm's pin) hands them back to the OS, so every read faults its pages in again
    (~88 us a row mapped); one coalesced read per row group (``pre_buffer``) halves that (~37 us). Measured
    in `make_dataset`'s reader: 60 us a row mapped against 70 with pre_buffer on mimalloc, 128 against 77 on
    jemalloc (reading, checking, handing rows over; `bench/bench_peers.py`'s data). Never
    ``pre_buffer`` on a Python file object: Arrow would call it from its IO threads (`pipeline.inspect`)."""
    if pa.default_memory_pool().backend_name == "jemalloc":
        return {"pre_buffer": True}
    return {"memory_map": True}


def _binary_parts(column):
    """(lengths int32 array, [memoryviews of the bytes]) of a binary column, without a copy per row."""
    lengths, data = [], []
    for chunk in (column.chunks if isinstance(column, pa.ChunkedArray) else [column]):
        if len(chunk) == 0:
            continue
        width = np.int64 if pa.types.is_large_binary(chunk.type) else np.int32
        buffers = chunk.buffers()
        offsets = np.frombuffer(buffers[1], dtype=width)[chunk.offset:chunk.offset + len(chunk) + 1]
        lengths.append(np.diff(offsets).astype("<i4"))
        if buffers[2] is not None and offsets[-1] > offsets[0]:
            data.append(memoryview(buffers[2])[int(offsets[0]):int(offsets[-1])])
    return (np.concatenate(lengths) if lengths else np.zeros(0, "<i4")), data


def table_digest(table) -> str:
    """Content checksum of a row group read as an Arrow table with ``image`` and ``label``."""
    lengths, data = _binary_parts(table.column("image"))
    digest = xxhash.xxh3_128()
    digest.update(lengths.tobytes())
    for piece in data:
        digest.update(piece)
    digest.update(np.asarray(table.column("label").to_numpy(), dtype="<i4").tobytes())
    return digest.hexdigest()


def rows_digest(images, labels) -> str:
    """The same checksum over Python bytes and labels (what petastorm's batch reader hands back)."""
    digest = xxhash.xxh3_128()
    digest.update(np.fromiter((len(b) for b in images), dtype="<i4", count=len(images)).tobytes())
    for image in images:
        digest.update(image)
    digest.update(np.asarray(labels, dtype="<i4").tobytes())
    return digest.hexdigest()


def footer_digest(fs, path: str, size: int | None = None) -> str:
    """xxh3-128 of a Parquet file's footer and tail, read with two small ranged reads."""
    return xxhash.xxh3_128(read_footer(fs, path, size)).hexdigest()


def read_footer(fs, path: str, size: int | None = None) -> bytes:
    """A Parquet file's footer and tail, read with two small ranged reads; a footer declared over 16 MiB is
    refused before it is read (`MalformedPart`)."""
    size = fs.size(path) if size is None else size
    with fs.open(path, "rb") as handle:
        tail = b""
        if size >= 12:
            handle.seek(size - _TAIL)
            tail = handle.read(_TAIL)
        try:
            length = footer_length(tail, size, "the file")
        except (MalformedParquet, ParquetLimitExceeded) as error:
            raise MalformedPart(str(error).removeprefix("the file: ")) from None
        handle.seek(size - _TAIL - length)
        return handle.read(length) + tail


def checksummed(info: DatasetInfo) -> tuple[str, ...]:
    """The columns a row group's content checksum covers: image and label, or every column of a tabular
    dataset (the Spark converter's DataFrames without images, `column_digest`)."""
    return tuple(info.get("columns") or ()) if info.checksum == TABLE_CHECKSUM else CHECKSUMMED


def verified(info: DatasetInfo) -> bool:
    """Whether the dataset carries checksums (pinstorm format 2 and later)."""
    return all("row_group_xxh3" in entry for entry in info.files.values())


def check_parts(location, info: DatasetInfo, names=None) -> None:
    """Every listed part (or `names`) exists with its recorded size: one listing, no part opened."""
    names = sorted(info.files) if names is None else sorted(names)
    location.fs.invalidate_cache(location.path)
    try:
        listing = {entry["name"].rstrip("/").rsplit("/", 1)[-1]: entry.get("size")
                   for entry in location.fs.ls(location.path, detail=True)}
    except FileNotFoundError:
        listing = {}
    missing = [n for n in names if n not in listing]
    if missing:
        raise MissingPartError(f"{location.url}: {len(missing)} of {len(info.files)} part file(s) missing: "
                               f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} (the dataset lost "
                               "files after conversion; restore them or convert again)")
    for name in names:
        expected = info.files[name].get("bytes")
        if expected is not None and listing[name] is not None and listing[name] != expected:
            raise CorruptPartError(f"{location.url}/{name}: {listing[name]} bytes, but conversion wrote {expected}: "
                                   "the part changed after conversion")


def open_part(location, info: DatasetInfo | Mapping, name: str, columns=None, *, source=None):
    """A bounded Parquet file (`BoundedParquetFile`) for one part, after its footer checksum matched
    (when recorded) and its row groups agree with the dataset's metadata.

    Args:
        location: Where the dataset is (`locate`).
        info: The dataset's info (`read_info`).
        name: The part's file name (a key of ``info.files``).
        columns: All that will be read from it (None: any), which decides whether page CRCs are verified.
        source: The part's bytes as a file object whose footer was checked already (a
            `part_pieces.PieceSource` of the part cache); it is closed with the handle.

    Returns:
        An open `BoundedParquetFile`; close it when done.

    Raises:
        MissingPartError: The part is not there.
        CorruptPartError: Its bytes differ from what `convert` wrote.
    """

    info = DatasetInfo.from_dict(info)   # a plain dict too
    entry = info.files[name]
    path = location.join(name)
    where = f"{location.url}/{name}"
    try:
        if "footer_xxh3" in entry and source is None:
            found = footer_digest(location.fs, path, entry.get("bytes"))
            if found != entry["footer_xxh3"]:
                raise CorruptPartError(f"{where}: footer checksum mismatch (the part changed after conversion)")
        if source is not None:
            handle = BoundedParquetFile(source, where, size=entry.get("bytes"), close_source=True,
                                        **reader_options(entry, columns))
        elif location.is_local:
            handle = BoundedParquetFile(path, where, **local_read_options(), **reader_options(entry, columns))
        else:
            handle = BoundedParquetFile(location.fs.open(path, "rb"), where, size=entry.get("bytes"),
                                        close_source=True, **reader_options(entry, columns))
        try:
            _check_footer(handle, info, name, where)
        except BaseException:
            handle.close()
            raise
        return handle
    except FileNotFoundError:
        raise MissingPartError(f"{location.url}/{name}: part file missing") from None
    except MalformedPart as error:
        raise CorruptPartError(f"{location.url}/{name}: cannot be read as Parquet: {error}") from None
    except PinstormError:
        raise
    except Exception as error:
        if out_of_resources(error):
            raise
        raise CorruptPartError(f"{location.url}/{name}: cannot be read as Parquet: {error}") from None


class OpenParts:
    """Parts kept open between row groups (`open_part` handles, by name): at most `KEEP` of them and
    `KEEP_FOOTER_BYTES` of their footers, least recently used closed first (the one in use always stays).

    Why: a shuffled epoch comes back to a part, and parsing its footer each time would cost per row group
    what the part holds (~40 ms for 4,096 row groups); keeping every part open runs out of file descriptors
    (a dataset of 4,700 one-row-group parts failed at the 133rd under the usual limit of 1,024) and of
    memory (a parsed footer takes ~9x its bytes: 71 MB for 16,384 row groups)."""

    KEEP = 8
    KEEP_FOOTER_BYTES = 16 << 20

    def __init__(self, opener):
        self.opener, self.open = opener, OrderedDict()

    def get(self, name: str):
        """The open part `name`, opened now if it is not open."""
        if name in self.open:
            self.open.move_to_end(name)
        else:
            self.open[name] = self.opener(name)
            while len(self.open) > 1 and (len(self.open) > self.KEEP or sum(
                    handle.metadata.serialized_size for handle in self.open.values()) > self.KEEP_FOOTER_BYTES):
                self.open.popitem(last=False)[1].close()
        return self.open[name]

    def close(self) -> None:
        while self.open:
            self.open.popitem()[1].close()


def _check_footer(handle, info: DatasetInfo, name: str, where: str) -> None:
    """The part's footer holds the row groups that the dataset's metadata lists, and (when the footer
    is checksummed, so any disagreement is the metadata's) of the sizes it lists. Older datasets
    without checksums are counted per epoch instead (`IncompleteEpochError`)."""
    groups = info.files[name]["row_groups"]
    if handle.num_row_groups != groups:
        raise CorruptPartError(f"{where}: {handle.num_row_groups} row groups in the file, {groups} in the dataset's "
                               "metadata")
    if "footer_xxh3" not in info.files[name]:
        return
    first = sum(info.files[n]["row_groups"] for n in sorted(info.files) if n < name)
    for rg in range(groups):
        rows = handle.metadata.row_group(rg).num_rows
        if rows != info.row_group_rows[first + rg]:
            raise CorruptPartError(f"{where} row group {rg}: {rows} rows in the file, "
                                   f"{info.row_group_rows[first + rg]} in the dataset's metadata")


def read_row_group(handle, location, info: DatasetInfo | Mapping, name: str, rg: int, columns=CHECKSUMMED):
    """Row group `rg` of an open part, after its content checksum matched (when recorded).

    Args:
        handle: The part, from `open_part`.
        location: Where the dataset is (for messages).
        info: The dataset's info (`read_info`).
        name: The part's file name.
        rg: The row group's index inside the part.
        columns: The columns to read (the checksummed ones are always read with them).

    Returns:
        The row group as a pyarrow Table.

    Raises:
        CorruptPartError: Its content differs from what `convert` wrote.
    """
    info = DatasetInfo.from_dict(info)   # a plain dict too
    entry = info.files[name]
    columns = list(columns)
    digests = entry.get("row_group_xxh3")
    covered = checksummed(info)
    if digests is not None:
        columns += [c for c in covered if c not in columns]
    try:
        table = handle.read_row_group(rg, columns=columns)
    except UnreadableRowGroup as error:  # damaged bytes (pyarrow >= 15 also checks page CRCs): a corrupt part
        raise CorruptPartError(str(error)) from None
    except PinstormError:
        raise
    except Exception as error:
        raise CorruptPartError(f"{location.url}/{name} row group {rg}: cannot be read: {error}") from None
    if digests is not None:
        found = table_digest(table) if covered == CHECKSUMMED else columns_digest(table.select(list(covered)))
        if rg >= len(digests) or found != digests[rg]:
            raise CorruptPartError(f"{location.url}/{name} row group {rg}: checksum mismatch (the part changed "
                                   "after conversion); none of its rows was delivered")
    return table


def verify_dataset(url, *, decode: bool = False, storage_options: dict | None = None) -> dict:
    """Check every part and row group of a dataset; with `decode`, also decode every image (Pillow).

    Returns ``{"parts": n, "row_groups": n, "rows": n}``; raises `MissingPartError`,
    `CorruptPartError` or `UndecodableImage` naming the part, row group and original file name.

    Args:
        url: The converted dataset: a local folder, an fsspec URL or ``board://<board>/<pin>``.
        decode: Also decode every image, not only check the checksums.
        storage_options: For fsspec (credentials, endpoints) when `url` is remote.

    Returns:
        ``{"parts": n, "row_groups": n, "rows": n}``: what was checked.

    Raises:
        MissingPartError: A part file is missing.
        CorruptPartError: A part of the wrong size, or a checksum that does not match (the part and row
            group are named).
        UndecodableImage: With `decode`, an image that does not decode (its original file name is named).
    """
    from .images import UndecodableImage, check_image
    from .metadata import read_info
    from .storage import locate

    location = locate(url, storage_options)
    info = read_info(location)
    check_parts(location, info)
    groups = rows = 0
    for name in sorted(info.files):
        if "xxh3" in info.files[name]:
            digest = xxhash.xxh3_128()
            with location.fs.open(location.join(name), "rb") as whole:
                for block in iter(lambda: whole.read(1 << 22), b""):
                    digest.update(block)
            if digest.hexdigest() != info.files[name]["xxh3"]:
                # Name the row group when the damage is in one; else the part (footer, small columns).
                _find_row_group(location, info, name)
                raise CorruptPartError(f"{location.url}/{name}: file checksum mismatch (outside the image and "
                                       "label data: the footer or the wnid, filename, height, width columns)")
        handle = open_part(location, info, name)
        try:
            for rg in range(info.files[name]["row_groups"]):
                tabular = checksummed(info) != CHECKSUMMED
                table = read_row_group(handle, location, info, name, rg, columns=checksummed(info)
                                       if tabular or not decode else ("image", "label", "filename"))
                if decode and not tabular:
                    for image, filename in zip(table.column("image").to_pylist(),
                                               table.column("filename").to_pylist()):
                        try:
                            check_image(image, name=filename, max_pixels=None)
                        except UndecodableImage as error:
                            raise UndecodableImage(f"{location.url}/{name} row group {rg}: {error}") from None
                groups += 1
                rows += table.num_rows
        finally:
            handle.close()
    return {"parts": len(info.files), "row_groups": groups, "rows": rows}


def _find_row_group(location, info: DatasetInfo, name: str) -> None:
    """Raise the error that names the damaged row group of a part, if the damage is in one."""
    handle = open_part(location, info, name)
    try:
        for rg in range(info.files[name]["row_groups"]):
            read_row_group(handle, location, info, name, rg, columns=checksummed(info)
                           if checksummed(info) != CHECKSUMMED else ("image", "label", "wnid", "filename",
                                                                     "height", "width"))
    finally:
        handle.close()
