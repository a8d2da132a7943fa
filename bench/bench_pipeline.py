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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE_SIZE = (224, 224)
BATCH = 64
SHUFFLE_BUFFER = 256     # the same for every tf.data reader; small next to an epoch, as on ImageNet
MIN_ROW_GROUPS = 4       # ~200 rows per row group here, near the ~300 of 32 MB groups on ImageNet


def timed_images(dataset, expected: int, warmup_batches: int = 2) -> tuple[int, float, float, int]:
    """(images timed, wall s, CPU s, images expected) after the first `warmup_batches` batches.

    `expected` is what the whole run should deliver; a reader that stops short is caught this way.
    """
    iterator = iter(dataset)
    warm = 0
    for _ in range(warmup_batches):
        batch = next(iterator)
        warm += int(batch[1].shape[0])
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    for batch in iterator:
        count += int(batch[1].shape[0])
    return count, time.perf_counter() - start, time.process_time() - cpu, expected - warm


def interleaved(fns: dict, rounds: int) -> dict:
    """Run every fn once per round, round after round (so a busy moment on this shared machine hits all
    of them alike); keep the best img/s and the CPU ms per image of that run. Runs that delivered fewer
    images than expected are reported and left out of the best."""
    runs = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            count, seconds, cpu, expected = fn()
            complete = count == expected
            runs[name].append((count / seconds, 1000 * cpu / max(1, count), complete, count, expected))
            print(f"  {name}: {count / seconds:.0f} img/s, {1000 * cpu / max(1, count):.2f} CPU ms/img"
                  + ("" if complete else f"  SHORT: {count} of {expected} images"), flush=True)
    out = {}
    for name, values in runs.items():
        good = [v for v in values if v[2]] or values
        best = max(good)
        out[name] = {"img_s": round(best[0], 1), "cpu_ms_per_img": round(best[1], 3),
                     "median_img_s": round(float(sorted(v[0] for v in good)[len(good) // 2]), 1),
                     "all_runs_img_s": [round(v[0], 1) for v in values],
                     "short_runs": [f"{v[3]} of {v[4]}" for v in values if not v[2]]}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images, one round")
    parser.add_argument("--images", type=int, default=None, help="images in the tree (default 800, quick 240)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per reader run (default 3, quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4, quick 1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    images = args.images or (240 if args.quick else 800)
    epochs = args.epochs or (2 if args.quick else 3)
    rounds = args.rounds or (1 if args.quick else 4)
    classes = 8
    per_class = max(1, images // classes)

    import numpy as np
    import tensorflow as tf

    from pinstorm.pipeline import convert, make_dataset
    from pinstorm.pipeline.images import check_image
    from pinstorm.pipeline.layout import scan
    from pinstorm.pipeline.reader import preprocess_fn
    from pinstorm.pipeline.samples import make_imagenet_size_tree

    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "tensorflow": tf.__version__, "load_average_at_start": os.getloadavg()[0]},
                     "images": classes * per_class, "image_size": list(IMAGE_SIZE), "batch_size": BATCH,
                     "epochs_per_run": epochs, "rounds": rounds, "shuffle_buffer": SHUFFLE_BUFFER}
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

        # ---- convert vs raw read (and vs the decode check convert must do) -----------------------
        def raw_read():
            start, cpu = time.perf_counter(), time.process_time()
            for path in paths:
                with open(path, "rb") as handle:
                    handle.read()
            return len(paths), time.perf_counter() - start, time.process_time() - cpu, len(paths)

        def read_and_check():
            start, cpu = time.perf_counter(), time.process_time()
            with ThreadPoolExecutor(os.cpu_count()) as pool:
                list(pool.map(lambda p: check_image(Path(p).read_bytes()), paths))
            return len(paths), time.perf_counter() - start, time.process_time() - cpu, len(paths)

        def run_convert():
            cpu = time.process_time()
            result = convert(layout, tmp / f"ds-{time.perf_counter_ns()}", min_row_groups=MIN_ROW_GROUPS,
                             progress=False)
            return result.images_read, result.seconds, time.process_time() - cpu, len(paths)

        print("convert:", flush=True)
        conv = interleaved({"raw_read": raw_read, "read_and_check_only": read_and_check, "convert": run_convert},
                           rounds)
        for entry in conv.values():
            entry["ratio_to_raw_read"] = round(entry["img_s"] / conv["raw_read"]["img_s"], 4)
            entry["ratio_to_read_and_check"] = round(entry["img_s"] / conv["read_and_check_only"]["img_s"], 3)
        results["convert"] = conv

        dataset_url = tmp / "ds"
        convert(layout, dataset_url, min_row_groups=MIN_ROW_GROUPS, progress=False)
        from pinstorm.pipeline import dataset_info

        info = dataset_info(dataset_url)
        results["dataset"] = {"rows": info["rows"], "row_groups": info["row_groups"],
                              "rows_per_row_group": max(info["row_group_rows"]), "mb": round(info["bytes"] / 2**20, 1)}

        # ---- readers ---------------------------------------------------------------------------
        data = [Path(p).read_bytes() for p in paths]
        total = len(paths) * epochs
        labels = np.array([layout.classes.index(w) for _, w in layout.train], dtype=np.int32)
        train_fn = preprocess_fn(IMAGE_SIZE, training=True)

        def decode_only():
            ds = tf.data.Dataset.from_tensor_slices((data, labels)).repeat(epochs).shuffle(SHUFFLE_BUFFER, seed=0)
            ds = ds.enumerate().map(lambda i, x: (x[0], x[1], tf.stack([tf.constant(1, tf.int64), i])))
            ds = ds.map(train_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
            return timed_images(ds.batch(BATCH).prefetch(tf.data.AUTOTUNE), total)

        def ours(engine):
            return lambda: timed_images(make_dataset(dataset_url, batch_size=BATCH, image_size=IMAGE_SIZE,
                                                     num_epochs=epochs, engine=engine, shuffle_buffer=SHUFFLE_BUFFER),
                                        total)

        def petastorm_rows():
            import warnings

            from petastorm import make_reader
            from petastorm.tf_utils import make_petastorm_dataset

            warnings.filterwarnings("ignore", module=r"petastorm(\.|$)")
            reader = make_reader("file://" + str(dataset_url), num_epochs=epochs, schema_fields=["image", "label"],
                                 workers_count=2)
            try:
                ds = make_petastorm_dataset(reader)

                def crop_resize(row):
                    image = row.image
                    begin, size, _ = tf.image.sample_distorted_bounding_box(
                        tf.shape(image), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), min_object_covered=0.25,
                        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.25, 1.0), max_attempts=10,
                        use_image_if_no_bounding_boxes=True)
                    image = tf.image.resize(tf.slice(image, begin, size), IMAGE_SIZE) / 255.0
                    return tf.image.random_flip_left_right(image), row.label

                ds = ds.map(crop_resize, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH)  # row groups shuffled
                return timed_images(ds.prefetch(tf.data.AUTOTUNE), total)
            finally:
                reader.stop()
                reader.join()

        def from_directory():
            ds = tf.keras.utils.image_dataset_from_directory(
                str(Path(paths[0]).parents[1]), image_size=IMAGE_SIZE, batch_size=BATCH, shuffle=True, seed=0)
            ds = ds.map(lambda x, y: (x / 255.0, y), num_parallel_calls=tf.data.AUTOTUNE)
            return timed_images(ds.repeat(epochs).prefetch(tf.data.AUTOTUNE), total)

        print("read:", flush=True)
        read = interleaved({
            "decode_only_limit": decode_only,
            "make_dataset_petastorm": ours("petastorm"),
            "make_dataset_pyarrow": ours("pyarrow"),
            "petastorm_make_reader_rows": petastorm_rows,
            "image_dataset_from_directory": from_directory,
        }, rounds)
        limit = read["decode_only_limit"]
        for entry in read.values():
            entry["ratio_to_decode_only"] = round(entry["img_s"] / limit["img_s"], 3)
            entry["median_ratio_to_decode_only"] = round(entry["median_img_s"] / limit["median_img_s"], 3)
            # On a CPU-bound machine throughput follows CPU per image; this ratio is the least noisy one.
            entry["cpu_limit_ratio"] = round(limit["cpu_ms_per_img"] / entry["cpu_ms_per_img"], 3)
        results["read"] = read
        results["target"] = {"make_dataset_ratio_to_decode_only": 0.9}
        for engine in ("petastorm", "pyarrow"):
            entry = read[f"make_dataset_{engine}"]
            results["target"][f"{engine}_engine"] = {
                key: entry[key] for key in ("ratio_to_decode_only", "median_ratio_to_decode_only", "cpu_limit_ratio")}
            results["target"][f"{engine}_engine"]["met_best_of"] = entry["ratio_to_decode_only"] >= 0.9
    results["machine"]["load_average_at_end"] = os.getloadavg()[0]

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "pipeline.png")
    print(json.dumps({k: results[k] for k in ("convert", "read", "target")}, indent=1))
    print(f"wrote {args.out / 'pipeline.json'} and {args.out / 'pipeline.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2.4]})
    conv = results["convert"]
    bars = ["raw_read", "read_and_check_only", "convert"]
    left.bar(["raw read", "read + check\n(decode, 2 thr.)", "convert"], [conv[b]["img_s"] for b in bars],
             color=["#999", "#bbb", "#2a7"])
    left.set_yscale("log")
    left.set_ylim(100, max(conv[b]["img_s"] for b in bars) * 3)
    for x, b in enumerate(bars):
        left.text(x, conv[b]["img_s"] * 1.15, f"{conv[b]['img_s']:.0f}", ha="center", fontsize=9)
    left.set_ylabel("images / s (log)")
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
    right.set_title(f"into tf.data: {results['images']} ImageNet-size JPEGs -> {results['image_size'][0]}px crops, "
                    f"batch {results['batch_size']}, {results['machine']['cpus']} CPUs (best of {results['rounds']})",
                    fontsize=10)
    right.legend(loc="lower right")
    right.set_xlim(0, max(rates) * 1.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
