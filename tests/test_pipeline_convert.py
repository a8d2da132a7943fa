"""Converting to Parquet in petastorm's format: rows, labels, quirks, layout of row groups, atomicity."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pinstorm.pipeline import (DatasetExistsError, IncompleteDatasetError, convert, dataset_info, digits_quirks, scan)
from pinstorm.pipeline.metadata import COMMON_METADATA, PROGRESS, REPORT
from pipeline_support import read_rows

pytest_plugins = ["conftest_pipeline"]


def _petastorm_quiet():
    warnings.filterwarnings("ignore", module=r"petastorm(\.|$)")
    warnings.filterwarnings("ignore", category=FutureWarning)


def test_rows_labels_bytes_and_report(digits_root, digits_layout, digits_dataset):
    url, result = digits_dataset
    quirks = digits_quirks(digits_root)
    assert result.rows == len(digits_layout.train) - 2
    skipped = {s["path"]: s["reason"] for s in result.skipped}
    assert set(skipped) == {str(quirks["truncated"]), str(quirks["empty"])}
    assert "truncated" in skipped[str(quirks["truncated"])] and skipped[str(quirks["empty"])] == "empty file"
    assert {r["path"]: r["mode"] for r in result.reencoded} == {
        str(quirks["cmyk"]): "CMYK", str(quirks["grayscale"]): "L", str(quirks["png"]): "RGB"}
    report = json.loads((Path(url) / REPORT).read_text())
    assert report["skipped"] == result.skipped and report["reencoded"] == result.reencoded
    # what each re-encode changed is a flag on its entry, not something to search the reason for
    assert all(r["resized"] is False and r["reoriented"] is False for r in result.reencoded)
    assert result.resized == result.reoriented == 0

    table = pq.ParquetDataset(url).read()   # plain Parquet: pyarrow reads it without petastorm
    assert table.num_rows == result.rows
    source = {Path(p).name: p for p, _ in digits_layout.train}
    reencoded = {Path(r["path"]).name for r in result.reencoded}
    for row in table.to_pylist():
        assert row["label"] == digits_layout.classes.index(row["wnid"])
        assert Path(source[row["filename"]]).parent.name == row["wnid"]
        original = Path(source[row["filename"]]).read_bytes()
        if row["filename"] in reencoded:
            assert row["image"] != original and row["image"][:2] == b"\xff\xd8"
        else:
            assert row["image"] == original   # stored as it was: no re-encoding of normal JPEGs
    assert len(set(table.column("filename").to_pylist())) == result.rows

    info = dataset_info(url)
    assert info["rows"] == result.rows and info["num_classes"] == 10
    assert info["classes"] == digits_layout.classes
    assert info["names"]["n00000004"].startswith("digit four")
    assert info["partitions"] == 2 and info["row_groups"] == 8 == len(info["row_group_rows"])
    assert info["bytes"] == sum(p.stat().st_size for p in Path(url).glob("part-*.parquet"))
    assert info["class_rows"] == [Counter(table.column("label").to_pylist())[i] for i in range(10)]
    assert info["skipped"] == 2 and info["reencoded"] == 3


def test_petastorm_make_reader_decodes_every_row_to_rgb(digits_dataset, digits_root):
    pytest.importorskip("petastorm")
    from petastorm import make_batch_reader, make_reader

    _petastorm_quiet()
    url, result = digits_dataset
    quirk_names = {p.name: kind for kind, p in digits_quirks(digits_root).items()}
    seen = Counter()
    with make_reader("file://" + url, reader_pool_type="dummy", shuffle_row_groups=False) as reader:
        for row in reader:
            assert row.image.dtype == np.uint8 and row.image.ndim == 3 and row.image.shape[2] == 3
            assert row.image.shape[:2] == (row.height, row.width)
            seen[quirk_names.get(row.filename, "normal")] += 1
            if quirk_names.get(row.filename) == "grayscale":
                assert np.abs(row.image[..., 0].astype(int) - row.image[..., 2]).max() <= 2
    assert seen == {"normal": result.rows - 3, "cmyk": 1, "grayscale": 1, "png": 1}

    stored = pq.ParquetDataset(url).read(columns=["image"]).column("image").to_pylist()
    with make_batch_reader("file://" + url, schema_fields=["image", "label"], reader_pool_type="dummy") as reader:
        batches = list(reader)
    images = [bytes(b) for batch in batches for b in batch.image]
    assert all(isinstance(b, bytes) for batch in batches for b in batch.image)
    assert sorted(images) == sorted(stored)


def test_row_groups_mix_classes_and_partitions_are_balanced(digits_dataset):
    url, result = digits_dataset
    parts = sorted(Path(url).glob("part-*.parquet"))
    assert [p.name for p in parts] == ["part-00000.parquet", "part-00001.parquet"]
    rows_per_part = []
    for part in parts:
        handle = pq.ParquetFile(part)
        assert handle.num_row_groups == 4
        rows_per_part.append(handle.metadata.num_rows)
        for g in range(handle.num_row_groups):
            labels = handle.read_row_group(g, columns=["label"]).column("label").to_pylist()
            assert len(set(labels)) >= 8, labels   # ~40 rows drawn from 10 classes
    assert abs(rows_per_part[0] - rows_per_part[1]) <= 1 + len(result.skipped)
    assert sum(rows_per_part) == result.rows


def test_labels_agree_across_train_and_val(digits_layout, digits_val_dataset):
    url, result = digits_val_dataset
    assert result.rows == len(digits_layout.val) and not result.skipped
    assert dataset_info(url)["classes"] == digits_layout.classes
    truth = {Path(p).name: digits_layout.classes.index(w) for p, w in digits_layout.val}
    assert {r["filename"]: r["label"] for r in read_rows(url)} == truth


def _data_map(layout, n, categories=None):
    items = [(p, w) for p, w in layout.train if "_9000" not in p][:n]
    data = {"image": [p for p, _ in items], "category": [w for _, w in items]}
    if categories is not None:
        data["categories"] = categories
    return data


def test_shuffle_is_seeded_and_sources_are_interchangeable(digits_layout, tmp_path):
    data = _data_map(digits_layout, 90)
    a = convert(data, tmp_path / "a", seed=5, progress=False)
    b = convert(data, tmp_path / "b", seed=5, progress=False)
    c = convert(data, tmp_path / "c", seed=6, progress=False)
    order = lambda url: [r["filename"] for r in read_rows(url)]  # noqa: E731
    assert order(tmp_path / "a") == order(tmp_path / "b") != order(tmp_path / "c")
    assert sorted(order(tmp_path / "a")) == sorted(order(tmp_path / "c"))
    assert a.classes == sorted(set(data["category"])) and c.rows == b.rows == 90

    # a slice of categories keeps global labels when the map carries every class (imagenet_partition does)
    mine = sorted(set(data["category"]))[-2:]
    subset = {"image": [p for p, w in zip(data["image"], data["category"]) if w in mine],
              "category": [w for w in data["category"] if w in mine], "categories": mine,
              "classes": digits_layout.classes}
    convert(subset, tmp_path / "slice", progress=False)
    assert {r["label"] for r in read_rows(tmp_path / "slice")} == {digits_layout.classes.index(w) for w in mine}

    with pytest.raises(ValueError, match="missing from `classes`"):
        convert(data, tmp_path / "d", classes=digits_layout.classes[:1], progress=False)
    with pytest.raises(ValueError, match="cannot fill"):
        convert(_data_map(digits_layout, 2), tmp_path / "e", partitions=3, progress=False)
    with pytest.raises(TypeError, match="Layout, a data map or a folder"):
        convert(42, tmp_path / "f")


def test_interrupted_conversion_is_never_complete_and_resumes(digits_layout, tmp_path):
    data = _data_map(digits_layout, 120)
    clean = tmp_path / "clean"
    convert(data, clean, partitions=3, progress=False)
    out = tmp_path / "out"

    def stop_after_first(name, entry):
        raise KeyboardInterrupt(f"interrupted after {name}")

    with pytest.raises(KeyboardInterrupt):
        convert(data, out, partitions=3, progress=False, on_part=stop_after_first)
    assert not (out / COMMON_METADATA).exists() and (out / PROGRESS).exists()
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00000.parquet"]
    with pytest.raises(IncompleteDatasetError, match="interrupted"):
        dataset_info(out)

    resumed = convert(data, out, partitions=3, progress=False)
    assert resumed.parts_reused == 1 and resumed.images_read == 80
    assert read_rows(out) == read_rows(clean)
    assert dataset_info(out)["rows"] == 120 and not (out / PROGRESS).exists()

    again = convert(data, out, partitions=3, progress=False)   # finished, same inputs: nothing to do
    assert again.images_read == 0 and again.rows == 120


def test_interrupted_then_other_inputs_rebuilds(digits_layout, tmp_path):
    data = _data_map(digits_layout, 60)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        convert(data, out, partitions=2, progress=False, on_part=lambda n, e: (_ for _ in ()).throw(RuntimeError()))
    rebuilt = convert(data, out, partitions=2, seed=9, progress=False)
    assert rebuilt.parts_reused == 0 and rebuilt.rows == 60 and dataset_info(out)["seed"] == 9


def test_existing_outputs_are_never_clobbered_silently(digits_layout, tmp_path):
    data = _data_map(digits_layout, 40)
    out = tmp_path / "out"
    convert(data, out, progress=False)
    with pytest.raises(DatasetExistsError, match="overwrite"):
        convert(data, out, seed=1, progress=False)
    assert dataset_info(out)["seed"] == 0
    assert convert(data, out, seed=1, overwrite=True, progress=False).images_read == 40
    assert dataset_info(out)["seed"] == 1

    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(DatasetExistsError, match="did not write"):
        convert(data, foreign, progress=False)
    assert (foreign / "thesis.tex").read_text() == "precious"


def test_folder_source_and_s3_output(digits_root, tmp_path):
    """A folder path as source; an s3:// URL (moto on 127.0.0.1) as output, read back by every reader."""
    import importlib.util

    import s3fs
    from servers.s3 import S3Server

    from pinstorm.pipeline import make_dataset, verify_dataset
    from pinstorm.pipeline.storage import petastorm_filesystem, resolve

    pytest.importorskip("tensorflow")
    has_petastorm = importlib.util.find_spec("petastorm") is not None
    _petastorm_quiet()
    with S3Server() as server:
        options = server.storage_options()
        s3fs.S3FileSystem(**options).mkdir("bucket")
        result = convert(digits_root, "s3://bucket/digits/val", split="val", storage_options=options,
                         min_row_groups=4, progress=False)
        assert result.rows == len(scan(digits_root).val)
        info = dataset_info("s3://bucket/digits/val", storage_options=options)
        assert info["rows"] == result.rows and info["row_groups"] == 4
        assert verify_dataset("s3://bucket/digits/val", storage_options=options)["rows"] == result.rows
        for engine in ("petastorm", "pyarrow") if has_petastorm else ("pyarrow",):
            dataset = make_dataset("s3://bucket/digits/val", batch_size=64, image_size=(32, 32), engine=engine,
                                   storage_options=options, training=False, shuffle=False)
            assert sum(int(y.shape[0]) for _, y in dataset) == result.rows
        if not has_petastorm:
            return
        from petastorm import make_reader

        location = resolve("s3://bucket/digits/val", options)
        with make_reader(location.url, filesystem=petastorm_filesystem(location), reader_pool_type="dummy") as rd:
            assert sum(1 for _ in rd) == result.rows


def test_a_tree_in_a_bucket_is_scanned_from_its_listing_with_no_local_stand_in(digits_root, tmp_path,
                                                                                monkeypatch):
    """`convert("s3://bucket/tree")` (moto): the tree is scanned from one fsspec listing, no placeholder file
    or folder made anywhere (no file created, the temporary folder left empty), only the label files read;
    the layout and the dataset are those of the same tree on disk."""
    import pathlib
    import tempfile

    import s3fs
    from servers.s3 import S3Server

    from pinstorm.pipeline.convert import scan_remote
    from pinstorm.pipeline.storage import resolve

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    made = []
    for method in ("touch", "mkdir", "write_bytes", "write_text"):
        original = getattr(pathlib.Path, method)
        monkeypatch.setattr(pathlib.Path, method, lambda self, *a, _o=original, _m=method, **k: (
            made.append((_m, str(self))), _o(self, *a, **k))[1])
    local = scan(digits_root)
    url = "s3://listed-trees/digits"
    with S3Server() as server:
        options = server.storage_options()
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("listed-trees")   # moto keeps buckets per process: a name of its own
        fs.put(str(digits_root) + "/", "listed-trees/digits", recursive=True)
        read = []
        listing_fs = resolve(url, options).fs           # fsspec's cached instance: the one scan_remote gets
        original_cat = listing_fs.cat_file
        monkeypatch.setattr(listing_fs, "cat_file", lambda path, *a, **k: (read.append(path),
                                                                            original_cat(path, *a, **k))[1])
        layout, sizes = scan_remote(url, options)
        assert made == [] and list((tmp_path / "tmp").iterdir()) == []       # no stand-in, here or anywhere
        assert sorted(p.rsplit("/", 1)[-1] for p in read) == ["LOC_synset_mapping.txt", "LOC_val_solution.csv"]
        monkeypatch.undo()
        remote = {split: convert(url, tmp_path / f"remote-{split}", split=split, storage_options=options,
                                 min_row_groups=4, progress=False) for split in ("train", "val")}
    shown = len(str(digits_root))
    assert str(layout.root) == url and layout.kind == local.kind and layout.classes == local.classes
    assert layout.names == local.names and layout.empty_classes == local.empty_classes
    assert layout.train == [(url + p[shown:], w) for p, w in local.train]
    assert layout.val == [(url + p[shown:], w) for p, w in local.val]
    assert layout.unlabelled == [url + p[shown:] for p in local.unlabelled]
    assert set(sizes) == {p for p, _ in layout.train + layout.val} | set(layout.unlabelled)
    for split, result in remote.items():
        on_disk = convert(local, tmp_path / f"local-{split}", split=split, min_row_groups=4, progress=False)
        assert result.classes == on_disk.classes and result.rows == on_disk.rows
        columns = ("label", "wnid", "filename", "image")
        assert read_rows(result.url.removeprefix("file://"), columns) == read_rows(on_disk.url.removeprefix(
            "file://"), columns)
        assert sorted(s["reason"] for s in result.skipped) == sorted(s["reason"] for s in on_disk.skipped)


def test_reencode_flags_are_counted_and_older_reports_still_count():
    from pinstorm.pipeline.convert import ConvertResult, count_flag, reencode_flags

    assert reencode_flags("downscaled from 900x600 (max_side 200)") == {"resized": True, "reoriented": False}
    assert reencode_flags("EXIF orientation 6") == {"resized": False, "reoriented": True}
    entries = [{"reason": "whatever the text says", "resized": True, "reoriented": False},   # flags win
               {"reason": "downscaled from 900x600 (max_side 200)"},      # a report written before the flags
               {"reason": "mode CMYK", "resized": False, "reoriented": False}]
    assert count_flag(entries, "resized") == 2 and count_flag(entries, "reoriented") == 0
    result = ConvertResult("file:///x", 3, 1, 1, 0, [], reencoded=entries)
    assert result.resized == 2 and result.reoriented == 0


def test_a_part_never_holds_more_row_groups_than_a_reader_accepts_in_a_footer():
    """ImageNet-21k at 32 MB row groups is ~45,000 of them: as one part, its footer (~0.5 KB a row group)
    would be over the 16 MiB readers accept. The plan writes more parts than asked instead (parts of at
    most 4,096 row groups, whose footers stay cheap to parse)."""
    from pinstorm.boards.safety.parquet_limits import DEFAULT_FOOTER_BYTES
    from pinstorm.pipeline.convert import MAX_PART_ROW_GROUPS, _plan

    assert MAX_PART_ROW_GROUPS * 600 < DEFAULT_FOOTER_BYTES / 4
    n = 2 * MAX_PART_ROW_GROUPS + 10
    items = [(f"/tree/n{i % 7}/{i}.JPEG", f"n{i % 7}") for i in range(n)]
    sizes = {path: 110_000 for path, _ in items}
    plan = _plan(items, sorted({w for _, w in items}), 1, 0.1, 16, 0, sizes=sizes)   # one image a row group
    assert plan.partitions == 3 and len(plan.bounds) % 3 == 0
    assert max(len(plan.part_groups(p)) for p in range(3)) <= MAX_PART_ROW_GROUPS
    assert sum(b - a for a, b in plan.bounds) == n
    few = _plan(items[:100], sorted({w for _, w in items}), 1, 32, 16, 0, sizes=sizes)
    assert few.partitions == 1   # as asked, when it fits
