"""Bounds on reading untrusted Parquet (and Arrow IPC): what it will decode to, checked before pyarrow decodes it.

A Parquet file can be tiny next to what it decodes to, and pyarrow allocates whatever the file asks
for: one 1 MiB dictionary value referenced by 8,000 rows is a 1.7 KB file that decodes to 8 GB; a
footer can declare 10**12 values; a zstd page can hold 0.7 GB in 39 KB. So every read of Parquet
from a board (pipeline parts, parquet pins) goes through `BoundedParquetFile`, which checks, per row
group and before anything is decoded:

* the footer: its length (before pyarrow parses it) and Thrift sizes, and that its counts agree
  (rows of the file = sum of row groups; a flat column has one value per row);
* each column chunk: declared values x their width (offsets for binary), the declared uncompressed
  size, and for compressed chunks the page headers themselves (one small read each: the sizes that
  decompression will allocate, which the footer's total must cover);
* dictionary-encoded binary chunks, where the footer counts the dictionary once but decoding copies
  a value per row: bounded by rows x the longest value of the dictionary page (read and, if need be,
  decompressed here: it is part of the declared size); when that passes the budget, the chunk is
  read *as a dictionary* (indices + values, 4 bytes a row) and its exact expanded size computed from
  the value lengths; it is expanded only within the budget.
  DELTA_BYTE_ARRAY chunks (each value a prefix of the previous plus a suffix) by values x
  uncompressed size, the only sound bound short of decoding.

Past the budget: `ParquetLimitExceeded` (a `LimitExceeded`) naming the file, row group, column, the
value and the limit; inconsistent footers: `MalformedParquet`. Why bound by what decoding produces
rather than read in small batches with a running budget: a single page or a single batch of a
dictionary column can already be gigabytes, and pyarrow cannot be stopped inside one.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# the errors live with the other boards errors, so that catching them loads no pyarrow
from ..errors import LimitExceeded, MalformedMetadata, MalformedParquet, ParquetLimitExceeded, UnreadableRowGroup

MIB = 1 << 20
ROW_GROUP_ENV = "PINSTORM_MAX_ROW_GROUP_BYTES"
LOAD_ENV = "PINSTORM_MAX_LOAD_BYTES"
DEFAULT_ROW_GROUP_BYTES = 512 * MIB   # pinstorm writes ~32 MB row groups
DEFAULT_LOAD_BYTES = 1 << 30          # a whole table loaded by pin_get
DEFAULT_FOOTER_BYTES = 16 * MIB
MAX_PAGE_HEADER = 16 * MIB            # pyarrow's own limit
LOAD_HINT = f"raise {LOAD_ENV} for data you trust, or read its path with pin_get(..., files=True)"
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_DICTIONARY = {"PLAIN_DICTIONARY", "RLE_DICTIONARY"}
DICTIONARY_ROW_BYTES = 13   # an expanded dictionary row besides its value: offsets + validity (9), index (4)
_U32 = struct.Struct("<I")
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd", "BROTLI": "brotli", "LZ4_RAW": "lz4_raw"}


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise LimitExceeded(f"{name}={raw!r} is not a number of bytes") from None
    return max(1, value)


def row_group_budget() -> int:
    """Bytes one row group may decode to (env ``PINSTORM_MAX_ROW_GROUP_BYTES``, default 512 MiB)."""
    return _env_bytes(ROW_GROUP_ENV, DEFAULT_ROW_GROUP_BYTES)


def load_budget() -> int:
    """Bytes a whole table loaded by `pin_get` may decode to (env ``PINSTORM_MAX_LOAD_BYTES``, default 1 GiB)."""
    return _env_bytes(LOAD_ENV, DEFAULT_LOAD_BYTES)


# ---- page headers: Thrift compact protocol, just enough to read sizes and skip the rest ---------------

class _Thrift:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        if self.at >= len(self.data):
            raise EOFError
        self.at += 1
        return self.data[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 70:
                raise ValueError("varint too long")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def skip(self, kind: int, depth: int = 0) -> None:
        if depth > 32:
            raise ValueError("page header nested too deeply")
        if kind in (1, 2):
            return
        if kind == 3:
            self.byte()
        elif kind in (4, 5, 6):
            self.varint()
        elif kind == 7:
            self.take(8)
        elif kind == 8:
            self.take(self.varint())
        elif kind in (9, 10):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            for _ in range(size):
                self.skip(head & 0x0F, depth + 1) if head & 0x0F not in (1, 2) else self.byte()
        elif kind == 11:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == 12:
            self.struct(depth + 1)
        else:
            raise ValueError(f"unknown Thrift type {kind}")

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise EOFError
        self.at += n
        return self.data[self.at - n:self.at]

    def struct(self, depth: int = 0, want=()) -> dict:
        found, field = {}, 0
        while True:
            head = self.byte()
            if head == 0:
                return found
            delta, kind = head >> 4, head & 0x0F
            field = field + delta if delta else self.zigzag()
            if field in want and kind == 5:
                found[field] = self.zigzag()
            else:
                self.skip(kind, depth)


def page_header(data: bytes) -> tuple[int, int, int, int]:
    """(page type, uncompressed size, compressed size, header length) of the page header at the start
    of `data`; EOFError when `data` holds only part of it."""
    reader = _Thrift(data)
    fields = reader.struct(want=(1, 2, 3))
    if not {1, 2, 3} <= fields.keys():
        raise ValueError("page header without its sizes")
    return fields[1], fields[2], fields[3], reader.at


# ---- the bounded file --------------------------------------------------------------------------------

@dataclass
class _Chunk:
    column: str          # top-level field name
    path: str            # path in schema
    flat: bool
    bound: int           # bytes this chunk may decode to (a sound upper bound)
    dictionary_binary: bool
    refine: tuple | None = None   # (bytes besides the values, values, column meta, dictionary page)


def out_of_resources(error: BaseException) -> bool:
    """Whether `error` is this machine running out of open files or memory (never a file's fault: it must
    not be reported as a malformed file)."""
    return isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM)


def footer_length(tail: bytes, size: int, where: str, max_footer_bytes: int = DEFAULT_FOOTER_BYTES) -> int:
    """The length of the footer of a Parquet file of `size` bytes whose last 8 bytes are `tail`, refused
    when it is not a Parquet file or the footer is over `max_footer_bytes` (memory to parse it)."""
    if size < 12:
        raise MalformedParquet(f"{where}: {size} bytes is too small for a Parquet file")
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise MalformedParquet(f"{where}: no Parquet magic at the end of the file")
    length = int.from_bytes(tail[:4], "little")
    if length > size - 12:
        raise MalformedParquet(f"{where}: footer of {length} bytes declared in a {size}-byte file")
    if length > max_footer_bytes:
        raise ParquetLimitExceeded(f"{where}: Parquet footer of {length} bytes, over the limit of "
                                   f"{max_footer_bytes} bytes")
    return length


class BoundedParquetFile:
    """A `pq.ParquetFile` whose reads are refused, before decoding, past a memory budget.

    `source`: a local path or a seekable binary file object; `where` names it in errors (a URL, a
    part of a dataset). `max_row_group_bytes` bounds each row group read, `max_bytes` a whole
    `read()`. `close_source`: close a file object `source` on `close()`; `hint`: what errors tell
    the user to do. Other keywords go to `pq.ParquetFile`.
    """

    def __init__(self, source, where: str, *, max_row_group_bytes: int | None = None,
                 max_footer_bytes: int = DEFAULT_FOOTER_BYTES, size: int | None = None, close_source: bool = False,
                 hint: str | None = None, **options):
        self.source, self.where = source, where
        self.hint = hint or f"raise {ROW_GROUP_ENV} for data you trust"
        self.max_row_group_bytes = row_group_budget() if max_row_group_bytes is None else max_row_group_bytes
        self._options = options
        # pyarrow 14's pool threads reading a Python file object (not a path) make some processes abort at exit
        # ("terminate called without an active exception": 4 exits in 24 against 0 in 24 read in one thread)
        self._use_threads = isinstance(source, (str, os.PathLike))
        self._handle = open(source, "rb") if isinstance(source, (str, os.PathLike)) else source
        self._owns_handle = self._handle is not source or close_source
        try:
            self._check_tail(size, max_footer_bytes)
            try:
                self.file = pq.ParquetFile(source, thrift_string_size_limit=max_footer_bytes,
                                           thrift_container_size_limit=max(1000, max_footer_bytes // 8), **options)
            except (OSError, ValueError, IndexError, KeyError, pa.ArrowException) as error:
                if out_of_resources(error):   # this machine's limit, not the file's fault
                    raise
                raise MalformedParquet(f"{where}: cannot be read as Parquet: {error}") from None
            try:
                self.metadata = self.file.metadata
                self._check_footer()
                self.file.schema_arrow
            except (LimitExceeded, MalformedMetadata):
                raise
            except (ValueError, OSError, IndexError, KeyError, pa.ArrowException) as error:
                raise MalformedParquet(f"{where}: unreadable footer: {error}") from None
        except BaseException:
            self.close()
            raise
        self._bounds: dict[tuple, list[_Chunk]] = {}

    # -- footer -------------------------------------------------------------------------------------------
    def _check_tail(self, size, max_footer_bytes):
        handle = self._handle
        if size is None:
            size = handle.seek(0, os.SEEK_END)
        if size >= 12:
            handle.seek(size - 8)
        footer_length(handle.read(8) if size >= 12 else b"", size, self.where, max_footer_bytes)
        self.size = size

    def _check_footer(self):
        meta = self.metadata
        rows = 0
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            if group.num_rows < 0:
                raise MalformedParquet(f"{self.where} row group {rg}: {group.num_rows} rows")
            rows += group.num_rows
        if rows != meta.num_rows:
            raise MalformedParquet(f"{self.where}: the footer declares {meta.num_rows} rows, its row groups "
                                   f"{rows}")

    @property
    def num_row_groups(self) -> int:
        return self.metadata.num_row_groups

    @property
    def schema_arrow(self):
        return self.file.schema_arrow

    # -- bounds -------------------------------------------------------------------------------------------
    def _columns(self, columns):
        names = self.file.schema_arrow.names
        if columns is None:
            return list(names)
        unknown = [c for c in columns if c not in names]
        if unknown:
            raise MalformedParquet(f"{self.where}: no column(s) {', '.join(unknown)}")
        return list(columns)

    def _chunks(self, rg: int, columns) -> list[_Chunk]:
        """The bounds of the chunks of row group `rg` under the top-level `columns` (only those are
        looked at: page headers are read only for what will be decoded)."""
        key = (rg, frozenset(columns))
        if key in self._bounds:
            return self._bounds[key]
        try:
            self._bounds[key] = self._read_chunks(rg, key[1])
            return self._bounds[key]
        except (LimitExceeded, MalformedMetadata):
            raise
        except (ValueError, OSError, IndexError, KeyError, pa.ArrowException) as error:   # pyarrow's accessors
            raise MalformedParquet(f"{self.where} row group {rg}: unreadable footer entry: {error}") from None

    def _read_chunks(self, rg: int, wanted) -> list[_Chunk]:
        if not 0 <= rg < self.num_row_groups:
            raise MalformedParquet(f"{self.where}: no row group {rg} (it has {self.num_row_groups})")
        group, schema = self.metadata.row_group(rg), self.file.schema
        chunks = []
        for i in range(group.num_columns):
            leaf = schema.column(i)
            if leaf.path.split(".")[0] not in wanted:
                continue
            meta = group.column(i)
            path = meta.path_in_schema
            flat = leaf.max_repetition_level == 0 and "." not in path
            where = f"{self.where} row group {rg} column {path}"
            values = meta.num_values
            if values < 0 or (flat and values != group.num_rows):
                raise MalformedParquet(f"{where}: {values} values declared in a row group of {group.num_rows} rows")
            kind = meta.physical_type
            if kind == "BYTE_ARRAY":
                width = 8   # offsets (large types) and validity, per value
            elif kind == "FIXED_LEN_BYTE_ARRAY":
                width = max(16, leaf.length or 0)
            else:
                width = 16 if leaf.converted_type == "DECIMAL" else _WIDTH.get(kind, 16)
            declared = meta.total_uncompressed_size
            if declared < 0 or meta.total_compressed_size < 0 or \
                    meta.total_compressed_size > self.size or values > self.max_row_group_bytes:
                raise self._over(where, f"declares {values} values, {declared} bytes uncompressed and "
                                        f"{meta.total_compressed_size} compressed", values * width)
            encodings = set(meta.encodings)
            dictionary = kind in ("BYTE_ARRAY",) and (meta.has_dictionary_page or bool(encodings & _DICTIONARY))
            pages = self._pages(meta, where, first_only=meta.compression == "UNCOMPRESSED") \
                if meta.compression != "UNCOMPRESSED" or dictionary else []
            bound = values * width + declared
            if kind == "BYTE_ARRAY" and "DELTA_BYTE_ARRAY" in encodings:
                bound = values * width + values * declared
            refine = None
            if dictionary:
                # every row may reference the longest dictionary value: no longer than the dictionary
                # page (else the chunk); `_refine` reads the page for the longest value when needed. Per
                # row as `_dictionary_columns` counts exactly: no bound falls below the exact count, so
                # every way of counting refuses the same row groups
                has_page = bool(pages) and pages[0][0] == 2
                bound = values * DICTIONARY_ROW_BYTES + values * (pages[0][2] if has_page else declared) + declared
                if has_page and declared <= self.max_row_group_bytes:
                    refine = (values * DICTIONARY_ROW_BYTES + declared, values, meta, pages[0])
            chunks.append(_Chunk(path.split(".")[0], path, flat, bound, dictionary, refine))
        return chunks

    def _pages(self, meta, where, first_only: bool = False) -> list[tuple[int, int, int, int, int]]:
        """(page type, header bytes, uncompressed size, compressed size, offset) of a chunk's pages (the
        dictionary page first, if any; only the first with `first_only`), read from the page headers;
        refused when they add up to more than the footer declares."""
        if meta.total_compressed_size == 0 or meta.num_values == 0:
            return []
        offsets = [o for o in (meta.data_page_offset, meta.dictionary_page_offset) if o]
        start = min(offsets) if offsets else 0
        end = start + meta.total_compressed_size
        if start < 4 or end > self.size:
            raise MalformedParquet(f"{where}: pages at bytes {start}..{end} of a {self.size}-byte file")
        pages, total, at = [], 0, start
        while at < end:
            window = 256
            while True:
                self._handle.seek(at)
                data = self._handle.read(min(window, end - at))
                try:
                    kind, uncompressed, compressed, length = page_header(data)
                    break
                except EOFError:
                    if window >= MAX_PAGE_HEADER or len(data) < window:
                        raise MalformedParquet(f"{where}: page header at byte {at} is cut off") from None
                    window *= 16
                except ValueError as error:
                    raise MalformedParquet(f"{where}: page header at byte {at}: {error}") from None
            if uncompressed < 0 or compressed < 0:
                raise MalformedParquet(f"{where}: page at byte {at} declares negative sizes")
            pages.append((kind, length, uncompressed, compressed, at))
            total += length + uncompressed
            if total > meta.total_uncompressed_size:
                raise MalformedParquet(f"{where}: page headers declare at least {total} bytes uncompressed, the "
                                       f"footer {meta.total_uncompressed_size}")
            if first_only:
                break
            at += length + compressed
        return pages

    def _refine(self, chunks) -> None:
        """Tighten dictionary chunks' bounds with the longest value of their dictionary page."""
        for chunk in chunks:
            if chunk.refine is not None:
                base, values, meta, page = chunk.refine
                longest = self._longest_value(meta, page)
                if longest is not None:
                    chunk.bound = min(chunk.bound, base + values * longest)
                chunk.refine = None

    def _longest_value(self, meta, page) -> int | None:
        """The longest value in a (PLAIN) dictionary page, or None if it cannot be read here."""
        _, length, uncompressed, compressed, at = page
        self._handle.seek(at + length)
        data = self._handle.read(compressed)
        if meta.compression != "UNCOMPRESSED":
            codec = _CODECS.get(meta.compression)
            if codec is None:
                return None
            try:
                data = pa.Codec(codec).decompress(data, decompressed_size=uncompressed).to_pybytes()
            except (pa.ArrowException, ValueError, OSError):
                return None
        longest, pos, end = 0, 0, len(data) - 4
        unpack = _U32.unpack_from
        while pos <= end:
            n = unpack(data, pos)[0]
            if n > longest:
                longest = n
            pos += 4 + n
        return longest

    def _over(self, where, what, value):
        return ParquetLimitExceeded(f"{where}: {what}; decoding could take {value:,} bytes, over the budget "
                                    f"of {self.max_row_group_bytes:,} bytes ({self.hint})")

    def row_group_bytes(self, rg: int, columns=None) -> int:
        """A sound upper bound of what reading `columns` of row group `rg` decodes to (footer and page
        headers only); no exact dictionary count."""
        wanted = set(self._columns(columns))
        return sum(c.bound for c in self._chunks(rg, wanted))

    # -- reads --------------------------------------------------------------------------------------------
    def check_row_group(self, rg: int, columns=None, *, budget: int | None = None) -> tuple[int, dict]:
        """(bytes row group `rg` decodes to, {column: (dictionary column, exact bytes)} for the columns
        that had to be counted exactly); `ParquetLimitExceeded` past `budget` (default: the row group
        budget). Nothing is expanded."""
        budget = self.max_row_group_bytes if budget is None else budget
        columns = self._columns(columns)
        chunks = self._chunks(rg, columns)
        total = sum(c.bound for c in chunks)
        exact = {}
        if total > budget:
            self._refine(chunks)
            total = sum(c.bound for c in chunks)
        if total > budget:
            # The loose dictionary bound is over: count the flat dictionary chunks exactly.
            candidates = sorted({c.column for c in chunks if c.dictionary_binary and c.flat})
            if candidates:
                exact = self._dictionary_columns(rg, candidates)
                total = sum(c.bound for c in chunks if c.column not in exact) + \
                    sum(size for _, size in exact.values())
            if total > budget:
                worst = max(chunks, key=lambda c: exact[c.column][1] if c.column in exact else c.bound)
                raise ParquetLimitExceeded(
                    f"{self.where} row group {rg}: would decode to {total:,} bytes (column {worst.path}: "
                    f"{exact[worst.column][1] if worst.column in exact else worst.bound:,}), over the budget of "
                    f"{budget:,} bytes ({self.hint})")
        return total, exact

    def read_row_group(self, rg: int, columns=None, *, budget: int | None = None):
        """Row group `rg` (selected `columns`), refused before decoding past `budget` (default: the row
        group budget). Columns counted exactly are expanded from the dictionaries already read."""
        columns = self._columns(columns)
        _, exact = self.check_row_group(rg, columns, budget=budget)
        rest = [c for c in columns if c not in exact]
        try:
            table = self.file.read_row_group(rg, columns=rest, use_threads=self._use_threads) if rest else None
        except (OSError, ValueError, pa.ArrowException) as error:
            raise UnreadableRowGroup(f"{self.where} row group {rg}: cannot be read: {error}") from None
        if not exact:
            return table
        arrays = {}
        for name, (column, _) in exact.items():
            keep = pa.types.is_dictionary(self.file.schema_arrow.field(name).type)
            arrays[name] = column if keep else pa.chunked_array(
                [chunk.dictionary_decode() for chunk in column.chunks], type=column.type.value_type)
        return pa.table([(table.column(c) if c in rest else arrays[c]) for c in columns], names=columns)

    def check(self, columns=None, *, max_bytes: int | None = None) -> int:
        """Bytes the whole file (selected `columns`) decodes to, refused past `max_bytes` (default: no
        total bound) or a row group past the row group budget; nothing is expanded."""
        columns = self._columns(columns)
        loose = [self.row_group_bytes(rg, columns) for rg in range(self.num_row_groups)]
        if max_bytes is None or sum(loose) <= max_bytes:
            for rg, size in enumerate(loose):
                if size > self.max_row_group_bytes:
                    self.check_row_group(rg, columns)
            return sum(loose)
        total = 0
        for rg in range(self.num_row_groups):
            total += self.check_row_group(rg, columns, budget=min(self.max_row_group_bytes, max_bytes))[0]
            if total > max_bytes:
                raise ParquetLimitExceeded(f"{self.where}: would decode to at least {total:,} bytes (counted up to "
                                           f"row group {rg} of {self.num_row_groups}), over the budget of "
                                           f"{max_bytes:,} bytes ({self.hint})")
        return total

    def _dictionary_columns(self, rg, names) -> dict:
        """{name: (dictionary column, bytes)}, read without expanding: the expanded values, offsets and
        validity, plus the dictionary read itself (held while expanding, or kept as the result)."""
        try:
            reader = pq.ParquetFile(self.source, read_dictionary=names, **self._options)
            table = reader.read_row_group(rg, columns=names, use_threads=self._use_threads)
        except (OSError, ValueError, pa.ArrowException) as error:
            raise UnreadableRowGroup(f"{self.where} row group {rg}: cannot be read: {error}") from None
        out = {}
        for name in names:
            column = table.column(name)
            size = 0
            for chunk in column.chunks:
                if pa.types.is_dictionary(chunk.type):
                    lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
                    size += (pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0) + 9 * len(chunk) + 8 + chunk.nbytes
                else:
                    size += chunk.nbytes
            out[name] = (column, size)
        return out

    def read(self, columns=None, *, max_bytes: int | None = None):
        """Every row group (selected `columns`), within the row group budget each and `max_bytes` in all."""
        columns = self._columns(columns)
        tables, total = [], 0
        for rg in range(self.num_row_groups):
            budget = self.max_row_group_bytes if max_bytes is None else min(self.max_row_group_bytes,
                                                                            max_bytes - total)
            table = self.read_row_group(rg, columns, budget=max(0, budget))
            total += table.nbytes
            if max_bytes is not None and total > max_bytes:
                raise ParquetLimitExceeded(f"{self.where}: more than {max_bytes:,} bytes once decoded (at row "
                                           f"group {rg} of {self.num_row_groups})")
            tables.append(table)
        if not tables:
            return self.file.schema_arrow.empty_table().select(columns)
        return pa.concat_tables(tables)

    def close(self):
        file = getattr(self, "file", None)
        if file is not None:
            file.close()
        if self._owns_handle:
            self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_file(path, where: str, *, max_bytes: int | None = None) -> int:
    """Bytes a whole Parquet file decodes to, refused before decoding past `max_bytes` (default
    `load_budget()`); each row group counts against it too."""
    max_bytes = load_budget() if max_bytes is None else max_bytes
    with BoundedParquetFile(path, where, max_row_group_bytes=max_bytes, hint=LOAD_HINT) as file:
        return file.check(max_bytes=max_bytes)


# ---- Arrow IPC (feather v2) files: compressed buffers declare their decompressed size -------------------

def check_arrow_file(path, where: str, *, max_bytes: int | None = None) -> int:
    """Bytes an Arrow IPC file (a feather v2 / `arrow` pin) decodes to, refused before decoding past
    `max_bytes` (default `load_budget()`).

    Each message's metadata (a flatbuffer) lists its body buffers; a compressed buffer (lz4 / zstd,
    what ``to_feather`` writes by default) starts with its decompressed length, which is what
    pyarrow allocates. Those lengths plus 8 bytes a value are summed, one small read per buffer.
    """
    from flatbuffers import number_types as N
    from flatbuffers.table import Table

    max_bytes = load_budget() if max_bytes is None else max_bytes

    def table(buf, pos):
        return Table(buf, pos)

    def field(tab, index):
        return tab.Offset(4 + 2 * index)

    def structs(tab, index):
        o = field(tab, index)
        if not o:
            return []
        start, count = tab.Vector(o), tab.VectorLen(o)
        return [(tab.Get(N.Int64Flags, start + 16 * k), tab.Get(N.Int64Flags, start + 16 * k + 8))
                for k in range(count)]

    total = 0
    try:
        with pa.memory_map(os.fspath(path)) as source:
            if source.read(6) != b"ARROW1":
                raise MalformedParquet(f"{where}: not an Arrow IPC file")
            source.seek(8)
            for message in pa.ipc.MessageReader.open_stream(source):
                meta = bytes(message.metadata)
                root = table(meta, N.UOffsetTFlags.py_type(int.from_bytes(meta[:4], "little")))
                kind_at = field(root, 1)
                kind = root.Get(N.Uint8Flags, kind_at + root.Pos) if kind_at else 0
                if kind not in (2, 3):
                    continue
                header = Table(bytearray(), 0)
                root.Union(header, field(root, 2))
                batch = header
                if kind == 2:                              # DictionaryBatch: its data is a RecordBatch
                    o = field(header, 1)
                    batch = table(meta, header.Indirect(o + header.Pos))
                body = message.body
                nodes = structs(batch, 1)
                total += 8 * sum(max(0, length) for length, _ in nodes)
                compressed = bool(field(batch, 3))
                for offset, length in structs(batch, 2):
                    if offset < 0 or length < 0 or offset + length > body.size:
                        raise MalformedParquet(f"{where}: a buffer at {offset}+{length} outside its message body")
                    if compressed and length >= 8:
                        declared = int.from_bytes(body[offset:offset + 8].to_pybytes(), "little", signed=True)
                        total += length - 8 if declared == -1 else declared
                    else:
                        total += length
                if total > max_bytes:
                    raise ParquetLimitExceeded(f"{where}: would decode to at least {total:,} bytes, over the budget "
                                               f"of {max_bytes:,} bytes ({LOAD_HINT})")
    except (OSError, pa.ArrowException, IndexError, ValueError) as error:
        if isinstance(error, (LimitExceeded, MalformedMetadata)):
            raise
        raise MalformedParquet(f"{where}: cannot be read as an Arrow IPC file: {error}") from None
    return total
