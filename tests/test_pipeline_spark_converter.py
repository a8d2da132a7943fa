"""Datasets written by Spark executors (`pipeline.spark_converter`), on one `local[2, 4]` session (two
slots, a task retried up to 4 times): `make_spark_converter(df)` (pinstorm's format, checks and
checksums, reuse of the same DataFrame's dataset, delete and exit cleanup, tf.data and torch
readers), and `convert(..., spark=session)`: the very dataset a one-machine `convert` writes, also
when a task's Python worker is killed mid-part. The standalone-cluster case is last (one
SparkContext per process at a time)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from extras_support import needs

pytestmark = [needs("spark"), pytest.mark.slow]

pyspark = pytest.importorskip("pyspark")

from pinstorm.pipeline import (CorruptPartError, SparkConverterError, convert, dataset_info,  # noqa: E402
                               make_digits_tree, make_spark_converter, scan, verify_dataset)
from pinstorm.pipeline import spark_converter  # noqa: E402
from pinstorm.pipeline.metadata import read_info  # noqa: E402
from pinstorm.pipeline.storage import resolve  # noqa: E402


def _jpeg(value: int, size: int = 24) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), (value * 20 % 256, 90, 200)).save(out, "JPEG")
    return out.getvalue()


def _png(value: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("L", (20, 20), value).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def spark():
    from pinstorm.training.spark_session import spark_session

    session = spark_session("local[2,4]", app_name="pinstorm-convert-tests",
                            conf={"spark.python.worker.reuse": "true", "spark.default.parallelism": "2"})
    yield session
    session.stop()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = make_digits_tree(tmp_path_factory.mktemp("spark-tree") / "digits", image_size=32, per_class=12,
                            quirks=True, seed=3)
    return root


def _dataframe(spark, rows, partitions=2):
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("image", BinaryType()), StructField("label", LongType()),
                         StructField("name", StringType())])
    return spark.createDataFrame(rows, schema).repartition(partitions)


def _rows(location_url) -> list[tuple]:
    import pyarrow.parquet as pq

    location = resolve(location_url)
    info = read_info(location)
    rows = []
    for name in sorted(info["files"]):
        table = pq.read_table(location.join(name), columns=["image", "label", "wnid", "filename"])
        rows += list(zip(*(table.column(c).to_pylist() for c in table.column_names)))
    return rows


def test_dataframe_becomes_a_checked_dataset_and_is_reused(spark, tmp_path):
    rows = [(_jpeg(i), i % 3, f"img{i}.jpg") for i in range(30)]
    rows += [(b"not an image", 1, "broken.jpg"), (None, 2, "null.jpg"), (_png(7), 2, "gray.png"), (_jpeg(1), -4, "neg.jpg")]
    df = _dataframe(spark, rows)
    converter = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name", row_group_bytes=4000)
    try:
        assert len(converter) == converter.dataset_size == 31                 # 30 JPEGs + the re-encoded PNG
        folder = Path(converter.cache_dir_url[len("file://"):])
        assert folder.parent == tmp_path / "cache" and folder.name.startswith("pinstorm-converter-")
        info = dataset_info(converter.cache_dir_url)
        assert info["classes"] == ["0", "1", "2"] and info["class_rows"] == [10, 10, 11]
        assert info["partitions"] == 2 and info["row_groups"] > 2               # ~4 KB row groups
        assert verify_dataset(converter.cache_dir_url, decode=True)["rows"] == 31   # every checksum and image
        reasons = {s["path"]: s["reason"] for s in converter.skipped}
        assert sorted(reasons) == ["broken.jpg", "neg.jpg", "null.jpg"]
        assert reasons["neg.jpg"] == "label -4 is not a class index (0 .. 2**31 - 1)"
        assert reasons["null.jpg"] == "no image (null)" and "not an image" in reasons["broken.jpg"]
        assert [r["path"] for r in converter.reencoded] == ["gray.png"]
        stored = _rows(converter.cache_dir_url)
        by_name = {filename: (image, label, wnid) for image, label, wnid, filename in stored}
        assert by_name["img4.jpg"] == (_jpeg(4), 1, "1")                         # JPEG bytes stored as they were
        assert not any(n.startswith("_tmp.") for n in os.listdir(folder))
        # the same DataFrame (same analysed plan) reuses the dataset; other settings make another
        assert make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name",
                                    row_group_bytes=4000) is converter
        other = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name")
        assert other.cache_dir_url != converter.cache_dir_url and len(other) == 31
        other.delete()
        assert not Path(other.cache_dir_url[len("file://"):]).exists() and folder.exists()
    finally:
        converter.delete()
    assert not folder.exists() and (tmp_path / "cache").exists()


def test_string_labels_conf_cache_folder_and_readers(spark, tmp_path):
    names = ["cat", "dog", "emu"]
    df = spark.createDataFrame([(_jpeg(i, 32), names[i % 3]) for i in range(24)], ["image", "label"]).repartition(2)
    (tmp_path / "parent").mkdir()
    (tmp_path / "parent" / "keep.txt").write_text("not the converter's")
    spark.conf.set(spark_converter.SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF,
                   (tmp_path / "parent").as_uri())
    try:
        converter = make_spark_converter(df, parquet_row_group_size_bytes=4000)     # petastorm's keyword
    finally:
        spark.conf.unset(spark_converter.PARENT_CACHE_DIR_URL_CONF)
    assert converter.classes == names and len(converter) == 24
    assert converter.info["row_groups"] >= 4 and len(converter.file_urls) == 2
    with converter.make_tf_dataset(batch_size=8, num_epochs=1, image_size=(16, 16), training=False,
                                   shuffle=False, workers_count=2) as dataset:
        labels = [int(v) for _, batch in dataset for v in batch.numpy()]
    assert sorted(labels) == sorted(i % 3 for i in range(24))
    with converter.make_tf_dataset(batch_size=4, num_epochs=1, image_size=(16, 16), cur_shard=1,
                                   shard_count=2) as shard:
        images, _ = next(iter(shard))
        assert tuple(images.shape) == (4, 16, 16, 3)
    with converter.make_tf_dataset(batch_size=5, image_size=(16, 16)) as endless:    # petastorm's default: no end
        assert sum(1 for _ in endless.take(12)) == 12                                  # 60 rows > 24
    if importlib.util.find_spec("torch") is not None:
        with converter.make_torch_dataloader(batch_size=6, num_epochs=1, image_size=16, training=False) as loader:
            batches = list(loader)
        assert sum(len(labels) for _, labels in batches) == 24 and tuple(batches[0][0].shape) == (6, 3, 16, 16)
    # interpreter exit removes the folders this process made, and nothing else
    spark_converter._remove_created()
    assert not Path(converter.cache_dir_url[len("file://"):]).exists()
    assert (tmp_path / "parent" / "keep.txt").read_text() == "not the converter's"


_EXIT_SCRIPT = """
import io, os, sys
from PIL import Image
from pinstorm.pipeline import make_spark_converter
from pinstorm.pipeline.spark_converter import spark_session_for

spark = spark_session_for("local[1]")
out = io.BytesIO()
Image.new("RGB", (8, 8), (1, 2, 3)).save(out, "JPEG")
converter = make_spark_converter(spark.createDataFrame([(out.getvalue(), 0)], ["image", "label"]),
                                 cache_url=sys.argv[1])
assert "_common_metadata" in os.listdir(converter.cache_dir_url[len("file://"):])   # made, until exit
print(converter.cache_dir_url)
"""


@pytest.mark.once
def test_interpreter_exit_removes_only_the_converters_folders(tmp_path):
    """A real exit (its own driver, a separate process): the converter's folder goes, a sibling stays."""
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "theirs").mkdir()
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert done.returncode == 0, done.stderr[-3000:]
    made = done.stdout.strip().splitlines()[-1]
    assert made.startswith((tmp_path / "cache").as_uri() + "/pinstorm-converter-")
    assert sorted(os.listdir(tmp_path / "cache")) == ["theirs"]


def test_bad_dataframes_are_refused(spark, tmp_path):
    df = spark.createDataFrame([(b"x", 1.5)], ["image", "label"])
    with pytest.raises(SparkConverterError, match="column 'label' is DoubleType"):
        make_spark_converter(df, cache_url=tmp_path)
    with pytest.raises(SparkConverterError, match="no column 'picture'"):
        make_spark_converter(df, cache_url=tmp_path, image_col="picture")
    good = spark.createDataFrame([(b"x", 1)], ["image", "label"])
    with pytest.raises(SparkConverterError, match="parentCacheDirUrl"):
        make_spark_converter(good)
    with pytest.raises(SparkConverterError, match="none of the DataFrame's rows could be stored"):
        make_spark_converter(good, cache_url=tmp_path / "c")
    assert list((tmp_path / "c").iterdir()) == []                       # the failed attempt left nothing
    named = make_spark_converter(_dataframe(spark, [(_jpeg(i), i, None) for i in (0, 1, 5)], partitions=1),
                                 cache_url=tmp_path / "n", classes=["ant", "bee"])
    assert len(named) == 2 and named.classes == ["ant", "bee"]                     # integer labels, named classes
    assert [s["reason"] for s in named.skipped] == ["label 5 is not one of the 2 classes"]
    assert {wnid for _, _, wnid, _ in _rows(named.cache_dir_url)} == {"ant", "bee"}


def test_other_dataframe_columns_are_kept_as_extra_parquet_columns(spark, tmp_path):
    """Columns of every type Spark hands to Arrow (scalars, decimals, dates, timestamps with and without a
    time zone, arrays, structs, maps, nested) are stored after pinstorm's six, row for row; names of the
    dataset's own columns are left out (or refused when named); the readers ignore the extras."""
    import datetime
    import decimal

    import pyarrow.parquet as pq

    utc = datetime.timezone.utc

    def row(i, image, name):
        return (image, i % 2, name, i * 10, i / 4, i % 3 == 0, f"s{i}", bytes([i]), datetime.date(2020, 1, i + 1),
                decimal.Decimal(f"{i}.50"), [i, i], "w",
                datetime.datetime(2024, 3, 1, 12, tzinfo=utc) + datetime.timedelta(minutes=i),
                datetime.datetime(2024, 3, 1, 8, 30) + datetime.timedelta(seconds=i),
                (i, [f"a{i}", None], {"k": [i, i + 1]}), {f"m{i}": i / 2}, [(i, {"x": None})])

    rows = [row(i, _jpeg(i), f"img{i}.jpg") for i in range(8)] + [row(9, b"broken", "broken.jpg")]
    df = spark.createDataFrame(rows, "image binary, label long, name string, n long, x double, flag boolean, "
                                     "tag string, raw binary, day date, price decimal(6,2), seq array<int>, "
                                     "wnid string, ts timestamp, ntz timestamp_ntz, "
                                     "st struct<a:int, b:array<string>, c:map<string, array<int>>>, "
                                     "mp map<string, double>, arr array<struct<q:long, r:map<string, string>>>"
                               ).repartition(2)
    converter = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name")
    assert len(converter) == 8 and [s["path"] for s in converter.skipped] == ["broken.jpg"]
    location = resolve(converter.cache_dir_url)
    tables = [pq.read_table(location.join(name)) for name in sorted(read_info(location)["files"])]
    extras = ["n", "x", "flag", "tag", "raw", "day", "price", "seq", "ts", "ntz", "st", "mp", "arr"]
    assert tables[0].column_names == ["image", "label", "wnid", "filename", "height", "width", *extras]  # wnid: out
    assert str(tables[0].schema.field("ts").type) == "timestamp[us, tz=UTC]"
    assert str(tables[0].schema.field("ntz").type) == "timestamp[us]"
    stored = sorted(tuple(r) for t in tables for r in zip(*(t.column(c).to_pylist() for c in ("filename", *extras))))

    def arrow_view(r):     # how pyarrow hands the DataFrame's values back: maps as pairs, structs as dicts
        st = {"a": r[14][0], "b": r[14][1], "c": list(r[14][2].items())}
        return (r[2], *r[3:11], r[12], r[13], st, list(r[15].items()),
                [{"q": q, "r": list(m.items())} for q, m in r[16]])

    assert stored == sorted(arrow_view(r) for r in rows[:8])
    assert verify_dataset(converter.cache_dir_url, decode=True)["rows"] == 8      # checksums: pinstorm's columns
    if importlib.util.find_spec("torch") is not None:
        with converter.make_torch_dataloader(batch_size=4, num_epochs=1, image_size=16, training=False) as loader:
            assert sum(len(labels) for _, labels in loader) == 8
    just = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name", extra_cols=["tag", "st"])
    assert pq.read_schema(resolve(just.cache_dir_url).join("part-00000.parquet")).names[6:] == ["tag", "st"]
    for bad, message in ((["wnid"], "dataset's own columns"), (["nope"], "no column")):
        with pytest.raises(SparkConverterError, match=message):
            make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name", extra_cols=bad)
    converter.delete()
    just.delete()


def _tabular(spark, rows=40, partitions=2):
    import datetime

    start = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)
    data = [([float(i), i / 2, 1.0], i % 2, start + datetime.timedelta(seconds=i)) for i in range(rows)]
    return spark.createDataFrame(data, "features array<float>, label int, ts timestamp").repartition(partitions)


def test_a_tabular_dataframe_reads_as_petastorm_batches_sharded_and_in_exact_epochs(spark, tmp_path, monkeypatch):
    """No image column: every column stored as it is, checked like an image dataset; tf gives namedtuples of
    column tensors, torch dicts; every row once an epoch; two shards disjoint and together the dataset."""
    import datetime

    import pyarrow.parquet as pq

    from pinstorm.pipeline.columns_reader import ColumnError

    df = _tabular(spark)
    converter = make_spark_converter(df, cache_url=tmp_path / "cache", row_group_bytes=200)
    assert converter.tabular and len(converter) == 40 and converter.classes == []
    info = dataset_info(converter.cache_dir_url)
    assert info["columns"] == ["features", "label", "ts"] and info["row_groups"] >= 4
    assert verify_dataset(converter.cache_dir_url) == {"parts": 2, "row_groups": info["row_groups"], "rows": 40}
    table = pq.read_table(resolve(converter.cache_dir_url).path)
    assert sorted(zip(*(table.column(c).to_pylist() for c in ("features", "label", "ts")))) == \
        sorted((list(r.features), r.label, r.ts.astimezone(datetime.timezone.utc)) for r in df.collect())
    assert make_spark_converter(df, cache_url=tmp_path / "cache", row_group_bytes=200) is converter   # reused

    from pinstorm.pipeline import columns_reader

    padded = []
    monkeypatch.setattr(columns_reader, "pad_heaps", lambda: padded.append(True))
    with converter.make_tf_dataset(batch_size=7, num_epochs=2, seed=5, workers_count=2) as dataset:
        batches = list(dataset)
    assert padded   # glibc's heaps padded, as for make_dataset (pipeline.malloc_pad): from_generator's threshold
    first = batches[0]
    assert type(first).__name__ == "ColumnBatch" and first._fields == ("features", "label", "ts")
    assert first.features.dtype.name == "float32" and tuple(first.features.shape) == (7, 3)
    assert first.ts.dtype.name == "int64"
    assert len(batches) == 12                                   # 6 a epoch (5 x 7 + 5): batches never mix epochs
    for epoch in (batches[:6], batches[6:]):
        ids = sorted(int(v) for b in epoch for v in b.features.numpy()[:, 0])
        assert ids == list(range(40))
        assert all(int(f[0]) % 2 == int(y) for b in epoch for f, y in zip(b.features.numpy(), b.label.numpy()))
    assert [int(v) for v in batches[0].features.numpy()[:, 0]] != [int(v) for v in batches[6].features.numpy()[:, 0]]

    def shard_ids(index):
        with converter.make_tf_dataset(batch_size=4, num_epochs=1, cur_shard=index, shard_count=2) as shard:
            return [int(v) for b in shard for v in b.features.numpy()[:, 0]]

    zero, one = shard_ids(0), shard_ids(1)
    assert not set(zero) & set(one) and sorted(zero + one) == list(range(40))

    if importlib.util.find_spec("torch") is not None:
        import torch

        with converter.make_torch_dataloader(batch_size=8, num_epochs=1, cur_shard=1, shard_count=2,
                                             seed=1) as loader:
            got = list(loader)
        assert set(got[0]) == {"features", "label", "ts"} and got[0]["features"].dtype == torch.float32
        assert sorted(int(v) for b in got for v in b["features"][:, 0]) == sorted(one)
    with pytest.raises(Exception, match="no column 'nope'"):
        converter.make_tf_dataset(batch_size=4, columns=["nope"])
    part = resolve(converter.cache_dir_url).join("part-00000.parquet")     # a flipped byte is found
    data = bytearray(Path(part).read_bytes())
    data[len(data) // 3] ^= 0xFF
    Path(part).write_bytes(bytes(data))
    with pytest.raises(CorruptPartError):
        verify_dataset(converter.cache_dir_url)
    converter.delete()

    ragged = spark.createDataFrame([([1.0, 2.0], {"k": 1}), ([3.0], {"k": 2})],
                                   "seq array<double>, m map<string, int>")
    odd = make_spark_converter(ragged.repartition(1), cache_url=tmp_path / "cache")
    with pytest.raises(ColumnError, match="column 'm' holds structs or maps"):
        odd.make_tf_dataset(batch_size=2, columns=["m"])
    if importlib.util.find_spec("torch") is not None:   # the modern environment has no torch
        with pytest.raises(ColumnError, match="column 'seq' holds arrays of different lengths"):
            next(iter(odd.make_torch_dataloader(batch_size=2, num_epochs=1, columns=["seq"])))
        maps = [b["m"] for b in odd.make_torch_dataloader(batch_size=2, num_epochs=1, columns=["m"], shuffle=False)]
        assert sorted(maps[0]) == [[("k", 1)], [("k", 2)]]               # torch: Python objects
    odd.delete()


def _ids(batch) -> list[int]:
    """The rows of a tabular batch (tf namedtuple or torch dict) by their first feature, the row's number."""
    features = batch["features"] if isinstance(batch, dict) else batch.features
    return [int(v) for v in features.numpy()[:, 0]]


def test_a_tabular_reader_resumes_mid_epoch_with_exactly_the_rows_left(spark, tmp_path):
    """A state taken after k batches (tf: ``pinstorm_position.state(k)``, torch: ``state_dict()``), through
    JSON, continues with exactly the batches the uninterrupted reader gave next, within and across epochs,
    in either framework; a state of another shard is refused, and so is a shuffle buffer."""
    import json

    from pinstorm.pipeline import ColumnBatches, InvalidPipelineInput, ResumeStateError

    converter = make_spark_converter(_tabular(spark, rows=40), cache_url=tmp_path / "cache", row_group_bytes=200)
    assert dataset_info(converter.cache_dir_url)["row_groups"] >= 4
    plain = dict(batch_size=6, num_epochs=3, seed=11, cur_shard=0, shard_count=2)   # 4+ row groups per epoch
    with converter.make_tf_dataset(**plain) as dataset:
        full = [_ids(b) for b in dataset]
    per_epoch = len(full) // 3
    assert sorted(sum(full[:per_epoch], [])) == sorted(sum(full[per_epoch:2 * per_epoch], []))
    assert full[:per_epoch] != full[per_epoch:2 * per_epoch]          # each epoch in its own order
    for k in (2, per_epoch, per_epoch + 1, 2 * per_epoch + 1):        # mid-epoch, at a boundary, later epochs
        with converter.make_tf_dataset(**plain) as dataset:
            taken = [_ids(b) for b, _ in zip(dataset, range(k))]
            state = json.loads(json.dumps(dataset.pinstorm_position.state(k)))
        assert taken == full[:k] and state["epoch"] == k // per_epoch
        left = dict(plain, num_epochs=3 - state["epoch"], seed=None)  # num_epochs counts from the state's epoch
        with converter.make_tf_dataset(**left, state=state) as resumed:
            assert [_ids(b) for b in resumed] == full[k:]
        if importlib.util.find_spec("torch") is not None:
            with converter.make_torch_dataloader(**left, state=state) as loader:   # a tf state resumes torch
                assert [_ids(b) for b in loader] == full[k:]
    if importlib.util.find_spec("torch") is not None:
        with converter.make_torch_dataloader(**plain) as loader:
            it = iter(loader)
            assert [_ids(next(it)) for _ in range(per_epoch + 2)] == full[:per_epoch + 2]
            state = json.loads(json.dumps(loader.state_dict()))
        assert state["streams"] == [[1, 12]]
        with converter.make_torch_dataloader(**dict(plain, num_epochs=2), state=state) as loader:
            assert [_ids(b) for b in loader] == full[per_epoch + 2:]
        with converter.make_tf_dataset(**dict(plain, num_epochs=2), state=state) as resumed:   # and back to tf
            assert [_ids(b) for b in resumed] == full[per_epoch + 2:]
        with converter.make_torch_dataloader(**plain) as loader:   # an epoch's end is the next one's start
            it = iter(loader)
            assert [_ids(next(it)) for _ in range(per_epoch)] == full[:per_epoch]
            assert loader.state_dict()["streams"] == [[1, 0]]
        with converter.make_torch_dataloader(**plain) as loader:
            loader.load_state_dict(state)
            assert [_ids(b) for b in loader][:3] == full[per_epoch + 2:per_epoch + 5]
    endless = ColumnBatches(converter.cache_dir_url, batch_size=6, num_epochs=None, shard=(0, 2), seed=11)
    assert endless.state(10**9 * per_epoch + 1)["streams"] == [[10**9, 6]]     # whole epochs counted at once
    with pytest.raises(ResumeStateError, match="same shard and shuffle"):
        ColumnBatches(converter.cache_dir_url, batch_size=6, shard=(1, 2), state=state)
    with pytest.raises(ResumeStateError, match="another dataset"):
        ColumnBatches(converter.cache_dir_url, batch_size=6, shard=(0, 2),
                      state=dict(state, dataset=dict(state["dataset"], digest="0" * 32)))
    with pytest.raises(ResumeStateError, match="samples received"):
        ColumnBatches(converter.cache_dir_url, batch_size=6, shard=(0, 2), state=dict(state, streams=[[1, 10**6]]))
    with pytest.raises(InvalidPipelineInput, match="shuffling_queue_capacity"):
        converter.make_tf_dataset(batch_size=4, shuffling_queue_capacity=100)
    import pyarrow.parquet as pq

    location = resolve(converter.cache_dir_url)
    in_parts = [int(f[0]) for name in sorted(converter.info.files)
                for f in pq.read_table(location.join(name), columns=["features"]).column("features").to_pylist()]
    with converter.make_tf_dataset(batch_size=40, num_epochs=1, shuffling_queue_capacity=0) as stored:
        assert [i for b in stored for i in _ids(b)] == in_parts          # 0: the stored order, no shuffling
    converter.delete()


def test_image_readers_name_a_tabular_dataset_and_its_columns_are_checked(spark, tmp_path):
    """make_dataset / make_torch_loader on a tabular dataset: `InvalidPipelineInput` naming it tabular and the
    readers that read it; a malformed ``columns`` in the info (it comes from a board) is refused."""
    from pinstorm.pipeline import InvalidPipelineInput, MalformedDatasetError, make_dataset
    from pinstorm.pipeline.metadata import MAX_COLUMNS, check_info

    converter = make_spark_converter(_tabular(spark, rows=12), cache_url=tmp_path / "cache")
    with pytest.raises(InvalidPipelineInput, match="tabular dataset .*no image column.*ColumnBatches"):
        make_dataset(converter.cache_dir_url, batch_size=4, image_size=16)
    if importlib.util.find_spec("torch") is not None:
        from pinstorm.pipeline import make_torch_loader

        with pytest.raises(InvalidPipelineInput, match="tabular dataset .*make_torch_loader"):
            make_torch_loader(converter.cache_dir_url, batch_size=4, image_size=16)
    raw = json.loads(json.dumps(dict(read_info(resolve(converter.cache_dir_url)))))
    check_info(raw, "here")                                     # the dataset's own is whole
    name, entry = next(iter(raw["files"].items()))
    assert len(entry["row_group_bytes_xxh3"]) == entry["row_groups"]   # tabular parts too (write_table_part)
    with pytest.raises(MalformedDatasetError, match="row-group checksums \\(row_group_bytes_xxh3\\)"):
        check_info(dict(raw, files={**raw["files"], name: dict(entry, row_group_bytes_xxh3=[])}), "here")
    for columns, message in ((None, "must list its 'columns'"), ([], "1 to"), ("features", "1 to"),
                             ([1, 2], "list of strings"), (["a", "a"], "twice"), ([""], "1 to 1024 characters"),
                             (["x" * 1025], "1 to 1024 characters"), (["c"] * (MAX_COLUMNS + 1), "1 to")):
        with pytest.raises(MalformedDatasetError, match=message):
            check_info(dict(raw, columns=columns), "here")
    image_info = dict(raw, checksum="xxh3_128 of image bytes and label")
    with pytest.raises(MalformedDatasetError, match="belongs to tabular datasets"):
        check_info(image_info, "here")
    converter.delete()


def test_petastorms_own_batch_reader_reads_a_tabular_dataset(spark, tmp_path):
    """The migration path backwards: petastorm 0.13's ``make_batch_reader`` reads the converter's tabular
    dataset (no Unischema pickle in it: petastorm infers the schema from Parquet) and gets every row."""
    petastorm = pytest.importorskip("petastorm")
    from pinstorm.pipeline.epochs import quiet_petastorm
    from pinstorm.pipeline.metadata import UNISCHEMA_KEY, read_common_metadata

    df = _tabular(spark, rows=30)
    converter = make_spark_converter(df, cache_url=tmp_path / "cache", row_group_bytes=300)
    assert UNISCHEMA_KEY not in read_common_metadata(resolve(converter.cache_dir_url))   # nothing to unpickle
    quiet_petastorm()
    rows = []
    with petastorm.make_batch_reader(converter.cache_dir_url, num_epochs=1, reader_pool_type="dummy") as reader:
        for batch in reader:
            assert set(batch._fields) == {"features", "label", "ts"}
            rows += [(list(map(float, f)), int(y), t) for f, y, t in zip(batch.features, batch.label, batch.ts)]
    expected = sorted((list(map(float, r.features)), r.label) for r in df.collect())
    assert sorted((f, y) for f, y, _ in rows) == expected
    converter.delete()


def test_the_tabular_checksum_covers_values_whatever_the_buffers():
    """`column_digest`: the table written and the one read back from Parquet (other offsets, padding, bytes
    under nulls) agree, slices included; one changed value, nested or not, changes it."""
    import datetime

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pinstorm.pipeline.column_digest import columns_digest

    utc = datetime.timezone.utc
    table = pa.table({
        "f": pa.array([[1.0, 2.0], None, [3.0, 4.0], []], pa.list_(pa.float32())),
        "s": pa.array([{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": 4, "b": ""}]),
        "m": pa.array([[("k", 1)], None, [], [("a", 2), ("b", 3)]], pa.map_(pa.string(), pa.int64())),
        "t": pa.array([datetime.datetime(2020, 1, 1, tzinfo=utc), None, None,
                       datetime.datetime(2021, 1, 1, tzinfo=utc)], pa.timestamp("us", tz="UTC")),
        "i": pa.array([1, None, 3, 4], pa.int32()), "x": pa.array([b"ab", None, b"", b"c"])})
    out = io.BytesIO()
    pq.write_table(table, out)
    back = pq.read_table(io.BytesIO(out.getvalue()))
    assert columns_digest(back) == columns_digest(table)
    assert columns_digest(back.slice(1, 2)) == columns_digest(table.slice(1, 2)) != columns_digest(table)
    changed = table.set_column(2, "m", pa.array([[("k", 1)], None, [], [("a", 2), ("b", 4)]],
                                                pa.map_(pa.string(), pa.int64())))
    assert columns_digest(changed) != columns_digest(table)
    moved_null = table.set_column(4, "i", pa.array([1, 3, None, 4], pa.int32()))
    assert columns_digest(moved_null) != columns_digest(table)


# Databricks' documented petastorm example, as a user has it; the test changes its import line only.
PETASTORM_SCRIPT = """
import tensorflow as tf
from petastorm.spark import SparkDatasetConverter, make_spark_converter

spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, CACHE_DIR)
converter_train = make_spark_converter(df_train)

model = tf.keras.Sequential([tf.keras.Input(shape=(3,)), tf.keras.layers.Dense(2)])
model.compile(optimizer="sgd", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
with converter_train.make_tf_dataset(batch_size=BATCH_SIZE) as dataset:
    dataset = dataset.map(lambda x: (x.features, x.label))
    history = model.fit(dataset, steps_per_epoch=len(converter_train) // BATCH_SIZE, epochs=2, verbose=0)

with converter_train.make_torch_dataloader(batch_size=BATCH_SIZE) as dataloader:
    dataloader_iter = iter(dataloader)
    for step in range(3):
        pd_batch = next(dataloader_iter)
        inputs, labels = pd_batch["features"], pd_batch["label"]
        seen.append((tuple(inputs.shape), tuple(labels.shape)))
converter_train.delete()
"""


def test_a_petastorm_users_script_runs_with_only_the_import_changed(spark, tmp_path):
    pytest.importorskip("torch")
    script = PETASTORM_SCRIPT.replace("from petastorm.spark import", "from pinstorm.pipeline import")
    assert sum(a != b for a, b in zip(script.splitlines(), PETASTORM_SCRIPT.splitlines())) == 1
    scope = {"spark": spark, "df_train": _tabular(spark), "CACHE_DIR": (tmp_path / "cache").as_uri(),
             "BATCH_SIZE": 8, "seen": []}
    try:
        exec(compile(script, "petastorm_user_script.py", "exec"), scope)
    finally:
        spark.conf.unset(spark_converter.PARENT_CACHE_DIR_URL_CONF)
    assert len(scope["history"].history["loss"]) == 2
    assert scope["seen"] == [((8, 3), (8,))] * 3
    assert list((tmp_path / "cache").iterdir()) == []


def _python_workers() -> list[int]:
    """Python task processes of this test's local Spark: children of a ``pyspark.daemon`` under this process."""
    from servers.spark_standalone import _children_tree, _parents, cmdline

    tree = _children_tree(os.getpid())
    daemons = {pid for pid in tree if "pyspark.daemon" in " ".join(cmdline(pid))}
    parents = _parents()
    return [pid for pid in tree if parents.get(pid) in daemons]


def test_convert_on_spark_is_the_one_machine_dataset_even_after_a_killed_task(spark, tree, tmp_path):
    from PIL import Image

    # two large PNGs (seconds to re-encode) in part 1, so its task can be killed mid-part
    layout = scan(tree)
    slow = tree / "ILSVRC" / "Data" / "CLS-LOC" / "train" / layout.classes[0]
    for i in range(2):
        Image.radial_gradient("L").resize((2400, 2400)).save(slow / f"{layout.classes[0]}_slow{i}.JPEG", "PNG")
    layout = scan(tree)
    settings = dict(partitions=4, min_row_groups=8, seed=5, progress=False)
    local = convert(layout, tmp_path / "local", **settings)
    part_of_slow = {name for name in read_info(resolve(local.url))["files"]
                    if any(f.endswith("_slow0.JPEG") for f in _names_in(local.url, name))}

    killed: list[int] = []
    stop = threading.Event()

    def kill_the_slow_task():
        target = tmp_path / "spark"
        while not stop.is_set():
            temporaries = [n for n in (os.listdir(target) if target.exists() else [])
                           if n.startswith("_tmp." + next(iter(part_of_slow)))]
            if temporaries and not killed:
                for pid in _python_workers():
                    with _suppress():
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_slow_task, daemon=True)
    killer.start()
    try:
        on_spark = convert(layout, tmp_path / "spark", spark=spark, **settings)
    finally:
        stop.set()
        killer.join(10)
    assert killed, "no task was killed"
    a, b = read_info(resolve(local.url)), read_info(resolve(on_spark.url))
    for key in ("rows", "classes", "class_rows", "row_group_rows", "files", "plan", "skipped", "reencoded"):
        assert a[key] == b[key], key                                          # checksums of every part included
    assert _rows(local.url) == _rows(on_spark.url)
    assert sorted(s["path"] for s in on_spark.skipped) == sorted(s["path"] for s in local.skipped) and local.skipped
    assert sorted(os.listdir(tmp_path / "spark")) == sorted(os.listdir(tmp_path / "local"))   # no temporaries left
    # resumable like convert: a second run on the same folder finds it finished
    again = convert(layout, tmp_path / "spark", spark=spark, **settings)
    assert again.images_read == 0 and again.rows == local.rows


def test_a_binary_file_dataframe_converts_like_its_tree(spark, tmp_path):
    """`convert(df)` of a binaryFile DataFrame: its session writes the parts, labels from the class folders;
    the dataset is the one-machine conversion of the same files, the truncated JPEG skipped by both."""
    from pinstorm.pipeline.samples import digits_quirks

    root = make_digits_tree(tmp_path / "small", image_size=16, per_class=5, quirks=True, seed=1)
    digits_quirks(root)["empty"].unlink()      # Spark's file sources leave empty files out of a DataFrame
    layout = scan(root)
    train = Path(layout.train[0][0]).parents[1]
    df = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(str(train))
    on_spark = convert(df, tmp_path / "from-df", partitions=2, min_row_groups=4, progress=False)
    local = convert(layout, tmp_path / "local", partitions=2, min_row_groups=4, progress=False)
    assert on_spark.classes == local.classes == layout.classes
    a, b = read_info(resolve(local.url)), read_info(resolve(on_spark.url))
    assert a["files"] == b["files"] and a["class_rows"] == b["class_rows"] and a["plan"] == b["plan"]
    assert sorted(s["reason"] for s in on_spark.skipped) == sorted(s["reason"] for s in local.skipped)
    with pytest.raises(ValueError, match="binaryFile"):
        convert(spark.createDataFrame([(1,)], ["x"]), tmp_path / "no", progress=False)


def test_executors_write_to_a_bucket(spark, tmp_path):
    """An S3 bucket (moto) as `convert`'s output and as the converter's cache: executors reach it with the
    storage options; the driver's checks read it back; delete() empties only the converter's folder."""
    s3fs = pytest.importorskip("s3fs")
    from servers.s3 import S3Server

    root = make_digits_tree(tmp_path / "small", image_size=16, per_class=4, seed=2)
    layout = scan(root)
    bucket = f"converted-{uuid.uuid4().hex[:8]}"
    with S3Server() as server:
        options = server.storage_options()
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir(bucket)   # moto keeps buckets per process: a name of its own
        fs.pipe(f"{bucket}/cache/keep.txt", b"someone else's")
        local = convert(layout, tmp_path / "local", partitions=2, min_row_groups=4, progress=False)
        remote = convert(layout, f"s3://{bucket}/ds", partitions=2, min_row_groups=4, progress=False, spark=spark,
                         storage_options=options)
        assert read_info(resolve(f"s3://{bucket}/ds", options))["files"] == read_info(resolve(local.url))["files"]
        assert verify_dataset(f"s3://{bucket}/ds", storage_options=options)["rows"] == local.rows
        df = spark.createDataFrame([(_jpeg(i), i % 2) for i in range(10)], ["image", "label"]).repartition(2)
        converter = make_spark_converter(df, cache_url=f"s3://{bucket}/cache", storage_options=options)
        assert len(converter) == 10 and converter.cache_dir_url.startswith(f"s3://{bucket}/cache/pinstorm-converter-")
        assert dataset_info(converter.cache_dir_url, storage_options=options)["rows"] == 10
        converter.delete()
        fs.invalidate_cache()
        assert fs.ls(f"{bucket}/cache") == [f"{bucket}/cache/keep.txt"]
    assert remote.rows == local.rows


def test_a_tree_in_a_bucket_converts_on_the_executors(spark, tmp_path):
    """`convert("s3://bucket/tree", spark=)`: the driver lists the tree (names and sizes), the executors read
    the images from the bucket; the dataset is the one-machine conversion of the same tree on disk (also
    `convert` of the URL without Spark), and no credential reaches the dataset or the job description."""
    s3fs = pytest.importorskip("s3fs")
    from servers.s3 import KEY, SECRET, S3Server

    root = make_digits_tree(tmp_path / "small", image_size=16, per_class=4, quirks=True, seed=2)
    settings = dict(partitions=2, min_row_groups=4, progress=False)
    local = convert(scan(root), tmp_path / "local", **settings)
    with S3Server() as server:
        options = server.storage_options()
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("trees")        # moto's buckets are per process: not the other test's "bucket"
        fs.put(str(root) + "/", "trees/tree", recursive=True)
        on_spark = convert("s3://trees/tree", tmp_path / "spark", spark=spark, storage_options=options, **settings)
        one_machine = convert("s3://trees/tree", tmp_path / "one", storage_options=options, **settings)
        with pytest.raises(ValueError, match=r"s3://k:\*\*\*@trees/tree: put credentials in storage_options"):
            convert("s3://k:not-here@trees/tree", tmp_path / "no", spark=spark, **settings)
    a = read_info(resolve(local.url))
    for result in (on_spark, one_machine):
        b = read_info(resolve(result.url))
        for key in ("rows", "classes", "class_rows", "row_group_rows", "files"):
            assert a[key] == b[key], key                                      # checksums of every part included
        assert _rows(local.url) == _rows(result.url)
        assert sorted(s["reason"] for s in result.skipped) == sorted(s["reason"] for s in local.skipped)
        assert all(s["path"].startswith("s3://trees/tree/") for s in result.skipped)
        assert b["source"] == "s3://trees/tree (ilsvrc, train)"
        for written in Path(result.url[len("file://"):]).iterdir():
            assert KEY.encode() not in written.read_bytes() and SECRET.encode() not in written.read_bytes()


def test_a_board_of_category_pins_converts_on_the_executors(spark, tmp_path):
    """`convert("board://<board>", spark=, partition=)`: the executors fetch the slice's category pins from the
    board (only names reach the driver); the labels come from the categories pin, and the dataset is the
    one-machine `convert` of the same board and slice (`imagenet_partition` on the driver)."""
    from pinstorm import boards
    from pinstorm.pipeline import repartition

    root = make_digits_tree(tmp_path / "small", image_size=16, per_class=3, seed=4)
    boards.board_register("folder", name="inet", path=str(tmp_path / "board"), cache=str(tmp_path / "board-cache"))
    repartition(root, "inet", progress=False)
    settings = dict(partitions=2, min_row_groups=4, progress=False)
    on_spark = convert("board://inet", tmp_path / "spark", spark=spark, partition=(1, 2), **settings)
    one_machine = convert("board://inet", tmp_path / "one", partition=(1, 2), **settings)
    a, b = read_info(resolve(one_machine.url)), read_info(resolve(on_spark.url))
    for key in ("rows", "classes", "class_rows", "row_group_rows", "files", "plan"):
        assert a[key] == b[key], key
    assert b["classes"] == scan(root).classes and b["class_rows"][:5] == [0] * 5   # global labels, slice 1 of 2
    assert _rows(one_machine.url) == _rows(on_spark.url)
    whole = convert("board://inet", tmp_path / "whole", spark=spark, **settings)
    assert whole.rows == len(scan(root).train) and whole.classes == scan(root).classes
    with pytest.raises(ValueError, match="board://<board>"):
        convert("board://inet/n00000000", tmp_path / "no", spark=spark, **settings)


def test_the_console_script_converts_a_folder_board_and_a_bucket_tree_on_local_spark(tmp_path):
    """`pinstorm convert board://<board> OUT --spark local[2]` through the installed console script (its own
    driver, in a process of its own): the Parquet parts read back as the one-machine `convert` of the same
    board, row for row; then ``convert s3://bucket/tree OUT --spark local[2] --storage-option ...`` (moto)."""
    from pinstorm import boards
    from pinstorm.pipeline import repartition

    root = make_digits_tree(tmp_path / "small", image_size=16, per_class=3, seed=6)
    boards.board_register("folder", name="cli-inet", path=str(tmp_path / "board"), cache=str(tmp_path / "cache"),
                          persist=True)   # in the config file the console script reads (a test's own)
    repartition(root, "cli-inet", progress=False)
    script = Path(sys.executable).with_name("pinstorm")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "pinstorm.cli"]
    done = subprocess.run([*command, "convert", "board://cli-inet", str(tmp_path / "spark"), "--partitions", "2",
                           "--min-row-groups", "4", "--spark", "local[2]"],
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on Spark (local[2])" in done.stdout, done.stdout
    one_machine = convert("board://cli-inet", tmp_path / "one", partitions=2, min_row_groups=4, progress=False)
    written = _rows(f"file://{tmp_path / 'spark'}")
    assert len(written) == one_machine.rows == len(scan(root).train)
    assert written == _rows(one_machine.url)
    assert sorted({wnid for _, _, wnid, _ in written}) == scan(root).classes
    assert read_info(resolve(str(tmp_path / "spark")))["files"] == read_info(resolve(one_machine.url))["files"]

    # a tree in a bucket (moto), its endpoint and keys given as --storage-option: they reach the executors,
    # and no value is printed
    s3fs = pytest.importorskip("s3fs")
    from servers.s3 import KEY, SECRET, S3Server

    with S3Server() as server:
        s3fs.S3FileSystem(**server.storage_options()).put(str(root) + "/", "cli-trees/tree", recursive=True)
        flags = [f for key, value in server.storage_options().items() for f in ("--storage-option", f"{key}={value}")]
        done = subprocess.run([*command, "convert", "s3://cli-trees/tree", str(tmp_path / "from-bucket"),
                               "--partitions", "2", "--min-row-groups", "4", "--spark", "local[2]", *flags],
                              capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert KEY not in done.stdout + done.stderr and SECRET not in done.stdout + done.stderr
    on_disk = convert(scan(root), tmp_path / "tree-one", partitions=2, min_row_groups=4, progress=False)
    assert [row[:3] for row in _rows(f"file://{tmp_path / 'from-bucket'}")] == [row[:3] for row in
                                                                                 _rows(on_disk.url)]


def _names_in(url, part):
    import pyarrow.parquet as pq

    return pq.read_table(resolve(url).join(part), columns=["filename"]).column("filename").to_pylist()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        return kind is not None and issubclass(kind, ProcessLookupError)


@pytest.mark.once
@pytest.mark.skipif(shutil.which("java") is None, reason="a Spark standalone cluster needs Java")
def test_cli_converts_on_the_standalone_cluster(spark, tree, tmp_path):
    """Last: stops the module's session (one SparkContext per process) for the CLI's own driver."""
    from servers import spark_standalone

    spark.stop()
    layout = scan(tree)
    local = convert(layout, tmp_path / "local", partitions=2, min_row_groups=4, progress=False)
    with spark_standalone.StandaloneCluster(workers=2, cores=1) as cluster:
        done = subprocess.run([sys.executable, "-m", "pinstorm.cli", "convert", str(tree), str(tmp_path / "cluster"),
                               "--partitions", "2", "--min-row-groups", "4", "--spark", cluster.master_url],
                              capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on Spark (" in done.stdout
    a, b = read_info(resolve(local.url)), read_info(resolve(str(tmp_path / "cluster")))
    assert a["files"] == b["files"] and a["rows"] == b["rows"]
