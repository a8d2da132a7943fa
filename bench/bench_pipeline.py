"""Benchmark the pipeline layer on ImageNet-size JPEGs (~500x375, ~110 KB), cut from scikit-learn's photos.

Measured in one run, on the same files:

* convert: `pipeline.convert` img/s against a raw read of the same files (open + read, no decode);
* read: `make_dataset` (petastorm's make_batch_reader, and the pyarrow engine) img/s against
  - the limit: a decode-only tf.data loop doing the same per-image work (decode_and_crop + resize +
    flip, `pipeline.reader.preprocess_fn`) over the same JPEG bytes held in memory,
  - petastorm's row-wise path: make_reader (OpenCV decode) -> make_petastorm_dataset -> crop/resize,
  - `tf.keras.utils.image_dataset_from_directory` on the original folder.

Writes bench/results/pipeline.json and bench/results/pipeline.png. Target: make_dataset >= 0.9x the
decode-only limit. `--quick` uses fewer images and one timed epoch.

    .venv/bin/python bench/bench_pipeline.py [--quick] [--images 800]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE_SIZE = (224, 224)
BATCH = 64


def timed_images(dataset, warmup_batches: int = 2) -> tuple[int, float]:
    """Images and seconds after the first `warmup_batches` batches (pipeline start-up excluded)."""
    iterator = iter(dataset)
    for _ in range(warmup_batches):
        next(iterator)
    count, start = 0, time.perf_counter()
    for batch in iterator:
        count += int(batch[1].shape[0]) if isinstance(batch, tuple) else int(batch.shape[0])
    return count, time.perf_counter() - start


def best_of(runs, fn):
    """Best images/s over `runs` repetitions (the machine is shared; the best run is the least disturbed)."""
    rates = []
    for _ in range(runs):
        count, seconds = fn()
        rates.append(count / seconds)
    return max(rates), rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images, one repetition")
    parser.add_argument("--images", type=int, default=None, help="images in the tree (default 800, quick 240)")
    parser.add_argument("--epochs", type=int, default=None, help="timed epochs per reader run (default 3, quick 2)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    images = args.images or (240 if args.quick else 800)
    epochs = args.epochs or (2 if args.quick else 3)
    runs = 1 if args.quick else 2
    classes = 8
    per_class = max(1, images // classes)

    import numpy as np
    import tensorflow as tf

    from pipeline import convert, make_dataset
    from pipeline.layout import scan
    from pipeline.reader import preprocess_fn
    from pipeline.samples import make_imagenet_size_tree

    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "tensorflow": tf.__version__},
                     "images": classes * per_class, "image_size": list(IMAGE_SIZE), "batch_size": BATCH,
                     "epochs_timed": epochs, "runs": runs}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        make_imagenet_size_tree(tmp / "tree", classes=classes, per_class=per_class, seed=0)
        layout = scan(tmp / "tree")
        paths = [p for p, _ in layout.train]
        sizes = [os.path.getsize(p) for p in paths]
        results["tree"] = {"seconds_to_build": round(time.perf_counter() - t0, 1),
                           "mean_kb": round(sum(sizes) / len(sizes) / 1024, 1)}
        print(f"tree: {len(paths)} images, mean {results['tree']['mean_kb']} KB", flush=True)

        # ---- convert vs raw read -------------------------------------------------------------
        def raw_read():
            start = time.perf_counter()
            total = 0
            for path in paths:
                with open(path, "rb") as handle:
                    total += len(handle.read())
            return len(paths), time.perf_counter() - start

        raw_rate, raw_rates = best_of(runs + 1, raw_read)

        def run_convert():
            out = tmp / f"ds-{time.perf_counter_ns()}"
            result = convert(layout, out, row_group_size_mb=8, progress=False)
            return result.images_read, result.seconds

        conv_rate, conv_rates = best_of(runs, run_convert)
        dataset_url = tmp / "ds"
        convert(layout, dataset_url, row_group_size_mb=8, progress=False)
        results["convert"] = {"convert_img_s": round(conv_rate, 1), "raw_read_img_s": round(raw_rate, 1),
                              "ratio_to_raw_read": round(conv_rate / raw_rate, 3),
                              "all_runs": {"convert": [round(r, 1) for r in conv_rates],
                                           "raw_read": [round(r, 1) for r in raw_rates]}}
        print("convert:", results["convert"], flush=True)

        # ---- readers ---------------------------------------------------------------------------
        data = [Path(p).read_bytes() for p in paths]
        labels = np.array([layout.classes.index(w) for _, w in layout.train], dtype=np.int32)
        train_fn = preprocess_fn(IMAGE_SIZE, training=True)

        def decode_only():
            ds = tf.data.Dataset.from_tensor_slices((data, labels)).repeat(epochs).shuffle(1024, seed=0)
            ds = ds.enumerate().map(lambda i, x: (x[0], x[1], tf.stack([tf.constant(1, tf.int64), i])))
            ds = ds.map(train_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            return timed_images(ds.batch(BATCH).prefetch(tf.data.AUTOTUNE))

        def ours(engine):
            return lambda: timed_images(make_dataset(dataset_url, batch_size=BATCH, image_size=IMAGE_SIZE,
                                                     num_epochs=epochs, engine=engine))

        def petastorm_rows():
            import warnings

            from petastorm import make_reader
            from petastorm.tf_utils import make_petastorm_dataset

            warnings.filterwarnings("ignore", module=r"petastorm(\.|$)")
            with make_reader("file://" + str(dataset_url), num_epochs=epochs, schema_fields=["image", "label"],
                             workers_count=2) as reader:
                ds = make_petastorm_dataset(reader)

                def crop_resize(row):
                    image = row.image
                    begin, size, _ = tf.image.sample_distorted_bounding_box(
                        tf.shape(image), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), min_object_covered=0.25,
                        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.25, 1.0), max_attempts=10,
                        use_image_if_no_bounding_boxes=True)
                    image = tf.image.resize(tf.slice(image, begin, size), IMAGE_SIZE) / 255.0
                    return tf.image.random_flip_left_right(image), row.label

                ds = ds.map(crop_resize, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)
                return timed_images(ds.prefetch(tf.data.AUTOTUNE))

        def from_directory():
            ds = tf.keras.utils.image_dataset_from_directory(
                str(Path(paths[0]).parents[1]), image_size=IMAGE_SIZE, batch_size=BATCH, shuffle=True, seed=0,
                verbose=False)
            ds = ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
            return timed_images(ds.repeat(epochs).prefetch(tf.data.AUTOTUNE))

        readers = {
            "decode_only_limit": decode_only,
            "make_dataset_petastorm": ours("petastorm"),
            "make_dataset_pyarrow": ours("pyarrow"),
            "petastorm_make_reader_rows": petastorm_rows,
            "image_dataset_from_directory": from_directory,
        }
        read = {}
        for name, fn in readers.items():
            rate, rates = best_of(runs, fn)
            read[name] = {"img_s": round(rate, 1), "all_runs": [round(r, 1) for r in rates]}
            print(f"read {name}: {read[name]}", flush=True)
        limit = read["decode_only_limit"]["img_s"]
        for entry in read.values():
            entry["ratio_to_decode_only"] = round(entry["img_s"] / limit, 3)
        results["read"] = read
        results["target"] = {"make_dataset_ratio_to_decode_only": 0.9,
                             "met": read["make_dataset_petastorm"]["ratio_to_decode_only"] >= 0.9}

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "pipeline.png")
    print(f"wrote {args.out / 'pipeline.json'} and {args.out / 'pipeline.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2.4]})
    conv = results["convert"]
    left.bar(["raw read", "convert"], [conv["raw_read_img_s"], conv["convert_img_s"]], color=["#999", "#2a7"])
    left.set_ylabel("images / s")
    left.set_title("convert vs raw read")
    names = list(results["read"])
    rates = [results["read"][n]["img_s"] for n in names]
    colors = ["#999" if n == "decode_only_limit" else "#2a7" if n.startswith("make_dataset") else "#c84"
              for n in names]
    right.barh(names, rates, color=colors)
    limit = results["read"]["decode_only_limit"]["img_s"]
    right.axvline(0.9 * limit, color="k", linestyle="--", linewidth=1, label="0.9 x decode-only")
    for y, (n, r) in enumerate(zip(names, rates)):
        right.text(r, y, f" {r:.0f} ({results['read'][n]['ratio_to_decode_only']:.2f}x)", va="center")
    right.invert_yaxis()
    right.set_xlabel("images / s")
    right.set_title(f"reading into tf.data: {results['images']} ImageNet-size JPEGs, {results['image_size'][0]}px, "
                    f"batch {results['batch_size']}, {results['machine']['cpus']} CPUs")
    right.legend(loc="lower right")
    right.set_xlim(0, max(rates) * 1.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
