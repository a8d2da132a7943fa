"""Large files: an interrupted download resumes where it stopped (HTTP, S3) and is verified once; a
download or extraction that cannot fit says so before it starts; pinning writes the bytes once.

Kaggle's resume is tested with the other Kaggle cases (tests/test_boards_kaggle.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards.errors import DiskFull, DownloadError
from servers import faults, s3
from disk_support import small_disk  # noqa: F401 - fixture

s3_server = pytest.fixture(scope="module", name="s3_server")(s3.serve)


def _partials(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*.partial")]


def test_an_interrupted_http_download_resumes_from_where_it_stopped(tmp_path):
    board = boards.board_register("local", name="src", path=tmp_path / "board")
    data = os.urandom(3 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    board.pin(tmp_path / "big.bin", "big")
    cache = tmp_path / "cache"
    with boards.serve_board(tmp_path / "board") as url, faults.FaultProxy(url) as proxy:
        proxy.truncate(r"/big\.bin$", times=1)  # the connection drops halfway through the file
        web = boards.board_register("datatxt", name="web", url=proxy.endpoint, cache=cache)
        with pytest.raises(DownloadError, match="big"):
            web.pin_get("big")
        [partial] = _partials(cache)  # kept, hidden: never served as a version
        have = (partial / "big.bin").stat().st_size
        assert 0 < have < len(data)
        got = web.pin_get("big")
        assert Path(got[0]).read_bytes() == data  # verified end to end
        file_gets = [r for p, r in proxy.ranges if p.endswith("/big.bin")]
        assert file_gets == [None, f"bytes={have}-"]  # only the missing bytes travelled again
    assert _partials(cache) == []


def test_a_resume_onto_damaged_bytes_starts_over_once(tmp_path):
    board = boards.board_register("local", name="src", path=tmp_path / "board")
    data = os.urandom(1 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    board.pin(tmp_path / "big.bin", "big")
    cache = tmp_path / "cache"
    with boards.serve_board(tmp_path / "board") as url, faults.FaultProxy(url) as proxy:
        proxy.truncate(r"/big\.bin$", times=1)
        web = boards.board_register("datatxt", name="web", url=proxy.endpoint, cache=cache)
        with pytest.raises(DownloadError):
            web.pin_get("big")
        [partial] = _partials(cache)
        with open(partial / "big.bin", "r+b") as f:  # the kept prefix rotted on disk
            f.write(b"\0" * 16)
        assert Path(web.pin_get("big")[0]).read_bytes() == data
        file_gets = [r for p, r in proxy.ranges if p.endswith("/big.bin")]
        assert file_gets[-1] is None  # the resumed copy failed its hash: fetched whole again
    assert _partials(cache) == []


# Dies (SIGKILL) with part of the file written, as a killed process or a lost machine would.
KILLED_DOWNLOAD = textwrap.dedent("""
    import json, os, signal, sys
    from pinstorm import boards
    from pinstorm.boards.backends.fs_board import FsStorage
    options = json.loads(sys.argv[1])
    board = boards.board_register(options.pop("kind"), name="bucket", **options)
    def first_bytes_then_die(self, name, version, file, dest, offset=0):
        with self.fs.open(self._path(name, version, file), "rb") as src, open(dest, "wb") as out:
            out.write(src.read(int(sys.argv[2])))
            out.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    FsStorage.download_file = first_bytes_then_die
    board.pin_get("big")
""")


def test_a_bucket_download_killed_midway_resumes_with_a_ranged_read(s3_server, tmp_path, monkeypatch):
    bucket = f"resume-{uuid.uuid4().hex[:8]}"
    writer = boards.board_register("s3", name="w", bucket=bucket, create_bucket=True, cache=tmp_path / "w",
                                   **s3_server.storage_options())
    data = os.urandom(6 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    writer.pin(tmp_path / "big.bin", "big")
    cache = tmp_path / "cache"
    with faults.FaultProxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.KEY)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.SECRET)
        options = {"kind": "s3", "bucket": bucket, "endpoint_url": proxy.endpoint, "cache": str(cache)}
        r = subprocess.run([sys.executable, "-c", KILLED_DOWNLOAD, json.dumps(options), str(2 << 20)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == -9, r.stderr
        [partial] = _partials(cache)
        assert (partial / "big.bin").stat().st_size == 2 << 20
        proxy.ranges.clear()
        board = boards.board_register("s3", name="bucket", bucket=bucket, cache=cache,
                                      **s3_server.storage_options(proxy.endpoint))
        assert Path(board.pin_get("big")[0]).read_bytes() == data
        starts = [int(r.split("=")[1].split("-")[0]) for p, r in proxy.ranges if p.endswith("/big.bin") and r]
        assert starts and min(starts) == 2 << 20  # nothing before the cut was fetched again
    assert _partials(cache) == []


def test_a_download_that_cannot_fit_says_so_before_it_starts(tmp_path, small_disk):
    board = boards.board_register("local", name="src", path=tmp_path / "board")
    (tmp_path / "big.bin").write_bytes(os.urandom(3 << 20))
    board.pin(tmp_path / "big.bin", "big")
    cache = small_disk(tmp_path / "small", "2m")
    with boards.serve_board(tmp_path / "board") as url, faults.FaultProxy(url) as proxy:
        web = boards.board_register("datatxt", name="web", url=proxy.endpoint, cache=cache)
        with pytest.raises(DiskFull) as info:
            web.pin_get("big")
        message = str(info.value)
        assert "pin 'big'" in message and str(cache) in message and f"{3 << 20:,}" in message
        assert not [p for p, _ in proxy.ranges if p.endswith("/big.bin")]  # not one byte was asked for
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]


def test_an_extraction_that_cannot_fit_says_so_before_it_starts(tmp_path, small_disk):
    from pinstorm.boards.safety import archive

    src = tmp_path / "a.zip"
    with zipfile.ZipFile(src, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * (8 << 20))  # 8 MiB that compress to a few KB
    disk = small_disk(tmp_path / "small", "4m")
    with pytest.raises(DiskFull, match=f"extracting a.zip needs {8 << 20:,} bytes"):
        archive.extract(src, disk / "out")
    assert list(disk.iterdir()) == []


def test_pinning_a_large_file_stages_nothing_in_tmpdir(tmp_path, monkeypatch):
    """A local board assembles the version on itself: TMPDIR stays empty, the bytes are written once."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    data = os.urandom(2 << 20)
    (tmp_path / "big.bin").write_bytes(data)
    board = boards.board_register("local", name="b", path=tmp_path / "board")
    seen = []
    real = os.replace

    def watching_replace(src, dst, *args, **kwargs):  # what is in TMPDIR when the version goes live
        seen.append(sum(p.stat().st_size for p in tmpdir.rglob("*") if p.is_file()))
        return real(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", watching_replace)
    [path] = board.pin(tmp_path / "big.bin", "big")
    assert Path(path).read_bytes() == data and seen and max(seen) == 0
    (tmp_path / "big.bin").write_bytes(b"edited later")  # a copy, never a link: the pin keeps its bytes
    assert Path(board.pin_get("big")[0]).read_bytes() == data
