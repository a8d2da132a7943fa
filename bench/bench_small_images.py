"""CPU per image when images are small: `make_dataset` against plain tf.data and `make_torch_loader` (issue 36).

    python bench/bench_small_images.py [--images 5000] [--rounds 3]

Where decoding is cheap (120x160 JPEGs, as `max_side` storage makes), the per-row path shows. Same
JPEGs, 10 and 1,000 classes, one epoch each, interleaved rounds; CPU seconds of this process (every
thread: tf.data's and the loader's) per image, the median of the rounds:

* `make_dataset` (training crops and flips, 112 px) over the converted Parquet, and its eval path (a
  centre crop): plain tf.data below makes no crop and no flip;
* plain tf.data over the JPEG files: ``list_files`` -> ``read_file`` -> ``decode_jpeg`` -> resize;
* `make_torch_loader` over the same Parquet, in this process (``num_workers=0``, so its CPU is counted).

Writes bench/results/small_images.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (its photo-like JPEG generator)

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_per_image(batches, images: int) -> float:
    started = time.process_time()
    for _ in batches:
        pass
    return (time.process_time() - started) / images * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS))
    settings = parser.parse_args(argv)
    from pinstorm.pipeline import convert, make_dataset, make_torch_loader, scan
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()
    rows = []
    for classes in (10, 1_000):
        work = Path(tempfile.mkdtemp(prefix="pinstorm-small-"))
        gpu_check.make_tree(work / "tree", classes=classes, per_class=max(1, settings.images // classes),
                            size=(120, 160), workers=os.cpu_count() or 1)
        converted = convert(scan(work / "tree"), str(work / "ds"), progress=False)
        images = converted.rows
        pattern = str(work / "tree" / "ILSVRC" / "Data" / "CLS-LOC" / "train" / "*" / "*.JPEG")
        readers = {
            "make_dataset": lambda: make_dataset(converted.url, batch_size=64, image_size=(112, 112), training=True,
                                                 num_epochs=1, seed=1),
            "make_dataset eval": lambda: make_dataset(converted.url, batch_size=64, image_size=(112, 112),
                                                      training=False, num_epochs=1, seed=1),
            "plain tf.data": lambda: tf.data.Dataset.list_files(pattern, seed=1).map(
                lambda f: tf.image.resize(tf.io.decode_jpeg(tf.io.read_file(f), channels=3), (112, 112)) / 255.0,
                num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(2),
            "make_torch_loader": lambda: make_torch_loader(converted.url, batch_size=64, image_size=112, num_epochs=1,
                                                           seed=1, num_workers=0),
        }
        samples = {name: [] for name in readers}
        for _ in range(settings.rounds):
            for name, make in readers.items():
                samples[name].append(cpu_per_image(make(), images))
        row = {"classes": classes, "images": images,
               **{f"{name} cpu ms/img": statistics.median(v) for name, v in samples.items()},
               "rounds": samples}
        row["make_dataset / plain tf.data"] = row["make_dataset cpu ms/img"] / row["plain tf.data cpu ms/img"]
        row["make_dataset eval / plain tf.data"] = row["make_dataset eval cpu ms/img"] / row["plain tf.data cpu ms/img"]
        row["make_dataset / make_torch_loader"] = (row["make_dataset cpu ms/img"]
                                                   / row["make_torch_loader cpu ms/img"])
        rows.append(row)
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "rounds"}, flush=True)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {"cpus": os.cpu_count(), "image": [120, 160], "target": 112, "rows": rows,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (out / "small_images.json").write_text(json.dumps(data, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    figure, axis = plt.subplots(figsize=(7, 4))
    names = ["make_dataset", "make_dataset eval", "plain tf.data", "make_torch_loader"]
    for i, row in enumerate(rows):
        axis.bar([j + 5 * i for j in range(4)], [row[f"{n} cpu ms/img"] for n in names],
                 color=["#4c72b0", "#8172b2", "#dd8452", "#55a868"], label=None)
    axis.set_xticks([j + 5 * i for i in range(len(rows)) for j in range(4)],
                    [f"{n}\n{row['classes']} classes" for row in rows for n in names], fontsize=6)
    axis.set_ylabel("CPU ms per image (median)")
    axis.set_title(f"small images (120x160 -> 112 px), {data['cpus']} CPUs", fontsize=9)
    figure.tight_layout()
    figure.savefig(out / "small_images.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
