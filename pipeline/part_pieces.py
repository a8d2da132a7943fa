"""A part too big to cache whole, cached and read by row group: its pieces and a file that serves them.

Why: `convert`'s defaults write one part file of up to 4,096 row groups of 32 MB (ImageNet: two of ~75 GB),
and a cache smaller than one part could not stream it at all; a shuffled epoch over big parts of many row
groups fetched each part once per run of its row groups. Cut into pieces, a part is its footer (a few
KB to MB, fetched first) and one piece per row group (the byte range of its column chunks, which the
footer gives): each row group's bytes are fetched once an epoch, whatever the order, and a part larger
than the cache streams as long as its largest row group fits.

Trust: the footer is checked against the part's recorded footer checksum before its offsets are used;
every span lies inside the part, before the footer, in file order and without overlap; a row group piece
is checked against the xxh3-128 of its bytes that `convert` recorded (`SpanDigests`; taken as the bytes
arrive), or, for a dataset written before those, its row group's content checksum, before it is renamed
into the cache.
`PieceSource` serves only the pieces it was given: a read anywhere else is an error, never a fetch.
"""

from __future__ import annotations

import io
import mmap
import os
import re
from dataclasses import dataclass, field

import xxhash

from pinstorm.boards.errors import MalformedParquet, ParquetLimitExceeded
from pinstorm.boards.safety.parquet_limits import BoundedParquetFile, footer_length

from .verify import CorruptPartError

FOOTER = "footer"
TAIL = 8            # a Parquet file ends with <footer length: uint32 LE> "PAR1"
# reads of a row group at least this long are handed to pyarrow as views of the mapped piece, not copies
# (a column chunk: pyarrow keeps no view past the read); shorter ones (page headers) as bytes
VIEW_BYTES = 1 << 20
_PIECE = re.compile(r"(?P<part>.+)\+(?P<what>footer|[0-9]{1,9})")


def piece_name(part: str, row_group: int | None = None) -> str:
    """The cache file name of a part's footer (`row_group` None) or of one of its row groups. A part
    name never holds ``+`` (`part_cache` checks), so these never collide with a whole part's name."""
    return f"{part}+{FOOTER if row_group is None else int(row_group)}"


def split_piece(piece: str) -> tuple[str, int | None | str]:
    """(part, row group) of a row group piece, (part, None) of a footer, (piece, "whole") of a whole part."""
    match = _PIECE.fullmatch(piece)
    if match is None:
        return piece, "whole"
    return match["part"], None if match["what"] == FOOTER else int(match["what"])


@dataclass
class Piece:
    """One step of a streamed pass: a cache file (`name`) and the row groups of `part` read from it."""

    name: str
    part: str
    row_groups: list[int] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return self.name == self.part


def footer_span(tail: bytes, size: int, where: str) -> tuple[int, int]:
    """The byte range of a part's footer and tail, from its last `TAIL` bytes."""
    try:
        length = footer_length(tail, size, where)
    except (MalformedParquet, ParquetLimitExceeded) as error:
        raise CorruptPartError(str(error)) from None
    return size - TAIL - length, size


def row_group_spans(footer: bytes, size: int, where: str) -> list[tuple[int, int]]:
    """(start, end) of each row group's column chunks in a part of `size` bytes whose footer and tail are
    `footer`; refused unless they lie in the part, before the footer, in order and without overlap."""
    source = PieceSource(size, where)
    source.add_bytes(size - len(footer), footer)
    handle = BoundedParquetFile(source, where, size=size)
    try:
        spans, after = [], 4   # past the leading "PAR1"
        for rg in range(handle.metadata.num_row_groups):
            group = handle.metadata.row_group(rg)
            starts, ends = [], []
            for column in range(group.num_columns):
                chunk = group.column(column)
                start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
                starts.append(start)
                ends.append(start + chunk.total_compressed_size)
            if not starts:
                raise CorruptPartError(f"{where} row group {rg}: no column chunks")
            start, end = min(starts), max(ends)
            if start < after or end <= start or end > size - len(footer):
                raise CorruptPartError(f"{where} row group {rg}: column chunks at bytes {start:,}..{end:,} are not "
                                       "inside the part, after the row group before and before the footer")
            spans.append((start, end))
            after = end
        return spans
    finally:
        handle.close()


class SpanDigests:
    """The xxh3-128 of each of a file's row group spans, fed the file's bytes in order in any chunks: how
    `convert` records ``row_group_bytes_xxh3`` while it reads a written part back (for its whole-file
    checksum, in the same pass). Why: a row group piece is then verified by a digest taken as its bytes
    arrive, not by reading and hashing its columns again (a sixth of a streamed epoch's CPU)."""

    def __init__(self, spans: list[tuple[int, int]]):
        self.spans = spans
        self.digests = [xxhash.xxh3_128() for _ in spans]
        self.next = 0   # the first span not wholly fed yet

    def update(self, offset: int, data) -> None:
        """Feed `data`, the file's bytes from `offset` on (the calls in file order, without gaps)."""
        end = offset + len(data)
        view = memoryview(data)
        i = self.next
        while i < len(self.spans) and self.spans[i][0] < end:
            start, stop = self.spans[i]
            lo, hi = max(start, offset), min(stop, end)
            if lo < hi:
                self.digests[i].update(view[lo - offset:hi - offset])
            if stop > end:
                break
            i += 1
        self.next = i

    def hexdigests(self) -> list[str]:
        return [digest.hexdigest() for digest in self.digests]


class PieceSource(io.RawIOBase):
    """A part's bytes as a seekable file for pyarrow, served from the pieces in hand: its footer (bytes)
    and the row group being read (its cached file mapped into memory, so an eviction after it was opened
    cannot take its bytes away). Reads stop at a piece's end; a read outside every piece is an error, but
    for one that runs into the footer (pyarrow's first read of a file is its last 64 KB, of which it parses
    only the footer): the bytes before the footer read as zeros.

    Why mapped: pyarrow reads a column chunk with one ``read``; `io.RawIOBase.read` would copy it twice
    (into a bytearray, then into bytes). A view of the mapping is handed over as it is: a 17.4 MB row group
    read in 9.2 ms of CPU instead of 29.7, less than pyarrow reading the part file from its path (13.8 ms;
    `bench/bench_piece_reads.py`)."""

    def __init__(self, size: int, where: str):
        super().__init__()
        self.size, self.where, self.at = size, where, 0
        self._footer: tuple[int, bytes] | None = None
        self._group: tuple[int, int, mmap.mmap, memoryview] | None = None   # (start, end, mapping, its view)

    def add_bytes(self, start: int, data: bytes) -> None:
        self._footer = (start, bytes(data))

    def add_file(self, start: int, end: int, path) -> None:
        """Serve bytes `start`..`end` from the file at `path` (the previous row group is let go)."""
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            if os.fstat(descriptor).st_size != end - start or end <= start:
                raise CorruptPartError(f"{self.where}: a cached row group of the wrong size at bytes "
                                       f"{start:,}..{end:,}")
            # cached files are renamed into place whole and never written again: the mapping cannot shrink
            mapping = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(descriptor)
        self.let_go()
        self._group = (start, end, mapping, memoryview(mapping))

    def let_go(self) -> None:
        """Let the row group's mapping go (the footer stays): unmapped at once, or, while pyarrow still holds
        a view of it, when that view goes."""
        if self._group is not None:
            _, _, mapping, view = self._group
            self._group = None
            try:
                view.release()
                mapping.close()
            except BufferError:   # a view still exported: the mapping goes with it
                pass

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.at, 2: self.size}[whence]
        self.at = max(0, base + offset)
        return self.at

    def tell(self) -> int:
        return self.at

    def read(self, size: int = -1):
        """Bytes from here; a view of the mapped row group when it is `VIEW_BYTES` or more (zero copies)."""
        group = self._group
        if group is not None and group[0] <= self.at < group[1]:
            start, end, _, mapped = group
            count = end - self.at if size is None or size < 0 else min(size, end - self.at)
            if count >= VIEW_BYTES:
                view = mapped[self.at - start:self.at - start + count]
                self.at += count
                return view
        return super().read(size)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        if not len(view) or self.at >= self.size:
            return 0
        if self._group is not None and self._group[0] <= self.at < self._group[1]:
            start, end, _, mapped = self._group
            count = min(len(view), end - self.at)
            view[:count] = mapped[self.at - start:self.at - start + count]
        elif self._footer is not None and self.at < self._footer[0] + len(self._footer[1]) and \
                self.at + len(view) > self._footer[0]:
            start, data = self._footer
            gap = max(0, start - self.at)   # pyarrow reads the last 64 KB to find the footer: never parsed
            view[:gap] = bytes(gap)
            chunk = data[self.at + gap - start:self.at - start + len(view)]
            view[gap:gap + len(chunk)] = chunk
            count = gap + len(chunk)
        else:
            raise OSError(f"{self.where}: byte {self.at:,} is outside the row group in hand (a Parquet footer whose "
                          "offsets disagree with its row groups)")
        self.at += count
        return count

    def close(self) -> None:
        self.let_go()
        self._footer = None
        super().close()

