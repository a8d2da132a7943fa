"""CPU per image when images are small: `make_dataset` against plain tf.data and `make_torch_loader` (issue 36).

    python bench/bench_small_images.py [--images 5000] [--rounds 3] [--against REV ...]

Where decoding is cheap (120x160 JPEGs, as `max_side` storage makes), the per-row path shows. Same
JPEGs, 10 and 1,000 classes, one epoch each, interleaved rounds; CPU seconds of this process (every
thread: tf.data's and the loader's) per image, the median of the rounds:

* `make_dataset` (training crops and flips, 112 px) over the converted Parquet, and its eval path (a
  centre crop): plain tf.data below makes no crop and no flip;
* plain tf.data over the JPEG files: ``list_files`` -> ``read_file`` -> ``decode_jpeg`` -> resize (no crop,
  no flip: issue 36's baseline), and ``augmented``: the same with the training crop and flip as tf.data users
  write them (``sample_distorted_bounding_box`` -> ``decode_and_crop_jpeg`` -> resize -> flip; `augmented`),
  the like-for-like baseline of `make_dataset(training=True)`;
* `make_torch_loader` over the same Parquet, in this process (``num_workers=0``, so its CPU is counted);
* ``source``: `make_dataset`'s row source alone (its rows batched, undecoded), where a change to it shows
  through the decoding's noise;
* ``source + plain map``: `make_dataset`'s row source and plan with plain tf.data's map (no crop, no flip):
  the row source against ``list_files`` + ``read_file`` with the per-image work the same;
* ``make_dataset no flip``: `make_dataset(flip=False)`: what the training flip costs (a ``tf.reverse`` of the
  resized float image, which TensorFlow's kernel copies pixel by pixel into a new buffer);
* ``per-image floor``: what `make_dataset` would cost with every per-image op gone but the decode of the
  window, the resize, the flip and the scaling (`per_image_floor`): the most that moving the crop and flip
  draws out of the per-image map (issue 36's first idea) can save.

Each reader is also run for 3 epochs: ``steady`` is (CPU of 3 epochs - CPU of 1) / (2 x images), the cost
of an image once the reader runs (nearly all of it in long epochs), without the start of an iteration
(building tf.data's functions, the first reads), which weighs up to ~0.05 ms an image at 2,000 images.
`--against REV`: also `make_dataset` as `pipeline/reader.py` was at commit REV (over this checkout's other
modules), interleaved in the same rounds: the before/after of a change to the reader. REV may also be a
copy of reader.py (a path: the tree before uncommitted edits), and ``--against`` may be given again.

Writes bench/results/small_images.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (its photo-like JPEG generator)

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parent.parent


def cpu_per_image(batches, images: int) -> float:
    started = time.process_time()
    for _ in batches:
        pass
    return (time.process_time() - started) / images * 1e3


def reader_at(rev: str, index: int = 0):
    """`pipeline/reader.py` as it was at commit `rev` (or the copy of it at the path `rev`), imported as a
    module of this checkout's pipeline."""
    import importlib.util

    if Path(rev).is_file():
        source = Path(rev).read_text()
    else:
        source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:pipeline/reader.py"],
                                check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="pinstorm-reader-")) / "reader.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"pinstorm.pipeline._reader_{index}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # where AutoGraph looks a function's module up
    spec.loader.exec_module(module)
    return module


def row_source(tf, module, url: str, epochs: int):
    """`make_dataset`'s row source alone (`module`'s, a reader.py): its rows of `epochs` epochs in batches of
    64, undecoded, with `make_dataset`'s tf.data options; what a change to the row source moves, apart from
    the decoding that dominates the whole."""
    position = module.make_dataset(url, batch_size=64, image_size=(112, 112), training=True, num_epochs=epochs,
                                   seed=1).pinstorm_position
    if hasattr(position, "chunks"):
        chunks = position.chunks(tf, 0, epochs, False)
    else:   # a reader from before `DatasetPosition.chunks`: a generator per epoch
        chunks = tf.data.Dataset.range(epochs).flat_map(position.epoch_chunks(tf, False))
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False
    return module._rows_of(tf, chunks.prefetch(2)).batch(64).with_options(options)


def source_with_plain_map(tf, module, url: str, epochs: int):
    """`make_dataset`'s row source and tf.data plan (`module`'s, a reader.py) with plain tf.data's per-image map
    (``decode_jpeg`` -> resize -> / 255, no crop, no flip): against plain tf.data, the row source and its dataset
    machinery against ``list_files`` + ``read_file``, the per-image work being the same."""
    position = module.make_dataset(url, batch_size=64, image_size=(112, 112), training=True, num_epochs=epochs,
                                   seed=1).pinstorm_position
    rows = module._rows_of(tf, position.chunks(tf, 0, epochs, False).prefetch(2))
    options = tf.data.Options()   # make_dataset's
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.map_and_batch_fusion = True
    return rows.map(lambda jpeg, label, seed: (tf.image.resize(tf.io.decode_jpeg(jpeg, channels=3), (112, 112)) / 255.0,
                                               label),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(64).prefetch(
        tf.data.AUTOTUNE).with_options(options)


def augmented(tf, jpeg):
    """The training crop and flip as tf.data users write them (TF Model Garden's ResNet `preprocess_for_train`):
    a random window of 8-100% of the area, 3/4-4/3 aspect, decoded alone, resized, flipped half the time."""
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(jpeg), bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        min_object_covered=0.1, aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.resize(tf.image.decode_and_crop_jpeg(jpeg, window, channels=3), (112, 112))
    return tf.image.random_flip_left_right(image) / 255.0


def per_image_floor(tf, module, url: str, epochs: int, stored=(120, 160)):
    """`make_dataset`'s row source and batching (`module`'s, a reader.py) with each chunk's crop windows and
    flips drawn at once, vectorized, from the stored size (`stored`, the bench's: every image is 120x160),
    so the per-image map is only ``decode_and_crop_jpeg`` + the reader's resize (`_resized`, where it has one) +
    a flag-driven reverse + the reader's scaling (`_unit_scale`).

    A floor, not a reader: the crops' distribution is near `make_dataset`'s (area uniform in its range,
    aspect log-uniform, clamped to the image rather than drawn again), and the stored size is taken on trust.
    """
    import math

    position = module.make_dataset(url, batch_size=64, image_size=(112, 112), training=True, num_epochs=epochs,
                                   seed=1).pinstorm_position
    height, width = stored
    low, high = math.log(3 / 4), math.log(4 / 3)

    def draw(jpegs, labels, seeds):
        n = tf.shape(labels)[0]
        u = tf.random.stateless_uniform([5, n], seed=seeds[0])
        area = (0.08 + 0.92 * u[0]) * height * width
        aspect = tf.exp(low + (high - low) * u[1])
        w = tf.minimum(tf.round(tf.sqrt(area * aspect)), width)
        h = tf.minimum(tf.round(tf.sqrt(area / aspect)), height)
        windows = tf.cast(tf.stack([tf.floor(u[2] * (height - h + 1)), tf.floor(u[3] * (width - w + 1)), h, w], 1),
                          tf.int32)
        return jpegs, labels, windows, tf.cast(u[4] < 0.5, tf.int32)

    resized = getattr(module, "_resized", lambda tf, image, size: tf.image.resize(image, size))   # the reader's

    def decode(jpeg, label, window, flip):
        image = resized(tf, tf.image.decode_and_crop_jpeg(jpeg, window, channels=3), (112, 112))
        return module._unit_scale(tf, tf.reverse(image, tf.range(1, 1 + flip))), label   # the reader's scaling

    rows = module._rows_of(tf, position.chunks(tf, 0, epochs, False).map(draw).prefetch(2))
    options = tf.data.Options()   # make_dataset's
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.map_and_batch_fusion = True
    return rows.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(64).prefetch(
        tf.data.AUTOTUNE).with_options(options)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--against", metavar="REV", action="append", default=[],
                        help="also make_dataset as pipeline/reader.py was at REV (or a copy of it at a path)")
    settings = parser.parse_args(argv)
    from pinstorm.pipeline import convert, make_dataset, make_torch_loader, reader, scan
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()
    olds = {f"make_dataset {rev}": reader_at(rev, i) for i, rev in enumerate(settings.against)}
    rows = []
    for classes in (10, 1_000):
        work = Path(tempfile.mkdtemp(prefix="pinstorm-small-"))
        gpu_check.make_tree(work / "tree", classes=classes, per_class=max(1, settings.images // classes),
                            size=(120, 160), workers=os.cpu_count() or 1)
        converted = convert(scan(work / "tree"), str(work / "ds"), progress=False)
        images = converted.rows
        pattern = str(work / "tree" / "ILSVRC" / "Data" / "CLS-LOC" / "train" / "*" / "*.JPEG")
        readers = {
            "make_dataset": lambda n: make_dataset(converted.url, batch_size=64, image_size=(112, 112), training=True,
                                                   num_epochs=n, seed=1),
            "make_dataset eval": lambda n: make_dataset(converted.url, batch_size=64, image_size=(112, 112),
                                                        training=False, num_epochs=n, seed=1),
            "plain tf.data": lambda n: tf.data.Dataset.list_files(pattern, seed=1).repeat(n).map(
                lambda f: tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(f), channels=3), (112, 112)) / 255.0,
                num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(2),
            "plain tf.data augmented": lambda n: tf.data.Dataset.list_files(pattern, seed=1).repeat(n).map(
                lambda f: augmented(tf, tf.io.read_file(f)), num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(2),
            "make_torch_loader": lambda n: make_torch_loader(converted.url, batch_size=64, image_size=112, num_epochs=n,
                                                             seed=1, num_workers=0),
        }
        readers["per-image floor"] = lambda n: per_image_floor(tf, reader, converted.url, n)
        readers["source + plain map"] = lambda n: source_with_plain_map(tf, reader, converted.url, n)
        readers["make_dataset no flip"] = lambda n: make_dataset(converted.url, batch_size=64, image_size=(112, 112),
                                                                 training=True, flip=False, num_epochs=n, seed=1)
        for before, old in olds.items():
            readers[before] = (lambda old: lambda n: old.make_dataset(converted.url, batch_size=64, training=True,
                                                                      image_size=(112, 112), num_epochs=n, seed=1))(old)
        for name, module in [("make_dataset", reader), *olds.items()]:
            readers[f"{name} source"] = (lambda module: lambda n: row_source(tf, module, converted.url, n))(module)
        samples = {name: [] for name in readers}
        steady = {name: [] for name in readers}
        for _ in range(settings.rounds):
            for name, make in readers.items():
                samples[name].append(cpu_per_image(make(1), images))
                three = cpu_per_image(make(3), images)
                steady[name].append((three - samples[name][-1]) / 2)
        row = {"classes": classes, "images": images,
               **{f"{name} cpu ms/img": statistics.median(v) for name, v in samples.items()},
               **{f"{name} steady cpu ms/img": statistics.median(v) for name, v in steady.items()},
               "rounds": samples, "steady rounds": steady}
        for kind in ("", " steady"):
            cost = {name: row[f"{name}{kind} cpu ms/img"] for name in readers}
            row[f"make_dataset / plain tf.data{kind}"] = cost["make_dataset"] / cost["plain tf.data"]
            row[f"make_dataset eval / plain tf.data{kind}"] = cost["make_dataset eval"] / cost["plain tf.data"]
            row[f"make_dataset / plain tf.data augmented{kind}"] = (cost["make_dataset"]
                                                                   / cost["plain tf.data augmented"])
            row[f"make_dataset / make_torch_loader{kind}"] = cost["make_dataset"] / cost["make_torch_loader"]
            row[f"per-image floor / plain tf.data{kind}"] = cost["per-image floor"] / cost["plain tf.data"]
            row[f"make_dataset / per-image floor{kind}"] = cost["make_dataset"] / cost["per-image floor"]
            row[f"source + plain map / plain tf.data{kind}"] = cost["source + plain map"] / cost["plain tf.data"]
            row[f"make_dataset / make_dataset no flip{kind}"] = cost["make_dataset"] / cost["make_dataset no flip"]
            for before in olds:
                row[f"make_dataset / {before}{kind}"] = cost["make_dataset"] / cost[before]
                row[f"make_dataset source / {before} source{kind}"] = (cost["make_dataset source"]
                                                                       / cost[f"{before} source"])
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if "rounds" not in k}, flush=True)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    against = [rev if Path(rev).is_file() else subprocess.run(["git", "-C", str(REPO), "rev-parse", rev],
                                                              check=True, capture_output=True, text=True).stdout.strip()
               for rev in settings.against]
    data = {"cpus": os.cpu_count(), "image": [120, 160], "target": 112, "against": settings.against,
            "against_commit": against, "rows": rows,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "small_images.json").write_text(json.dumps(data, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    names = ["make_dataset", *olds, "make_dataset eval", "plain tf.data", "plain tf.data augmented",
             "make_torch_loader", "per-image floor", "source + plain map", "make_dataset no flip"]
    colours = dict(zip(names, ["#4c72b0", *["#c44e52", "#937860", "#da8bc3"][:len(olds)],
                               "#8172b2", "#dd8452", "#e5ae38", "#55a868", "#8c8c8c", "#64b5cd", "#4c9ab0"]))
    figure, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
    step = len(names) + 1
    for axis, kind, title in zip(axes, ("", " steady"), ("one epoch", "steady (epochs 2-3)")):
        for i, row in enumerate(rows):
            axis.bar([j + step * i for j in range(len(names))], [row[f"{n}{kind} cpu ms/img"] for n in names],
                     color=[colours[n] for n in names])
        axis.set_xticks([j + step * i for i in range(len(rows)) for j in range(len(names))],
                        [f"{n}\n{row['classes']} cl." for row in rows for n in names], fontsize=5, rotation=30)
        axis.set_title(f"{title}: small images (120x160 -> 112 px), {data['cpus']} CPUs", fontsize=8)
    axes[0].set_ylabel("CPU ms per image (median of rounds)")
    figure.tight_layout(rect=(0, 0, 0.78, 1))
    sources = [f"{n} source" for n in ["make_dataset", *olds]]
    axis = figure.add_axes([0.8, 0.55, 0.18, 0.3])   # the row source alone, on its own scale
    for kind, shift in (("", 0), (" steady", len(sources) + 1)):
        axis.bar([shift + j for j in range(len(sources))], [rows[0][f"{n}{kind} cpu ms/img"] for n in sources],
                 color=[colours[n[:-len(" source")]] for n in sources])
    axis.set_xticks([], [])
    axis.set_title(f"row source alone, {rows[0]['classes']} cl.:\none epoch | steady", fontsize=6)
    axis.tick_params(labelsize=5)
    figure.savefig(out / "small_images.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
