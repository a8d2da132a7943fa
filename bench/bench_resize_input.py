"""The reader's resize from a float32 cast against ``tf.image.resize`` of the uint8 decode, small to ImageNet size.

    python bench/bench_resize_input.py [--rounds 5] [--images 400] [--against REV]

TensorFlow's bilinear kernel interpolates in float32 whatever its input, and gives the same pixels bit for bit
from a float32 copy of the uint8 decode, but reads float32 far faster: `pipeline.reader._resized` casts first.
Measured in one run, interleaved rounds, medians:

* the resize alone, in a tf.data map as `make_dataset`'s (parallel calls, batches of 64): CPU us an image of
  ``resize(uint8)`` against ``resize(cast(uint8, float32))`` for crops from small stored images (60x80, 96x128
  to 112 px) to ImageNet-size ones (180x240, 300x400, 375x500, 500x375 to 224 px);
* `make_dataset` end to end at ImageNet size (`--images` photo-like ~375x500 JPEGs, 224 px, training crops and
  flips, 2 epochs): CPU ms an image of this checkout's reader against `pipeline/reader.py` at `--against`
  (default ``HEAD~1``, the reader before the cast), the same run.

Writes bench/results/resize_input.json and .png.
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
from bench_small_images import cpu_per_image, reader_at  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = [((60, 80), 112), ((96, 128), 112), ((180, 240), 224), ((300, 400), 224), ((375, 500), 224),
          ((500, 375), 224)]
REPEATS = 2_000


def resize_cost(tf, pixels, target: int, cast: bool) -> float:
    """CPU us an image of resizing `pixels` to `target` square in a map like `make_dataset`'s."""
    def resize(image):
        return tf.image.resize(tf.cast(image, tf.float32) if cast else image, (target, target))

    batches = tf.data.Dataset.from_tensors(pixels).repeat(REPEATS).map(
        resize, num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(2)
    for _ in batches.take(2):   # build the functions before timing
        pass
    return cpu_per_image(batches, REPEATS) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--against", default="HEAD~1", help="make_dataset as pipeline/reader.py was at REV")
    parser.add_argument("--out", type=Path, default=RESULTS)
    settings = parser.parse_args(argv)
    import numpy as np

    from pinstorm.pipeline import convert, make_dataset, scan
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()
    rng = np.random.default_rng(3)
    shapes = [(shape, target, tf.constant(rng.integers(0, 256, (*shape, 3)).astype(np.uint8)))
              for shape, target in SHAPES]
    for _, target, pixels in shapes:   # the premise: the same pixels either way
        assert np.array_equal(tf.image.resize(pixels, (target, target)).numpy(),
                              tf.image.resize(tf.cast(pixels, tf.float32), (target, target)).numpy())
    resize = {f"{h}x{w} -> {t}": {"uint8": [], "float32 cast": []} for (h, w), t, _ in shapes}
    for _ in range(settings.rounds):
        for ((h, w), target, pixels) in shapes:
            for kind in ("uint8", "float32 cast"):
                resize[f"{h}x{w} -> {target}"][kind].append(resize_cost(tf, pixels, target, kind != "uint8"))
    resize_rows = [{"shape": name, "input / output pixels": round(h * w / t ** 2, 2),
                    **{f"{kind} cpu us/img": statistics.median(v) for kind, v in kinds.items()},
                    "cast / uint8": statistics.median(kinds["float32 cast"]) / statistics.median(kinds["uint8"]),
                    "rounds": kinds} for ((h, w), t, _), (name, kinds) in zip(shapes, resize.items())]
    for row in resize_rows:
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "rounds"}, flush=True)

    work = Path(tempfile.mkdtemp(prefix="pinstorm-resize-"))
    tree = gpu_check.make_tree(work / "tree", classes=10, per_class=max(1, settings.images // 10), size=(375, 500),
                               workers=os.cpu_count() or 1)
    converted = convert(scan(work / "tree"), str(work / "ds"), progress=False)
    before = reader_at(settings.against)
    readers = {"make_dataset": make_dataset, f"make_dataset {settings.against}": before.make_dataset}
    end_to_end = {name: [] for name in readers}
    for _ in range(settings.rounds):
        for name, make in readers.items():
            batches = make(converted.url, batch_size=64, image_size=(224, 224), training=True, num_epochs=2, seed=1)
            end_to_end[name].append(cpu_per_image(batches, 2 * converted.rows))
    cost = {name: statistics.median(v) for name, v in end_to_end.items()}
    imagenet = {"images": converted.rows, "mean_kb": round(tree["mean_kb"], 1), "image": [375, 500], "target": 224,
                **{f"{name} cpu ms/img": v for name, v in cost.items()},
                "make_dataset / before": cost["make_dataset"] / cost[f"make_dataset {settings.against}"],
                "rounds": end_to_end}
    print({k: v for k, v in imagenet.items() if k != "rounds"}, flush=True)

    import subprocess

    commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "rev-parse", settings.against],
                            capture_output=True, text=True).stdout.strip()
    data = {"cpus": os.cpu_count(), "rounds": settings.rounds, "against": settings.against, "against_commit": commit,
            "resize": resize_rows, "make_dataset_imagenet_size": imagenet,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "resize_input.json").write_text(json.dumps(data, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    x = np.arange(len(resize_rows))
    for shift, kind, colour in ((-0.2, "uint8", "#c44e52"), (0.2, "float32 cast", "#4c72b0")):
        left.bar(x + shift, [row[f"{kind} cpu us/img"] for row in resize_rows], 0.4, label=f"resize({kind})",
                 color=colour)
    left.set_xticks(x, [f"{row['shape']}\n({row['input / output pixels']}x the pixels)" for row in resize_rows],
                    fontsize=6)
    left.set_ylabel("CPU us per image (median of rounds)")
    left.set_title(f"bilinear resize in a tf.data map, {data['cpus']} CPUs", fontsize=9)
    left.legend(fontsize=8)
    names = list(readers)
    right.bar(range(len(names)), [cost[n] for n in names], color=["#4c72b0", "#c44e52"])
    right.set_xticks(range(len(names)), ["cast first", f"before ({settings.against})"], fontsize=7)
    right.set_ylabel("CPU ms per image")
    right.set_title(f"make_dataset, training, 224 px\n{converted.rows} JPEGs ~375x500", fontsize=9)
    figure.tight_layout()
    figure.savefig(settings.out / "resize_input.png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
