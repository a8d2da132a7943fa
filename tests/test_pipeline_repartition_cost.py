"""What made `repartition` ~30x slower than `tar` (issue 36), kept away: no read-back of each pin into the
cache (bench/bench_repartition.py), and JPEGs zipped as they are."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from pinstorm import boards
from pinstorm.boards import zip_writer
from pinstorm.boards.safety import archive
from pinstorm.boards.backends.fs_board import FsStorage
from pinstorm.pipeline import imagenet_partition, repartition
from pinstorm.pipeline.repartition import CATEGORIES_PIN

pytest_plugins = ["conftest_pipeline"]


def test_a_zip_stores_compressed_files_as_they_are_and_deflates_the_rest(tmp_path):
    files = []
    for rel, data in [("a.JPEG", os.urandom(3000)), ("sub/b.png", b"png" * 50), ("é.jpg", b""), ("c.parquet", b"x"),
                      ("n.txt", b"text " * 200)]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
        files.append((tmp_path / rel, rel))
    zip_writer.make_zip(files, tmp_path / "mixed.zip")
    with zipfile.ZipFile(tmp_path / "mixed.zip") as zf:
        assert zf.testzip() is None
        assert zf.getinfo("n.txt").compress_type == zipfile.ZIP_DEFLATED
        assert {zf.getinfo(rel).compress_type for rel in ("a.JPEG", "sub/b.png", "é.jpg", "c.parquet")} == {
            zipfile.ZIP_STORED}
    out = archive.extract(tmp_path / "mixed.zip", tmp_path / "out")
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in out) == sorted(rel for _, rel in files)


def test_repartition_does_not_read_its_pins_back_into_the_cache(tmp_path, digits_root, digits_layout):
    board = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache", name="cost")
    categories = repartition(digits_root, board, progress=False)
    assert categories["id"].tolist() == digits_layout.classes
    # a pin() per category used to unpack every zip into the cache (3/4 of the time at 1,000 categories)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix.lower() in (".png", ".jpeg",
                                                                                                   ".jpg", ".zip")]
    data = imagenet_partition(0, 1, board)   # still read as before
    assert len(data["image"]) == len(digits_layout.train) and all(Path(p).is_file() for p in data["image"])


@pytest.mark.parametrize("parallel", [1, 2])   # threads, worker processes
def test_repartition_indexes_the_board_once_with_the_categories_pin(tmp_path, digits_root, digits_layout, monkeypatch,
                                                                     parallel):
    board = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache", name="once")
    updates = []
    real = FsStorage._update_index

    def counted(self, *args, **kwargs):
        updates.append(sorted(kwargs.get("known") or []))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(FsStorage, "_update_index", counted)
    repartition(digits_root, board, parallel=parallel, progress=False)
    # the categories pin used to be written after the batch: a second reconcile of the whole board
    # (64 ms at 1,000 pins, 1.3 s at 21,841)
    assert updates == [sorted([CATEGORIES_PIN, *digits_layout.classes])]
    assert set(boards.board_folder(tmp_path / "board", name="again").pin_find("")["name"]) == {
        CATEGORIES_PIN, *digits_layout.classes}


def test_store_returns_the_version_and_keeps_an_identical_one(tmp_path):
    board = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache", name="s")
    (tmp_path / "x.jpg").write_bytes(b"\xff\xd8" + os.urandom(100))
    version = board.store([tmp_path / "x.jpg"], "x", zip=True, metadata={"k": 1})
    assert board.pin_versions("x", as_df=False)[-1].version == version
    assert board.store([tmp_path / "x.jpg"], "x", zip=True, metadata={"k": 1}) == version   # same bytes: kept
    assert [Path(p).name for p in board.pin_get("x")] == ["x.jpg"]
