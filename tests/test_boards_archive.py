"""Safe extraction: zip-slip, absolute paths, links out of the folder, damaged archives."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile

import pytest

from pinstorm.boards.safety.archive import extract
from pinstorm.boards.errors import UnsafeArchive


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)


def test_good_archives_extract_atomically(tmp_path):
    z = tmp_path / "ok.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("a/b.txt", "B")
    assert [p.name for p in extract(z, tmp_path / "out")] == ["b.txt"]
    t = tmp_path / "ok.tar.gz"
    info = tarfile.TarInfo("x.txt")
    info.size = 1
    _tar(t, [(info, b"X")])
    assert (extract(t, tmp_path / "out2")[0]).read_text() == "X"
    g = tmp_path / "single.csv.gz"
    g.write_bytes(gzip.compress(b"a,b\n"))
    assert extract(g, tmp_path / "out3")[0].name == "single.csv"


@pytest.mark.parametrize("member", ["../evil.txt", "/etc/evil.txt", "a/../../evil.txt"])
def test_zip_slip_refused(tmp_path, member):
    z = tmp_path / "bad.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("fine.txt", "ok")
        zf.writestr(member, "pwned")
    with pytest.raises(UnsafeArchive, match="evil"):
        extract(z, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "evil.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]  # no half-extracted folder left


def test_tar_symlink_out_refused(tmp_path):
    t = tmp_path / "link.tar.gz"
    link = tarfile.TarInfo("innocent")
    link.type = tarfile.SYMTYPE
    link.linkname = "../../../etc/passwd"
    _tar(t, [(link, None)])
    with pytest.raises(UnsafeArchive, match="outside"):
        extract(t, tmp_path / "out")


def test_zip_symlink_refused(tmp_path):
    z = tmp_path / "zlink.zip"
    with zipfile.ZipFile(z, "w") as zf:
        info = zipfile.ZipInfo("link")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchive, match="symbolic link"):
        extract(z, tmp_path / "out")


def test_damaged_archive_is_clear(tmp_path):
    z = tmp_path / "broken.zip"
    z.write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(UnsafeArchive, match="damaged"):
        extract(z, tmp_path / "out")


def test_tar_links_chained_out_of_the_folder_are_refused(tmp_path):
    t = tmp_path / "chain.tar"
    with tarfile.open(t, "w") as tf:
        for name, target in [("l2", "."), ("l1", "l2/..")]:  # each looks harmless on its own
            link = tarfile.TarInfo(name)
            link.type = tarfile.SYMTYPE
            link.linkname = target
            tf.addfile(link)
        evil = tarfile.TarInfo("l1/evil.txt")
        evil.size = 5
        tf.addfile(evil, io.BytesIO(b"pwned"))
    with pytest.raises(UnsafeArchive, match="outside"):
        extract(t, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.tar"]


def test_tar_members_stream_in_one_pass_with_modes(tmp_path):
    t = tmp_path / "tool.tar.gz"
    script = tarfile.TarInfo("bin/run.sh")
    script.size, script.mode = 9, 0o755
    data = tarfile.TarInfo("data/x.csv")
    data.size = 4
    _tar(t, [(script, b"#!/bin/sh"), (data, b"a,b\n")])
    files = {p.relative_to(tmp_path / "out").as_posix(): p for p in extract(t, tmp_path / "out")}
    assert sorted(files) == ["bin/run.sh", "data/x.csv"]
    assert files["bin/run.sh"].stat().st_mode & 0o111 and not files["data/x.csv"].stat().st_mode & 0o111
