"""Datasets written by Spark executors (`pipeline.spark_converter`), on one `local[2, 4]` session (two
slots, a task retried up to 4 times): `make_spark_converter(df)` (pinstorm's format, checks and
checksums, reuse of the same DataFrame's dataset, delete and exit cleanup, tf.data and torch
readers), and `convert(..., spark=session)`: the very dataset a one-machine `convert` writes, also
when a task's Python worker is killed mid-part. The standalone-cluster case is last (one
SparkContext per process at a time)."""

from __future__ import annotations

import importlib.util
import io
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

from pinstorm.pipeline import (SparkConverterError, convert, dataset_info, make_digits_tree,  # noqa: E402
                               make_spark_converter, scan, verify_dataset)
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
    """Scalar, string and bytes columns are stored after pinstorm's six, row for row; nested ones and names
    of the dataset's own columns are left out (or refused when named); the readers ignore the extras."""
    import datetime
    import decimal

    import pyarrow.parquet as pq

    rows = [(_jpeg(i), i % 2, f"img{i}.jpg", i * 10, i / 4, i % 3 == 0, f"s{i}", bytes([i]), datetime.date(2020, 1, i + 1),
             decimal.Decimal(f"{i}.50"), [i, i], "w") for i in range(8)]
    rows.append((b"broken", 0, "broken.jpg", 99, 0.0, False, "x", b"", datetime.date(2020, 2, 1), decimal.Decimal("0"),
                 [], "w"))
    df = spark.createDataFrame(rows, "image binary, label long, name string, n long, x double, flag boolean, "
                                     "tag string, raw binary, day date, price decimal(6,2), seq array<int>, "
                                     "wnid string").repartition(2)
    converter = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name")
    assert len(converter) == 8 and [s["path"] for s in converter.skipped] == ["broken.jpg"]
    location = resolve(converter.cache_dir_url)
    tables = [pq.read_table(location.join(name)) for name in sorted(read_info(location)["files"])]
    assert tables[0].column_names == ["image", "label", "wnid", "filename", "height", "width", "n", "x", "flag", "tag",
                                      "raw", "day", "price"]                  # seq (an array) and wnid: left out
    stored = sorted(row for t in tables for row in zip(*(t.column(c).to_pylist() for c in
                                                         ("filename", "label", "n", "x", "flag", "tag", "raw", "day",
                                                          "price"))))
    assert stored == sorted((f"img{i}.jpg", i % 2, i * 10, i / 4, i % 3 == 0, f"s{i}", bytes([i]),
                             datetime.date(2020, 1, i + 1), decimal.Decimal(f"{i}.50")) for i in range(8))
    assert verify_dataset(converter.cache_dir_url, decode=True)["rows"] == 8      # checksums: pinstorm's columns
    if importlib.util.find_spec("torch") is not None:
        with converter.make_torch_dataloader(batch_size=4, num_epochs=1, image_size=16, training=False) as loader:
            assert sum(len(labels) for _, labels in loader) == 8
    just = make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name", extra_cols=["tag"])
    assert resolve(just.cache_dir_url).fs.exists(resolve(just.cache_dir_url).join("part-00000.parquet"))
    assert pq.read_schema(resolve(just.cache_dir_url).join("part-00000.parquet")).names[6:] == ["tag"]
    for bad, message in ((["seq"], "ArrayType"), (["wnid"], "dataset's own columns"), (["nope"], "no column")):
        with pytest.raises(SparkConverterError, match=message):
            make_spark_converter(df, cache_url=tmp_path / "cache", filename_col="name", extra_cols=bad)
    converter.delete()
    just.delete()


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
