"""The typed contracts between the layers: `DatasetInfo` (a dataset's info) and `DataMap` (images to
convert) are frozen dataclasses, still read as the mappings the user guide documents."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import pyarrow.parquet as pq
import pytest

from pinstorm.pipeline import (DataMap, DatasetInfo, InvalidPipelineInput, MalformedDatasetError, convert, dataset_info,
                               read_info)
from pinstorm.pipeline.metadata import COMMON_METADATA, PINSTORM_KEY, write_common_metadata
from pinstorm.pipeline.storage import resolve

pytest_plugins = ["conftest_pipeline"]


def _json(url) -> dict:
    return json.loads(pq.read_schema(f"{url}/{COMMON_METADATA}").metadata[PINSTORM_KEY])


def test_dataset_info_is_typed_and_equals_its_json(digits_dataset):
    url, result = digits_dataset
    raw = _json(url)
    info = read_info(resolve(url))
    assert isinstance(info, DatasetInfo)
    assert info == raw and dict(info) == raw and info.to_dict() == raw
    assert list(info) == list(raw) and len(info) == len(raw)
    assert info.rows == raw["rows"] == result.rows and info.num_classes == raw["num_classes"]
    assert info.row_group_rows == raw["row_group_rows"] and info.files == raw["files"]
    assert info.classes == raw["classes"] and info.split == "train" and info.seed == 0
    assert json.loads(json.dumps(dict(info))) == raw and json.loads(json.dumps(info.to_dict())) == raw

    full = dataset_info(url)
    assert full.url == full["url"] and "url" in full and "url" not in info
    assert full == {**raw, "url": full.url}
    # the documented mapping access
    assert full["rows"] == full.rows and full.get("no such key") is None and "files" in full
    assert full["classes"][:2] == raw["classes"][:2] and isinstance(full["classes"][:2], list)


def test_dataset_info_is_frozen_all_the_way_down(digits_dataset):
    info = dataset_info(digits_dataset[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.rows = 1   # type: ignore[misc]
    with pytest.raises(TypeError):
        info["rows"] = 1   # type: ignore[index]
    with pytest.raises(TypeError):
        info["classes"].append("n9")
    with pytest.raises(TypeError):
        info.files["part-00000.parquet"]["rows"] = 0   # type: ignore[index]
    with pytest.raises(TypeError):
        info["row_group_rows"][0] = 0
    with pytest.raises(AttributeError):
        info.rwos   # type: ignore[attr-defined]   # a typo is an attribute error, not a silent None
    # a plain copy to edit; the info itself is unchanged
    plain = info.to_dict()
    plain["files"]["part-00000.parquet"]["rows"] = 0
    assert info.files["part-00000.parquet"]["rows"] != 0
    # it travels to worker processes and copies as it is
    assert pickle.loads(pickle.dumps(info)) == info and copy.deepcopy(info) == info
    changed = info.with_changes(split="val")
    assert changed.split == "val" and info.split == "train" and changed["split"] == "val"


def test_an_older_info_keeps_only_its_own_keys():
    raw = {"rows": 3, "row_groups": 1, "row_group_rows": [3], "files": {"part-00000.parquet": {"row_groups": 1}},
           "classes": ["a"], "seed": None, "future_key": {"x": [1]}}
    info = DatasetInfo.from_dict(raw)
    assert dict(info) == raw and list(info) == list(raw)
    assert info.num_classes == 1 and "num_classes" not in info      # a field's default, not a key
    assert info.resized is None and info.get("resized") is None and "resized" not in info
    assert "seed" in info and info["seed"] is None
    assert info.extra == {"future_key": {"x": [1]}} and info["future_key"] == {"x": [1]}


@pytest.mark.parametrize("key, value, message", [
    ("rows", "3", "rows must be a count"),
    ("split", 3, "split must be a string"),
    ("resized", "many", "resized must be an integer"),
    ("empty_classes", [1], "empty_classes must be a list of strings"),
])
def test_a_malformed_info_is_refused_as_before(digits_dataset, tmp_path, key, value, message):
    import shutil

    url = tmp_path / "ds"
    shutil.copytree(digits_dataset[0], url)
    location = resolve(url)
    raw = read_info(location).to_dict()
    raw[key] = value
    write_common_metadata(location, raw, {n: e["row_groups"] for n, e in raw["files"].items()})
    with pytest.raises(MalformedDatasetError, match=message):
        dataset_info(url)


def test_data_map_is_frozen_and_read_as_a_mapping():
    data = DataMap(image=["a/1.jpg", "b/2.jpg"], category=["a", "b"], classes=["a", "b", "c"])
    assert data["image"] == ["a/1.jpg", "b/2.jpg"] and data.classes == ["a", "b", "c"]
    assert dict(data) == {"image": ["a/1.jpg", "b/2.jpg"], "category": ["a", "b"], "classes": ["a", "b", "c"]}
    assert "categories" not in data and data.get("names") is None and data.label_classes() == ["a", "b", "c"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.image = []   # type: ignore[misc]
    with pytest.raises(TypeError):
        data["image"].append("c/3.jpg")
    with pytest.raises(InvalidPipelineInput, match="2 images but 1 categories"):
        DataMap(image=["a", "b"], category=["a"])


def test_one_rule_recognises_a_data_map():
    plain = {"image": ["x.jpg"], "category": ["n1"], "categories": ["n1"]}
    assert DataMap.is_data_map(plain) and DataMap.from_source(plain) == plain
    made = DataMap.from_source(plain)
    assert DataMap.from_source(made) is made and made.categories == ["n1"]
    for other in ({"image": []}, "folder", ["x.jpg"], None):
        assert not DataMap.is_data_map(other) and DataMap.from_source(other) is None


def test_a_hand_built_dict_data_map_still_converts(digits_layout, tmp_path):
    items = digits_layout.items("train")[:24]
    plain = {"image": [p for p, _ in items], "category": [w for _, w in items], "classes": digits_layout.classes}
    a = convert(plain, tmp_path / "a", seed=0, progress=False)
    b = convert(DataMap(image=plain["image"], category=plain["category"], classes=digits_layout.classes),
                tmp_path / "b", seed=0, progress=False)
    assert a.rows == b.rows == 24
    info_a, info_b = dataset_info(tmp_path / "a"), dataset_info(tmp_path / "b")
    assert info_a.classes == info_b.classes == digits_layout.classes
    assert info_a.class_rows == info_b.class_rows
    with pytest.raises(InvalidPipelineInput, match="needs keys 'image' and 'category'"):
        convert({"image": plain["image"]}, tmp_path / "c", progress=False)
