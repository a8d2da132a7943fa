"""A pin's zip archive (`zip=True`, one per `repartition` category) has exactly the bytes `zipfile` writes
for the same files, whichever way it is made: laid out in memory (small sources, the fast path measured in
bench/bench_repartition.py) or through `zipfile` to disk (large sources, odd timestamps)."""

from __future__ import annotations

import os
import zipfile

import pytest

from pinstorm.boards import zip_writer


def _files(tmp_path):
    files = []
    for rel, data, mode in [("a.JPEG", os.urandom(3000), 0o644), ("sub/b.png", b"png" * 50, 0o600),
                            ("e.jpg", b"", 0o644), ("n.txt", b"some text " * 5000, 0o640),
                            ("r.bin", os.urandom(70_000), 0o755), ("é/ü.jpeg", b"\xff\xd8" * 9, 0o644),
                            ("c.PARQUET", b"PAR1" * 3, 0o644),
                            # suffixes by splitext's rules: leading dots, a dot only in the folder's name
                            (".hidden.jpg", b"\xff\xd8" * 50, 0o644), ("..jpg", b"dots " * 100, 0o644),
                            ("d.x/plain", b"plain " * 100, 0o644)]:
        path = tmp_path / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        files.append((path, rel))
    os.utime(files[1][0], (0, 1_700_000_001))   # an odd second: zip keeps two-second steps
    os.utime(files[2][0], (0, 1_700_000_002.9))   # another second, after it: each member keeps its own date
    return files


def _zipfile_bytes(files, out):
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for src, rel in files:
            stored = os.path.splitext(src)[1].lower() in zip_writer.STORED_SUFFIXES
            zf.write(src, rel, compress_type=zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return out.read_bytes()


def test_the_archive_has_the_bytes_zipfile_writes(tmp_path, monkeypatch):
    files = _files(tmp_path)
    expected = _zipfile_bytes(files, tmp_path / "zipfile.zip")
    assert zip_writer._zip_in_memory(files) is not None   # the fast path is the one compared
    assert zip_writer.make_zip(files, tmp_path / "memory.zip").read_bytes() == expected
    monkeypatch.setattr(zip_writer, "ZIP_IN_MEMORY", 70_000)   # too large to hold: zipfile, to disk
    assert zip_writer._zip_in_memory(files) is None
    assert zip_writer.make_zip(files, tmp_path / "disk.zip").read_bytes() == expected
    with zipfile.ZipFile(tmp_path / "memory.zip") as zf:
        assert zf.testzip() is None and zf.namelist() == [rel for _, rel in files]
        assert zf.getinfo("n.txt").compress_type == zipfile.ZIP_DEFLATED
        assert {zf.getinfo(rel).compress_type for rel in ("a.JPEG", "sub/b.png", "é/ü.jpeg", "c.PARQUET",
                                                          ".hidden.jpg")} == {zipfile.ZIP_STORED}
        assert {zf.getinfo(rel).compress_type for rel in ("..jpg", "d.x/plain")} == {zipfile.ZIP_DEFLATED}
        assert zf.getinfo("sub/b.png").date_time != zf.getinfo("e.jpg").date_time
        assert zf.read("r.bin") == files[4][0].read_bytes() and zf.getinfo("r.bin").external_attr >> 16 == 0o100755


def test_an_empty_archive_and_a_time_zip_cannot_hold_are_zipfiles_too(tmp_path):
    assert zip_writer.make_zip([], tmp_path / "empty.zip").read_bytes() == _zipfile_bytes([], tmp_path / "z.zip")
    old = tmp_path / "old.jpg"
    old.write_bytes(b"x")
    os.utime(old, (0, 0))   # 1970: zipfile's own error, not a wrong date
    with pytest.raises(ValueError, match="1980"):
        zip_writer.make_zip([(old, "old.jpg")], tmp_path / "old.zip")
