"""Writing a pin's files as one zip archive (`pin(..., zip=True)`, one archive per `repartition` category).

The bytes are exactly those `zipfile` writes for the same files (`ZipInfo.from_file`, each member
stored or deflated by its suffix, the archive on a seekable file): any zip reader, R's included, reads
them, and the test suite compares the two writers byte for byte. Sources of up to `ZIP_IN_MEMORY` bytes
in all (a category of 40 or 1,300 JPEGs) are laid out here in one pass and written with one call;
`zipfile` spends ~25 us of Python a member on headers it writes twice, which was half the CPU of
`repartition` at 1,000 categories (bench/bench_repartition.py). Larger sources, a timestamp zip cannot
hold, or more members than a plain (non-zip64) archive counts, go through `zipfile` to disk, as before.
"""

from __future__ import annotations

import os
import stat
import struct
import time
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

ZIP_IN_MEMORY = 64 * 2**20  # sources zipped in memory by `make_zip` (at most this much held at once)
STORED_SUFFIXES = frozenset({".jpeg", ".jpg", ".png", ".gz", ".zip", ".parquet"})  # already compressed: as they are

# The zip format's records, as zipfile packs them (APPNOTE.TXT 4.3.7, 4.3.12, 4.3.16).
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_VERSION = zipfile.ZipInfo().create_version  # 2.0: what zipfile writes for stored and deflated members
_SYSTEM = zipfile.ZipInfo().create_system  # 3 (Unix), 0 on Windows
_UTF8_NAME = 0x800
_MAX_MEMBERS = 0xFFFF  # more need zip64 end records: zipfile writes those


def make_zip(files: Sequence[tuple[str | os.PathLike[str], str]], out: Path) -> Path:
    """Zip (source, name in archive) pairs into `out`; already-compressed files are stored as is."""
    data = _zip_in_memory(files)
    if data is not None:
        Path(out).write_bytes(data)
        return out
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for src, rel in files:
            zf.write(src, rel, compress_type=_compression(src))
    return out


def _compression(src: str | os.PathLike[str]) -> int:
    return zipfile.ZIP_STORED if _suffix(os.fspath(src)).lower() in STORED_SUFFIXES else zipfile.ZIP_DEFLATED


def _suffix(path: str) -> str:
    """`os.path.splitext(path)[1]`, without its generic work where the file name starts with no dot."""
    start = max(path.rfind(os.sep), path.rfind(os.altsep) if os.altsep else -1) + 1
    dot = path.rfind(".")
    if dot <= start or path[start] == ".":  # no dot in the name, or leading dots: splitext's own rules
        return os.path.splitext(path)[1]
    return path[dot:]


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0)


def _zip_in_memory(files: Sequence[tuple[str | os.PathLike[str], str]]) -> bytearray | None:
    """The archive's bytes, or None where `zipfile` must write it (see the module's docstring).
    ~4 us of Python a member besides the 4 system calls that read it (a category of 40 small JPEGs)."""
    if len(files) > _MAX_MEMBERS:
        return None
    out, central, held = bytearray(), [], 0
    stamps: dict[int, tuple[int, int] | None] = {}  # whole second -> DOS time and date: files share seconds
    for src, rel in files:
        fd = os.open(src, _OPEN_FLAGS)  # 4 system calls a file, not io's 8
        try:
            st = os.fstat(fd)
            held += st.st_size
            if held > ZIP_IN_MEMORY or not stat.S_ISREG(st.st_mode):
                return None
            data = os.read(fd, st.st_size)
            if len(data) < st.st_size:  # a short read: only on odd file systems
                data = _read_rest(fd, st.st_size, data)
        finally:
            os.close(fd)
        second = int(st.st_mtime)  # what localtime() takes of the float (before 1970: no zip year either way)
        stamp = stamps[second] if second in stamps else stamps.setdefault(second, _dos_stamp(second))
        if stamp is None:  # zipfile's own error (or its choice) for such a time
            return None
        dos_time, dos_date = stamp
        name, flags = _encoded(_archive_name(rel))
        method, crc, size = _compression(src), zlib.crc32(data), len(data)
        if method == zipfile.ZIP_DEFLATED:
            packer = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)
            data = packer.compress(data) + packer.flush()
        offset = len(out)
        out += _LOCAL.pack(b"PK\x03\x04", _VERSION, 0, flags, method, dos_time, dos_date, crc, len(data), size,
                           len(name), 0)
        out += name
        out += data
        attributes = (st.st_mode & 0xFFFF) << 16 or 0o600 << 16
        central.append(_CENTRAL.pack(b"PK\x01\x02", _VERSION, _SYSTEM, _VERSION, 0, flags, method, dos_time,
                                     dos_date, crc, len(data), size, len(name), 0, 0, 0, 0, attributes, offset)
                       + name)
    start = len(out)
    out += b"".join(central)
    out += _END.pack(b"PK\x05\x06", 0, 0, len(central), len(central), len(out) - start, start, 0)
    return out


def _dos_stamp(second: int) -> tuple[int, int] | None:
    """(DOS time, DOS date) of a modification time in whole seconds, as zipfile writes it; None for a
    year a zip cannot hold."""
    try:
        when = time.localtime(second)
    except (OverflowError, OSError, ValueError):
        return None
    if not 1980 <= when.tm_year <= 2107:
        return None
    dos_time = when.tm_hour << 11 | when.tm_min << 5 | when.tm_sec // 2
    return dos_time, (when.tm_year - 1980) << 9 | when.tm_mon << 5 | when.tm_mday


def _read_rest(fd: int, size: int, data: bytes) -> bytes:
    """The file's `size` bytes (as `fstat` found them; fewer if it shrank since), `data` read so far."""
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            break
        data += more
    return data


def _archive_name(rel: str) -> str:
    """`rel` as `ZipInfo.from_file` names it: normalised, no drive, no leading separator, '/' between parts."""
    if os.sep == "/" and "/" not in rel and rel not in ("", ".", ".."):
        return rel  # a plain file name (a category's images): normalising leaves it as it is
    name = os.path.normpath(os.path.splitdrive(rel)[1])
    while name[0] in (os.sep, os.altsep):
        name = name[1:]
    return name.replace(os.sep, "/") if os.sep != "/" else name


def _encoded(name: str) -> tuple[bytes, int]:
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _UTF8_NAME
