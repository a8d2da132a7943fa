"""Benchmark: training steps/s and input-pipeline stall under each cross-device op.

AlexNet (1/4 width) trains on the digits tree converted to Parquet, read by ``pipeline.make_dataset``
exactly as ``train()`` reads it (one input pipeline per worker, batched per replica), on two logical
CPU devices. For each all-reduce (ReductionToOneDevice, HierarchicalCopyAllReduce, TF's default
collective, and NCCL - which fails its probe on CPUs and falls back) a custom loop times every step
in two parts: waiting for the next batch (``next(iterator)``) and computing the step (forward,
backward, all-reduce, update). Stall = waiting / (waiting + computing). Each op is also run on the
same batches cached in memory, the no-input-cost ceiling. The baseline is one replica
(OneDeviceStrategy) with the same per-replica batch in the same run; ratios are images/s against it.

Writes bench/results/training.json and bench/results/training.png. ``--quick`` runs fewer steps.
On 2 cores the "devices" share the same cores, so replicas add no compute: the numbers show what
each all-reduce and the input pipeline cost, not a speed-up.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PINSTORM_PROGRESS", "0")

from pinstorm.training import keras_env  # noqa: E402,F401  (before TensorFlow)

RESULTS = Path(__file__).parent / "results"
OPS = [
    ("one device (baseline)", "one-device", None),
    ("ReductionToOneDevice", "mirrored", "one-device"),
    ("HierarchicalCopyAllReduce", "mirrored", "hierarchical"),
    ("default collective (RING)", "mirrored", "collective"),
    ("NCCL requested", "mirrored", "nccl"),
]


def _data(workdir: Path, tree_size: int):
    from pinstorm import pipeline
    tree = workdir / "tree"
    if not (tree / "LOC_synset_mapping.txt").exists():
        pipeline.make_digits_tree(tree, image_size=tree_size)
    layout = pipeline.scan(tree)
    return pipeline.convert(layout, str(workdir / "train"), split="train", progress=False).url


def _measure(strategy, url, *, image_size, per_replica, width, steps, warmup, cached, parallel):
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    from pinstorm import pipeline
    from pinstorm.training.models import build_model

    global_batch = per_replica * strategy.num_replicas_in_sync

    def dataset_fn(context):
        dataset = pipeline.make_dataset(url, batch_size=context.get_per_replica_batch_size(global_batch),
                                        image_size=(image_size, image_size), training=True, num_epochs=None,
                                        drop_remainder=True, seed=0, flip=False, parallel=parallel)
        if cached:  # the same batches, decoded once: no input cost left
            dataset = dataset.take(8).cache().repeat()
        return dataset

    distributed = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = build_model("alexnet", (image_size, image_size, 3), 10, width=width)
        optimizer = keras.optimizers.Adam(1e-3)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=keras.losses.Reduction.NONE)

    @tf.function
    def train_step(batch):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=batch), axis=None)

    iterator = iter(distributed)
    waits, computes = [], []
    for index in range(warmup + steps):
        started = time.perf_counter()
        batch = next(iterator)
        got = time.perf_counter()
        float(train_step(batch))   # .numpy() waits for the step to finish
        done = time.perf_counter()
        if index >= warmup:
            waits.append(got - started)
            computes.append(done - got)
    total = sum(waits) + sum(computes)
    return {
        "steps": steps,
        "global_batch": global_batch,
        "steps_per_s": steps / total,
        "images_per_s": steps * global_batch / total,
        "stall_share": sum(waits) / total,
        "median_step_ms": 1000 * float(np.median(np.add(waits, computes))),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--width", type=float, default=0.25)
    parser.add_argument("--parallel", type=int, default=None, help="parallel decodes (default AUTOTUNE)")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    steps, warmup = (10, 3) if args.quick else (40, 5)

    from pinstorm.training.strategy import configure_cpu_devices, make_strategy, strategy_choice

    configure_cpu_devices(2)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="pinstorm-bench-training-"))
    url = _data(workdir, tree_size=64)

    rows = []
    for label, kind, ops in OPS:
        strategy = make_strategy(kind, devices=2 if kind == "mirrored" else None,
                                 cross_device_ops=ops or "auto")
        choice = strategy_choice(strategy)
        row = {"name": label, "requested": ops, "used": choice.cross_device_ops, "replicas": choice.replicas,
               "fallback_from": choice.fallback_from, "probe_seconds": choice.probe_seconds}
        for cached in (False, True):
            measured = _measure(strategy, url, image_size=args.image_size, per_replica=args.batch_size,
                                width=args.width, steps=steps, warmup=warmup, cached=cached, parallel=args.parallel)
            row["cached" if cached else "pipeline"] = measured
        rows.append(row)
        print(f"{label:<28} {row['used']:<30} pipeline {row['pipeline']['images_per_s']:7.0f} img/s "
              f"(stall {row['pipeline']['stall_share']:.0%})  cached {row['cached']['images_per_s']:7.0f} img/s",
              flush=True)

    baseline = rows[0]["pipeline"]["images_per_s"]
    for row in rows:
        row["images_per_s_vs_one_device"] = row["pipeline"]["images_per_s"] / baseline
        row["pipeline_vs_cached"] = row["pipeline"]["images_per_s"] / row["cached"]["images_per_s"]
    result = {
        "benchmark": "training",
        "what": "AlexNet steps/s and input stall per cross-device op, 2 logical CPU devices, Parquet input",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "settings": {"image_size": args.image_size, "per_replica_batch": args.batch_size, "width": args.width,
                     "steps": steps, "warmup": warmup, "quick": args.quick, "data": "digits tree, 64 px JPEGs"},
        "baseline": "one device (baseline): OneDeviceStrategy, same per-replica batch, Parquet input",
        "results": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "training.json").write_text(json.dumps(result, indent=2))
    _plot(rows, RESULTS / "training.png")
    print(f"wrote {RESULTS / 'training.json'} and {RESULTS / 'training.png'}")
    return result


def _plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [f"{r['name']}\n({r['used']})" if r["fallback_from"] else r["name"] for r in rows]
    x = np.arange(len(rows))
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    left.bar(x - 0.2, [r["pipeline"]["images_per_s"] for r in rows], 0.4, label="Parquet pipeline")
    left.bar(x + 0.2, [r["cached"]["images_per_s"] for r in rows], 0.4, label="cached batches (no input cost)")
    left.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    left.set_ylabel("images / s")
    left.set_title("training throughput per cross-device op")
    left.legend(fontsize=8, loc="lower right")
    right.bar(x, [100 * r["pipeline"]["stall_share"] for r in rows], color="#c44e52")
    right.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    right.set_ylabel("% of step time waiting for data")
    right.set_title("input-pipeline stall")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    main()
