"""Safe extraction of zip, tar, tar.gz and gz archives.

Archives come from boards anyone may write to, so every member is checked before anything is
written: no absolute paths, no `..`, no links pointing out of the folder, no device files. The whole
archive is unpacked into a temporary sibling folder that is renamed into place only when complete.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import uuid
import zipfile
from pathlib import Path, PurePosixPath

from .errors import UnsafeArchive

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".gz")


def is_archive(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith(ARCHIVE_SUFFIXES)


def _check_member(archive: Path, member: str) -> None:
    p = PurePosixPath(member.replace("\\", "/"))
    if p.is_absolute() or member.startswith(("/", "\\")) or (len(member) > 1 and member[1] == ":"):
        raise UnsafeArchive(f"{archive.name}: member {member!r} has an absolute path")
    if ".." in p.parts:
        raise UnsafeArchive(f"{archive.name}: member {member!r} escapes the extraction folder ('..')")


def _check_tar(archive: Path, tf: tarfile.TarFile) -> None:
    for m in tf.getmembers():
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


def extract(archive: str | Path, dest: str | Path) -> list[Path]:
    """Unpack `archive` into `dest` (created atomically) and return the extracted files, sorted.

    If `dest` already exists it is assumed complete (it only ever appears by rename) and reused.
    """
    archive, dest = Path(archive), Path(dest)
    if dest.exists():
        return sorted(p for p in dest.rglob("*") if p.is_file())
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        name = archive.name.lower()
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                _check_zip(archive, zf)
                zf.extractall(tmp)
        elif name.endswith((".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")):
            with tarfile.open(archive) as tf:
                _check_tar(archive, tf)
                tf.extractall(tmp, filter="data")
        elif name.endswith(".gz"):
            with gzip.open(archive, "rb") as src, open(tmp / archive.name[: -len(".gz")], "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        else:
            raise UnsafeArchive(f"{archive.name}: not a zip, tar, tar.gz or gz archive")
        try:
            os.replace(tmp, dest)
        except OSError:
            if not dest.exists():  # someone else may have finished first: theirs is as good as ours
                raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, gzip.BadGzipFile) as e:
        raise UnsafeArchive(f"{archive.name}: damaged archive ({e})") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p for p in dest.rglob("*") if p.is_file())


def make_zip(files: list[tuple[Path, str]], out: Path) -> Path:
    """Zip (source, name in archive) pairs into `out`; already-compressed files are stored as is."""
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for src, rel in files:
            stored = src.suffix.lower() in {".jpeg", ".jpg", ".png", ".gz", ".zip", ".parquet"}
            zf.write(src, rel, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out
