"""Scanning image trees: the ILSVRC layout with its label files, split folders, plain class folders."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from pinstorm.pipeline import LayoutError, scan
from pinstorm.pipeline.samples import DIGIT_NAMES, digit_wnid, digits_quirks
from pipeline_support import PER_CLASS

pytest_plugins = ["conftest_pipeline"]


def test_ilsvrc_layout_train_val_labels_and_names(digits_root, digits_layout):
    layout = digits_layout
    assert layout.kind == "ilsvrc"
    assert layout.classes == [digit_wnid(d) for d in range(10)]
    assert layout.names[digit_wnid(3)].startswith("digit three")
    n_val = round(PER_CLASS * 0.2)
    # every class: PER_CLASS - n_val digits, plus one quirk file in classes 1..5
    expected_train = {digit_wnid(d): PER_CLASS - n_val + (1 <= d <= 5) for d in range(10)}
    assert layout.counts("train") == expected_train
    assert layout.counts("val") == {digit_wnid(d): n_val for d in range(10)}
    # train labels come from the folder; val labels from LOC_val_solution.csv, not the file order
    assert all(Path(p).parent.name == wnid for p, wnid in layout.train)
    solution = dict(line.split(",", 1) for line in (digits_root / "LOC_val_solution.csv").read_text().splitlines()[1:])
    for path, wnid in layout.val:
        assert solution[Path(path).stem].split()[0] == wnid
    assert len({wnid for _, wnid in layout.val[:10]}) > 1
    assert set(digits_quirks(digits_root).values()) <= {Path(p) for p, _ in layout.train}


@pytest.mark.parametrize("sub", ["ILSVRC", "ILSVRC/Data/CLS-LOC"])
def test_ilsvrc_layout_found_from_inner_folders(digits_root, sub):
    layout = scan(digits_root / sub)
    assert layout.kind == "ilsvrc"
    assert len(layout.val) == 10 * round(PER_CLASS * 0.2)  # label files found next to the ILSVRC folder
    assert layout.names[digit_wnid(0)] == f"digit {DIGIT_NAMES[0]}, handwritten {DIGIT_NAMES[0]}"


def test_val_images_without_solution_file_are_unlabelled_not_guessed(digits_root, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(digits_root / "ILSVRC", tree / "ILSVRC")
    layout = scan(tree)
    assert layout.val == [] and len(layout.unlabelled) == 10 * round(PER_CLASS * 0.2)
    assert set(layout.names.values()) == set(layout.classes)  # no mapping file: names are the wnids
    with pytest.raises(LayoutError, match="no labelled val images.*LOC_val_solution.csv"):
        layout.items("val")


def test_plain_and_split_class_folders(tmp_path, digits_layout):
    plain = tmp_path / "plain"
    for path, wnid in digits_layout.train[:60]:
        (plain / wnid).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, plain / wnid)
    (plain / "n00000000" / "notes.txt").write_text("not an image")
    (plain / ".hidden").mkdir()
    layout = scan(plain)
    assert layout.kind == "folders" and layout.val == []
    assert Counter(w for _, w in layout.train) == Counter(w for _, w in digits_layout.train[:60])

    split = tmp_path / "split"
    shutil.copytree(plain, split / "train")
    shutil.copytree(plain / "n00000000", split / "val" / "n00000000")
    layout = scan(split)
    assert layout.kind == "split-folders"
    assert len(layout.train) == 60 and {w for _, w in layout.val} == {"n00000000"}


def test_bad_trees_raise_clear_errors(tmp_path, digits_root):
    with pytest.raises(LayoutError, match="not a folder"):
        scan(tmp_path / "missing")
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(LayoutError, match="no images found"):
        scan(tmp_path / "empty")

    tree = tmp_path / "tree"
    shutil.copytree(digits_root / "ILSVRC", tree / "ILSVRC")
    (tree / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n99999999 1 2 3 4\n")
    with pytest.raises(LayoutError, match="n99999999"):
        scan(tree)
    (tree / "LOC_val_solution.csv").write_text("Id,Label\nx,y\n")
    with pytest.raises(LayoutError, match="ImageId,PredictionString"):
        scan(tree)
