"""Safe extraction of zip, tar, tar.gz and gz archives.

Archives come from boards anyone may write to, so every member is checked before it is written: no
absolute paths, no `..`, no links pointing out of the folder (nor paths through such links), no
device files. The whole archive is unpacked into a temporary sibling folder that is renamed into
place only when complete, and removed on any error: a refused archive leaves nothing behind.

Extraction is bounded (`ExtractLimits`): total bytes written, and the ratio of bytes written to the
archive's size once past a small floor. Both are counted on the bytes actually written, never on
what headers claim, so a zip or gzip bomb stops at the limit with `ArchiveTooLarge` and leaves
nothing behind. Defaults: 64 GiB and 200:1 (deflate tops out near 1000:1 on zeros; real data
sets compress 1.5-20:1). Raise them per call (`extract(..., limits=)`,
`board.pin_get(..., extract_limits=)`) or per board (`max_extract_bytes=`, `max_extract_ratio=`).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import uuid
import zipfile
import zlib
from typing import Any
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import xxhash

from .diskspace import require_room
from ..errors import ArchiveTooLarge, UnsafeArchive

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".gz")


_CHUNK = 1 << 20
_FILTER_ERROR = getattr(tarfile, "FilterError", ())  # Python >= 3.11.4 / 3.12


@dataclass(frozen=True)
class ExtractLimits:
    """Bounds on one extraction. `None` switches a bound off (only do that for trusted archives).

    Attributes:
        max_bytes: Total bytes written, all members together (default 64 GiB).
        max_ratio: Bytes written per byte of archive (default 200) ...
        ratio_floor: ... checked once this many bytes were written (default 64 MiB; small files compress well).
    """

    max_bytes: int | None = 64 << 30  # total bytes written, all members together
    max_ratio: float | None = 200.0  # bytes written / archive size ...
    ratio_floor: int = 64 << 20  # ... checked once this many bytes were written (small files compress well)

    @classmethod
    def of(cls, value: "ExtractLimits | dict[str, Any] | None" = None, **overrides: Any) -> "ExtractLimits":
        """Limits from an ExtractLimits, a dict of its fields, or None (defaults), then `overrides`
        that are not None (board options `max_extract_bytes=`, `max_extract_ratio=`).

        Args:
            value: An `ExtractLimits`, a dict of its fields, or None for the defaults.
            **overrides: Fields to set, where not None.
        """
        base = value if isinstance(value, ExtractLimits) else cls(**(value or {}))
        limits = replace(base, **{k: v for k, v in overrides.items() if v is not None})
        # options may arrive as text (`pinstorm board register -o max_extract_bytes=...`)
        return replace(limits, max_bytes=None if limits.max_bytes is None else int(limits.max_bytes),
                       max_ratio=None if limits.max_ratio is None else float(limits.max_ratio),
                       ratio_floor=int(limits.ratio_floor))


class _Budget:
    """Counts bytes as they are written and stops the extraction at the first limit crossed."""

    def __init__(self, archive: Path, limits: ExtractLimits, digests: dict[Path, str] | None = None):
        self.archive, self.limits = archive, limits
        self.size = max(archive.stat().st_size, 1)
        self.written = 0
        self.digests = digests  # {file written: xxh64 of its bytes}, hashed as they are written

    def add(self, n: int, member: str) -> None:
        self.written += n
        lim = self.limits
        if lim.max_bytes is not None and self.written > lim.max_bytes:
            raise ArchiveTooLarge(f"{self.archive.name}: extracting {member!r} passed {lim.max_bytes} bytes "
                                  "(max_bytes); raise the limit with extract_limits= / max_extract_bytes= "
                                  "if the archive is trusted")
        if lim.max_ratio is not None and self.written > lim.ratio_floor \
                and self.written > lim.max_ratio * self.size:
            raise ArchiveTooLarge(f"{self.archive.name}: extracting {member!r} passed {self.written} bytes from a "
                                  f"{self.size}-byte archive, more than {lim.max_ratio:g}:1 (max_ratio; an archive "
                                  "bomb?); raise it with extract_limits= / max_extract_ratio= if trusted")

    def copy(self, src: Any, target: Path, member: str) -> None:
        digest = xxhash.xxh64() if self.digests is not None else None
        with open(target, "wb") as out:
            while block := src.read(_CHUNK):
                self.add(len(block), member)
                out.write(block)
                if digest is not None:
                    digest.update(block)
        if digest is not None and self.digests is not None:
            self.digests[target] = digest.hexdigest()


def is_archive(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith(ARCHIVE_SUFFIXES)


def _check_member(archive: Path, member: str) -> None:
    p = PurePosixPath(member.replace("\\", "/"))
    if p.is_absolute() or member.startswith(("/", "\\")) or (len(member) > 1 and member[1] == ":"):
        raise UnsafeArchive(f"{archive.name}: member {member!r} has an absolute path")
    if ".." in p.parts:
        raise UnsafeArchive(f"{archive.name}: member {member!r} escapes the extraction folder ('..')")


def _check_tar_member(archive: Path, m: tarfile.TarInfo) -> None:
    _check_member(archive, m.name)
    if m.issym() or m.islnk():
        target = PurePosixPath(m.linkname)
        resolved = PurePosixPath(m.name).parent / target if m.issym() else target
        if target.is_absolute() or ".." in PurePosixPath(os.path.normpath(str(resolved))).parts:
            raise UnsafeArchive(f"{archive.name}: link {m.name!r} -> {m.linkname!r} points outside the folder")
    elif not (m.isfile() or m.isdir()):
        raise UnsafeArchive(f"{archive.name}: member {m.name!r} is a device or fifo")


def _check_zip(archive: Path, zf: zipfile.ZipFile) -> None:
    for info in zf.infolist():
        _check_member(archive, info.filename)
        mode = (info.external_attr >> 16) & 0o170000
        if mode == 0o120000:  # a symlink stored by Info-ZIP: zipfile would write it as a file; refuse
            raise UnsafeArchive(f"{archive.name}: member {info.filename!r} is a symbolic link")


def _extract_zip(zf: zipfile.ZipFile, tmp: Path, budget: _Budget) -> None:
    for info in zf.infolist():
        target = tmp / info.filename.replace("\\", "/")
        if info.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src:
            budget.copy(src, target, info.filename)


def _inside(archive: Path, tmp: Path, member: str) -> Path:
    """`tmp / member`, refusing one that resolves elsewhere through links extracted before it."""
    target = tmp / member
    if not target.resolve().is_relative_to(tmp.resolve()):
        raise UnsafeArchive(f"{archive.name}: member {member!r} resolves outside the folder (through a link)")
    return target


def _extract_tar(archive: Path, tf: tarfile.TarFile, tmp: Path, budget: _Budget) -> None:
    """One streaming pass: each member is checked, then written (a compressed tar is decompressed
    once, and a bomb stops at the budget instead of being decompressed in full for a listing)."""
    for m in tf:
        _check_tar_member(archive, m)
        if m.isdir():
            _inside(archive, tmp, m.name).mkdir(parents=True, exist_ok=True)
        elif m.isfile():
            target = _inside(archive, tmp, m.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            budget.copy(tf.extractfile(m), target, m.name)
            os.chmod(target, 0o755 if m.mode & 0o100 else 0o644)
        else:  # a link, checked above: tarfile's "data" filter makes it (and checks it again)
            _inside(archive, tmp, m.name)
            tf.extract(m, tmp, filter="data")


def extract(archive: str | Path, dest: str | Path, *, limits: ExtractLimits | dict[str, Any] | None = None,
            digests: dict[str, str] | None = None) -> list[Path]:
    """Unpack `archive` into `dest` (created atomically) and return the extracted files, sorted.

    If `dest` already exists it is assumed complete (it only ever appears by rename) and reused.
    `limits` bounds the bytes written (see `ExtractLimits`); crossing one raises `ArchiveTooLarge`
    and removes everything written so far. `digests`, when given, receives the xxh64 of each file
    written, by its path relative to `dest` (hashed while written: no second read).
    """
    archive, dest = Path(archive), Path(dest)
    if dest.exists():
        return sorted(p for p in dest.rglob("*") if p.is_file())
    written: dict[Path, str] | None = {} if digests is not None else None
    budget = _Budget(archive, ExtractLimits.of(limits), written)
    name = archive.name.lower()
    if not name.endswith(".zip"):  # a zip declares its sizes, checked below; a stream is at least as large
        require_room(dest.parent, archive.stat().st_size, what=f"extracting {archive.name}")
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                _check_zip(archive, zf)
                # declared sizes: a lie only makes this check weaker; the budget counts real bytes
                require_room(dest.parent, sum(i.file_size for i in zf.infolist()), what=f"extracting {archive.name}")
                _extract_zip(zf, tmp, budget)
        elif name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            with tarfile.open(archive, "r|*") as tf:
                _extract_tar(archive, tf, tmp, budget)
        elif name.endswith(".gz"):
            with gzip.open(archive, "rb") as src:
                budget.copy(src, tmp / archive.name[: -len(".gz")], archive.name)
        else:
            raise UnsafeArchive(f"{archive.name}: not a zip, tar, tar.gz or gz archive")
        if digests is not None and written is not None:
            digests.update({p.relative_to(tmp).as_posix(): h for p, h in written.items()})
        try:
            os.replace(tmp, dest)
        except OSError:
            if not dest.exists():  # someone else may have finished first: theirs is as good as ours
                raise
    except _FILTER_ERROR as e:  # tarfile's own "data" filter refused a link
        raise UnsafeArchive(f"{archive.name}: unsafe member, refused ({e})") from e
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UnsafeArchive(f"{archive.name}: damaged archive ({e})") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p for p in dest.rglob("*") if p.is_file())
