"""A pin per category on a real local board, slices fetched back in parallel, converted to board pins."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pinstorm import boards
from pinstorm.pipeline import convert, dataset_info, imagenet_partition, make_dataset, repartition

pytest_plugins = ["conftest_pipeline"]


@pytest.fixture
def imagenet_board(tmp_path, digits_root):
    board = boards.board_register("local", name="imagenet", path=tmp_path / "imagenet-board")
    categories = repartition(digits_root, "imagenet", parallel=3, progress=False)
    return board, categories


def test_every_category_is_its_own_zipped_pin(imagenet_board, digits_layout):
    board, categories = imagenet_board
    counts = digits_layout.counts("train")
    assert list(categories.columns) == ["id", "name", "images"]
    assert categories["id"].tolist() == digits_layout.classes
    assert dict(zip(categories["id"], categories["images"])) == counts
    assert categories["name"].iloc[2].startswith("digit two")
    pd.testing.assert_frame_equal(boards.pin_get("categories", board="imagenet"), categories)
    found = boards.pin_find(board="imagenet")
    assert set(found["name"]) == {"categories", *digits_layout.classes}

    wnid = digits_layout.classes[3]
    stored = boards.pin_get(wnid, board="imagenet", files=True, extract=False)
    assert len(stored) == 1 and stored[0].endswith(".zip")   # one object per category
    extracted = boards.pin_get(wnid, board="imagenet", extract=True)
    source = {Path(p).name: p for p, w in digits_layout.train if w == wnid}
    assert {Path(p).name for p in extracted} == set(source)
    assert all(Path(p).read_bytes() == Path(source[Path(p).name]).read_bytes() for p in extracted)


def test_partitions_cover_every_category_once(imagenet_board, digits_layout):
    slices = [imagenet_partition(p, 3, "imagenet", parallel=2) for p in range(3)]
    assert [len(s["categories"]) for s in slices] == [3, 3, 4]
    assert sum((s["categories"] for s in slices), []) == digits_layout.classes
    truth = {Path(p).name: w for p, w in digits_layout.train}
    for data in slices:
        assert data["classes"] == digits_layout.classes
        assert len(data["image"]) == len(data["category"]) == sum(digits_layout.counts()[w] for w in data["categories"])
        assert all(Path(p).is_file() and truth[Path(p).name] == w for p, w in zip(data["image"], data["category"]))
        assert data["names"][data["categories"][0]].startswith("digit")
    with pytest.raises(ValueError, match="0-based"):
        imagenet_partition(3, 3, "imagenet")
    with pytest.raises(ValueError, match="leave some empty"):
        imagenet_partition(0, 11, "imagenet")


def test_slices_converted_to_board_pins_keep_global_labels(imagenet_board, digits_layout):
    pytest.importorskip("tensorflow")
    total = 0
    for p in range(2):
        result = convert(imagenet_partition(p, 2, "imagenet"), f"board://imagenet/train-{p}", progress=False)
        info = dataset_info(f"board://imagenet/train-{p}")
        assert info["rows"] == result.rows and info["classes"] == digits_layout.classes
        labels = [int(v) for _, y in make_dataset(f"board://imagenet/train-{p}", batch_size=64, image_size=(16, 16),
                                                  training=False, shuffle=False) for v in y.numpy()]
        assert len(labels) == result.rows
        assert set(labels) == {digits_layout.classes.index(w) for w in imagenet_partition(p, 2, "imagenet")["categories"]}
        total += result.rows
    assert total == len(digits_layout.train) - 2   # the truncated and the empty file are skipped
    assert "pinstorm dataset" in boards.pin_info("train-0", board="imagenet").get("description", "")


def test_unzipped_pins_and_a_missing_categories_pin(tmp_path, digits_layout):
    boards.board_register("local", name="plain", path=tmp_path / "plain-board")
    wnids = digits_layout.classes[:2]
    folder = tmp_path / "two"
    for path, wnid in digits_layout.train:
        if wnid in wnids:
            (folder / wnid).mkdir(parents=True, exist_ok=True)
            (folder / wnid / Path(path).name).write_bytes(Path(path).read_bytes())
    repartition(folder, "plain", zip=False, parallel=1, progress=False)
    assert all(not p.endswith(".zip") for p in boards.pin_get(wnids[0], board="plain"))
    assert imagenet_partition(0, 1, "plain")["categories"] == wnids
    boards.board_register("local", name="empty", path=tmp_path / "empty-board")
    with pytest.raises(boards.PinNotFound):
        imagenet_partition(0, 1, "empty")
