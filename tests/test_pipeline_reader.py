"""make_dataset: shapes, exact epochs, disjoint shards, order, and refusing what it cannot trust."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pinstorm.pipeline import IncompleteDatasetError, dataset_info, make_dataset
from pipeline_support import IMAGE_SIZE, read_rows

pytest_plugins = ["conftest_pipeline"]
pytest.importorskip("tensorflow")
ENGINES = ["petastorm", "pyarrow"]


@pytest.fixture(autouse=True)
def _needs_petastorm(request):
    """Cases of the petastorm engine run only where petastorm is installed (not on the modern stack)."""
    if "petastorm" in getattr(getattr(request.node, "callspec", None), "params", {}).values():
        pytest.importorskip("petastorm")


def _fingerprints(dataset) -> Counter:
    """Rows as (label, hash of pixels): exact for eval mode at the stored size (no crop, no resize)."""
    prints = Counter()
    for images, labels in dataset:
        pixels = np.round(images.numpy() * 255).astype(np.uint8)
        for image, label in zip(pixels, labels.numpy()):
            prints[(int(label), hashlib.sha1(image.tobytes()).hexdigest())] += 1
    return prints


def _exact(url, **kw):
    return make_dataset(url, batch_size=50, image_size=(IMAGE_SIZE, IMAGE_SIZE), training=False, eval_crop=1.0,
                        **kw)


@pytest.fixture(scope="module")
def stored_fingerprints(digits_dataset):
    """What every row of the dataset decodes to, straight from the stored bytes."""
    import tensorflow as tf

    url, _ = digits_dataset
    prints = Counter()
    for row in read_rows(url, columns=("image", "label")):
        pixels = tf.io.decode_jpeg(row["image"], channels=3).numpy()
        prints[(row["label"], hashlib.sha1(pixels.tobytes()).hexdigest())] += 1
    return prints


def test_batches_shapes_dtypes_and_range(digits_dataset):
    import tensorflow as tf

    url, result = digits_dataset
    batches = list(make_dataset(url, batch_size=32, image_size=(40, 56), seed=0))
    assert sum(int(y.shape[0]) for _, y in batches) == result.rows
    images, labels = batches[0]
    assert images.shape == (32, 40, 56, 3) and images.dtype == tf.float32 and labels.dtype == tf.int32
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    assert float(tf.reduce_max(images)) > 0.9 and float(tf.reduce_min(images)) < 0.3   # ink on paper
    assert batches[-1][1].shape[0] == result.rows % 32   # a partial last batch unless asked otherwise

    full = make_dataset(url, batch_size=32, image_size=(40, 56), drop_remainder=True, seed=0)
    assert full.element_spec[0].shape.as_list() == [32, 40, 56, 3]
    assert sum(int(y.shape[0]) for _, y in full) == result.rows // 32 * 32


@pytest.mark.parametrize("engine", ENGINES)
def test_every_row_exactly_once_per_epoch(digits_dataset, stored_fingerprints, engine):
    url, _ = digits_dataset
    assert _fingerprints(_exact(url, engine=engine, seed=1)) == stored_fingerprints
    twice = _fingerprints(_exact(url, engine=engine, num_epochs=2, seed=1))
    assert twice == Counter({k: 2 * v for k, v in stored_fingerprints.items()})


@pytest.mark.parametrize("engine, count", [("petastorm", 2), ("pyarrow", 3)])
def test_shards_are_disjoint_and_cover_every_row(digits_dataset, stored_fingerprints, engine, count):
    url, result = digits_dataset
    shards = [_fingerprints(_exact(url, engine=engine, shard=(i, count), seed=2)) for i in range(count)]
    assert sum(shards, Counter()) == stored_fingerprints
    info = dataset_info(url)
    expected = [sum(info["row_group_rows"][g] for g in range(i, info["row_groups"], count)) for i in range(count)]
    assert [sum(s.values()) for s in shards] == expected
    assert max(expected) - min(expected) <= 1 + 2 * max(info["row_group_rows"]) // 2  # row-group granular


def test_stored_order_without_shuffle_and_seeded_shuffle(digits_dataset):
    url, _ = digits_dataset
    stored = [r["label"] for r in read_rows(url)]
    ordered = lambda **kw: [int(v) for _, y in make_dataset(url, batch_size=64, image_size=(16, 16), **kw)  # noqa
                            for v in y.numpy()]
    assert ordered(training=False, shuffle=False) == stored
    assert ordered(training=False, shuffle=False, engine="pyarrow") == stored

    a = [x.numpy() for x, _ in make_dataset(url, batch_size=64, image_size=(16, 16), seed=7)]
    b = [x.numpy() for x, _ in make_dataset(url, batch_size=64, image_size=(16, 16), seed=7)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))  # same seed: same order, same augmentation
    shuffled = ordered(seed=7)
    assert shuffled != stored and sorted(shuffled) == sorted(stored)
    assert ordered(seed=8) != shuffled


def test_refuses_incomplete_datasets_and_bad_arguments(digits_dataset, tmp_path):
    url, _ = digits_dataset
    broken = tmp_path / "broken"
    shutil.copytree(url, broken)
    (broken / "_common_metadata").unlink()
    with pytest.raises(IncompleteDatasetError, match="not a finished pinstorm dataset"):
        make_dataset(broken, batch_size=8)
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        make_dataset(tmp_path / "nothing", batch_size=8)
    with pytest.raises(ValueError, match="8 row groups, fewer than 9 shards"):
        make_dataset(url, batch_size=8, shard=(0, 9))
    with pytest.raises(ValueError, match="shard index"):
        make_dataset(url, batch_size=8, shard=(2, 2))
    with pytest.raises(ValueError, match="batch_size"):
        make_dataset(url, batch_size=0)
    with pytest.raises(ValueError, match="engine"):
        make_dataset(url, batch_size=8, engine="spark")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_epoch_short_of_the_stored_rows_raises(digits_dataset, tmp_path, engine):
    """A part file replaced after conversion (same row groups, one row fewer) must not pass silently."""
    import tensorflow as tf

    url, _ = digits_dataset
    damaged = tmp_path / "damaged"
    shutil.copytree(url, damaged)
    part = damaged / "part-00001.parquet"
    handle = pq.ParquetFile(part)
    groups = [handle.read_row_group(g) for g in range(handle.num_row_groups)]
    schema = handle.schema_arrow
    handle.close()
    groups[-1] = groups[-1].slice(1)
    with pq.ParquetWriter(part, schema) as writer:
        for table in groups:
            writer.write_table(pa.Table.from_batches(table.to_batches(), schema), row_group_size=len(table))
    from pinstorm.pipeline import CorruptPartError
    from pinstorm.pipeline.metadata import read_info, write_common_metadata
    from pinstorm.pipeline.storage import resolve

    with pytest.raises(CorruptPartError, match="part-00001.parquet: .* bytes, but conversion wrote"):
        make_dataset(damaged, batch_size=64, image_size=(16, 16), engine=engine, seed=0)   # checked up front

    # Without checksums and with the new size recorded (an older dataset), counting rows still catches it.
    location = resolve(damaged)
    info = read_info(location).to_dict()   # a copy to edit
    for entry in info["files"].values():
        entry.pop("row_group_xxh3"), entry.pop("footer_xxh3")
    info["files"]["part-00001.parquet"]["bytes"] = part.stat().st_size
    write_common_metadata(location, info, {n: e["row_groups"] for n, e in info["files"].items()})
    with pytest.raises(tf.errors.OpError, match="IncompleteEpochError|delivered .* rows, expected"):
        for _ in make_dataset(damaged, batch_size=64, image_size=(16, 16), engine=engine, seed=0):
            pass


@pytest.mark.slow
def test_model_fit_under_mirrored_strategy(digits_dataset, tmp_path):
    """Two logical CPUs in a fresh process (devices must be set before TensorFlow runs any op)."""
    url, result = digits_dataset
    script = textwrap.dedent(f"""
        import json, os
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from pinstorm.pipeline import make_dataset, dataset_info
        info = dataset_info({str(url)!r})
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                  cross_device_ops=tf.distribute.ReductionToOneDevice())
        train = make_dataset({str(url)!r}, batch_size=32, image_size=(32, 32), num_epochs=None, seed=0,
                             drop_remainder=True)
        per_replica = next(iter(strategy.experimental_distribute_dataset(train)))[0]
        shapes = [list(t.shape) for t in strategy.experimental_local_results(per_replica)]
        with strategy.scope():
            model = tf.keras.Sequential([
                tf.keras.layers.Conv2D(16, 3, activation="relu", input_shape=(32, 32, 3)),
                tf.keras.layers.GlobalAveragePooling2D(),
                tf.keras.layers.Dense(info["num_classes"])])
            model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        steps = info["rows"] // 32
        history = model.fit(train, epochs=2, steps_per_epoch=steps, verbose=0)
        print("RESULT" + json.dumps({{"replicas": strategy.num_replicas_in_sync, "shapes": shapes,
                                     "loss": history.history["loss"], "steps": steps}}))
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.split("RESULT", 1)[1])
    assert out["replicas"] == 2 and out["shapes"] == [[16, 32, 32, 3], [16, 32, 32, 3]]
    assert len(out["loss"]) == 2 and all(np.isfinite(out["loss"])) and out["steps"] == result.rows // 32


def test_shuffled_reader_builds_under_a_global_tf_seed(digits_dataset):
    """keras.utils.set_random_seed sets TF's global seed; the reader must still build and read."""
    import tensorflow as tf

    from pinstorm.pipeline import dataset_info, make_dataset

    digits_dataset = digits_dataset[0]
    tf.random.set_seed(1234)
    try:
        ds = make_dataset(digits_dataset, batch_size=16, image_size=(32, 32), shuffle=True, seed=3)
        assert sum(int(b[1].shape[0]) for b in ds) == dataset_info(digits_dataset)["rows"]
    finally:
        tf.random.set_seed(None)


def test_a_dataset_of_many_parts_is_read_with_few_file_descriptors(tmp_path):
    """Readers keep only the last few parts open (`verify.OpenParts`): a dataset of 200 one-row-group parts
    (the layout advised for streaming) is read under a limit of 128 open files. Keeping every part open
    failed at the 133rd part under the usual limit of 1,024."""
    from pinstorm.pipeline import convert, make_digits_tree, scan

    tree = make_digits_tree(tmp_path / "tree", image_size=8, per_class=30, seed=0)
    result = convert(scan(tree), tmp_path / "ds", partitions=200, min_row_groups=200, seed=0, progress=False)
    assert result.partitions == 200
    code = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        from pinstorm.pipeline.epochs import open_epochs
        source = open_epochs(sys.argv[1], None, shuffle=True, seed=0)
        print(sum(len(labels) for epoch in range(2) for _, labels in source(epoch)))
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) == 2 * result.rows
    # out of file descriptors is this machine's limit, never reported as a corrupt part
    code = textwrap.dedent("""
        import resource, sys
        from pinstorm.pipeline import locate, open_part, read_info
        location = locate(sys.argv[1])
        info = read_info(location)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        handles = [open_part(location, info, name) for name in sorted(info.files)]
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ds")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1 and "OSError: [Errno 24]" in done.stderr and "Too many open files" in done.stderr
    assert "CorruptPartError" not in done.stderr and "MalformedParquet" not in done.stderr
