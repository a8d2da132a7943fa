"""What `train`'s two step options cost a TensorFlow training step: tf-keras's moving average of the weights
(``ema_decay``) and `keras_recipe.average_statistics`'s of batch norm's statistics, updated inside the compiled
step after every optimizer update, and gradient accumulation
(``accumulate_batches``, `keras_recipe.accumulate`).

The average's cost grows with the model's trainable weights, not with the data, and must stay a small share of
a step. Accumulation changes no work per image: a step of N slices of B should cost what N steps of B cost,
less N - 1 optimizer updates, though its slices run one after another. Measured on the models `train` builds
(AlexNet at 1/4 width and MobileNetV2 at alpha 0.35 on 32 px, ResNet-50 on 64 px), compiled training steps
(``train_on_batch``, SGD with momentum): a step of batch 8 with the average against one without it and one that
averages the weights only (what the statistics' average adds), and one
step of 4 accumulated slices of 8 against 4 steps of 8 on the same images; interleaved rounds, the order
flipped each round, medians. CPU, one intra-op thread. Writes bench/results/keras_step_options.json and .png.

    .venv/bin/python bench/bench_keras_step_options.py
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
# (model, image side, builder kwargs, steps a round: small models' steps take milliseconds, timed many at once)
MODELS = (("alexnet", 32, {"width": 0.25}, 20), ("mobilenet_v2", 32, {"alpha": 0.35}, 20), ("resnet50", 64, {}, 4))
ROUNDS = 7


def measure(name: str, side: int, kwargs: dict, steps: int) -> dict:
    import numpy as np

    from pinstorm.training import keras_recipe
    from pinstorm.training.models import build_model
    from pinstorm.training.runs import FitOptions

    rng = np.random.default_rng(0)
    images = rng.random((8, side, side, 3), np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    models = {}
    for kind, decay, batches in (("plain", None, 1), ("ema", 0.9998, 1), ("ema_weights_only", 0.9998, 1),
                                 ("accumulated", None, 4)):
        random.seed(0)
        np.random.seed(0)
        model = build_model(name, (side, side, 3), 10, **kwargs)
        recipe = FitOptions(optimizer="sgd", learning_rate=0.01, ema_decay=decay, accumulate_batches=batches)
        model.compile(keras_recipe.optimizer(recipe, 100, model), keras_recipe.loss(recipe, 10))
        keras_recipe.accumulate(model, batches)
        if kind != "ema_weights_only":   # as train() does: batch norm's statistics too, with ema_decay
            keras_recipe.average_statistics(model)
        models[kind] = model
    wide = np.concatenate([images] * 4), np.concatenate([labels] * 4)   # one step of 4 slices of 8
    runs = {"plain": lambda: models["plain"].train_on_batch(images, labels),
            "ema": lambda: models["ema"].train_on_batch(images, labels),
            "ema_weights_only": lambda: models["ema_weights_only"].train_on_batch(images, labels),
            "four_steps": lambda: [models["plain"].train_on_batch(images, labels) for _ in range(4)],
            "accumulated": lambda: models["accumulated"].train_on_batch(*wide)}
    for run in runs.values():
        run()   # traces the step
    timings: dict[str, list[float]] = {kind: [] for kind in runs}
    for round_number in range(ROUNDS):
        for kind in (list(runs) if round_number % 2 == 0 else list(reversed(runs))):
            started = time.perf_counter()
            for _ in range(steps):
                runs[kind]()
            timings[kind].append((time.perf_counter() - started) / steps)
    plain, ema, weights_only, four, accumulated = (statistics.median(timings[k]) for k in (
        "plain", "ema", "ema_weights_only", "four_steps", "accumulated"))
    weights = sum(int(np.prod(v.shape)) for v in models["plain"].trainable_variables)
    return {"model": name, "image_size": side, "steps_a_round": steps, "trainable_parameters": weights,
            "step_ms": plain * 1e3,
            "ema_step_ms": ema * 1e3, "ema_over_plain": ema / plain,
            "ema_weights_only_step_ms": weights_only * 1e3, "ema_over_ema_weights_only": ema / weights_only,
            "four_steps_ms": four * 1e3,
            "accumulated_step_ms": accumulated * 1e3, "accumulated_over_four_steps": accumulated / four,
            "rounds_ms": {k: [round(t * 1e3, 3) for t in v] for k, v in timings.items()}}


def main() -> None:
    import tensorflow as tf

    runs = []
    for name, side, kwargs, steps in MODELS:
        row = measure(name, side, kwargs, steps)
        print(json.dumps({k: v for k, v in row.items() if k != "rounds_ms"}), flush=True)
        runs.append(row)
    RESULTS.mkdir(exist_ok=True)
    out = {"batch_size": 8, "ema_decay": 0.9998, "accumulate_batches": 4, "optimizer": "sgd", "threads": 1,
           "rounds": ROUNDS, "tensorflow": tf.__version__, "python": sys.version.split()[0], "runs": runs}
    (RESULTS / "keras_step_options.json").write_text(json.dumps(out, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, (ema, accumulate) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"{r['model']}\n{r['trainable_parameters'] / 1e6:.1f} M weights" for r in runs]
    ema.bar(labels, [r["ema_over_plain"] for r in runs])
    ema.axhline(1.0, color="grey", lw=0.8)
    ema.set(ylabel="step time, with / without", ylim=(0, 1.3), title="ema_decay, a step of batch 8")
    accumulate.bar(labels, [r["accumulated_over_four_steps"] for r in runs])
    accumulate.axhline(1.0, color="grey", lw=0.8)
    accumulate.set(ylabel="time, 1 step of 4 slices / 4 steps", ylim=(0, 1.3),
                   title="accumulate_batches=4 (same images)")
    figure.suptitle("TensorFlow step options (CPU, one thread)")
    figure.tight_layout()
    figure.savefig(RESULTS / "keras_step_options.png", dpi=110)

if __name__ == "__main__":
    main()
