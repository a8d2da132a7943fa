"""What `train(ema_decay=d)` costs a TensorFlow training step: tf-keras's moving average of the weights, updated
inside the compiled step after every optimizer update.

Its cost grows with the model's trainable weights, not with the data, and must stay a small share of a step.
Measured on the models `train` builds: a compiled training step (``train_on_batch``, SGD with momentum, batch 8)
with the average against the same model without it, AlexNet at 1/4 width and MobileNetV2 at alpha 0.35 on
32 px, ResNet-50 on 64 px; interleaved rounds, the order flipped each round, the median step of each. CPU, one
intra-op thread. Writes bench/results/keras_ema.json and bench/results/keras_ema.png.

    .venv/bin/python bench/bench_keras_ema.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = (("alexnet", 32, {"width": 0.25}), ("mobilenet_v2", 32, {"alpha": 0.35}), ("resnet50", 64, {}))
ROUNDS, STEPS = 7, 10


def measure(name: str, side: int, kwargs: dict) -> dict:
    import numpy as np
    import tf_keras as keras

    from pinstorm.training import keras_recipe
    from pinstorm.training.models import build_model
    from pinstorm.training.runs import FitOptions

    rng = np.random.default_rng(0)
    images = rng.random((8, side, side, 3), np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    models = {}
    for kind, decay in (("plain", None), ("ema", 0.9998)):
        keras.utils.set_random_seed(0)
        model = build_model(name, (side, side, 3), 10, **kwargs)
        recipe = FitOptions(optimizer="sgd", learning_rate=0.01, ema_decay=decay)
        model.compile(keras_recipe.optimizer(recipe, 100, model), keras_recipe.loss(recipe, 10))
        model.train_on_batch(images, labels)   # traces the step
        models[kind] = model
    timings: dict[str, list[float]] = {"plain": [], "ema": []}
    for round_number in range(ROUNDS):
        for kind in (("plain", "ema") if round_number % 2 == 0 else ("ema", "plain")):
            model = models[kind]
            started = time.perf_counter()
            for _ in range(STEPS):
                model.train_on_batch(images, labels)
            timings[kind].append((time.perf_counter() - started) / STEPS)
    plain, ema = (statistics.median(timings[k]) for k in ("plain", "ema"))
    weights = sum(int(np.prod(v.shape)) for v in models["plain"].trainable_variables)
    return {"model": name, "image_size": side, "trainable_parameters": weights, "step_ms": plain * 1e3,
            "ema_step_ms": ema * 1e3, "ema_over_plain": ema / plain, "rounds_ms": {
                k: [round(t * 1e3, 3) for t in v] for k, v in timings.items()}}


def main() -> None:
    import tensorflow as tf

    runs = []
    for name, side, kwargs in MODELS:
        row = measure(name, side, kwargs)
        print(json.dumps({k: v for k, v in row.items() if k != "rounds_ms"}), flush=True)
        runs.append(row)
    RESULTS.mkdir(exist_ok=True)
    out = {"batch_size": 8, "ema_decay": 0.9998, "optimizer": "sgd", "threads": 1, "rounds": ROUNDS,
           "steps_a_round": STEPS, "tensorflow": tf.__version__, "python": sys.version.split()[0], "runs": runs}
    (RESULTS / "keras_ema.json").write_text(json.dumps(out, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(6, 3.6))
    labels = [f"{r['model']}\n{r['trainable_parameters'] / 1e6:.1f} M weights" for r in runs]
    axis.bar(labels, [r["ema_over_plain"] for r in runs])
    axis.axhline(1.0, color="grey", lw=0.8)
    axis.set(ylabel="step time, with / without", ylim=(0, 1.3),
             title="TensorFlow step with ema_decay (batch 8, one thread)")
    figure.tight_layout()
    figure.savefig(RESULTS / "keras_ema.png", dpi=110)


if __name__ == "__main__":
    main()
