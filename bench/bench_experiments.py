"""Benchmark: what pinning a run costs, against the fit it records and a plain weights load.

AlexNet (1/4 width, 32 px) trains on the digits tree converted to Parquet, once without ``pin=``
(the baseline) and once with ``pin="bench/alexnet-digits"`` on a local board, same arguments.
Measured in the same run:

* ``pin_seconds / fit_seconds``: the pin (weights, CSV, curves, zipped TensorBoard, lineage) against
  the fit it stores;
* ``train(pin=...)`` wall time against ``train()`` wall time;
* ``load_experiment`` (pin_get from the board, lineage checks, build, load) against the baseline
  ``build_model`` + ``model.load_weights`` of the same file from the run's output folder.

Writes bench/results/experiments.json and .png. ``--quick`` trains fewer epochs.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    epochs, repeats = (2, 3) if args.quick else (6, 5)

    from pinstorm import boards, pipeline
    from pinstorm.training import load_experiment, make_strategy, train
    from pinstorm.training.models import build_model

    work = Path(tempfile.mkdtemp(prefix="pinstorm-bench-experiments-"))
    boards.board_register("local", name="bench", path=work / "board", cache=work / "cache")
    layout = pipeline.scan(pipeline.make_digits_tree(work / "tree", image_size=32))
    url = pipeline.convert(layout, str(work / "train"), split="train", progress=False).url
    strategy = make_strategy("one-device")
    common = dict(strategy=strategy, epochs=epochs, batch_size=32, image_size=32, model_kwargs={"width": 0.25},
                  input_options={"flip": False}, verbose=0, seed=0)

    train("alexnet", url, output_dir=work / "warm-up", **dict(common, epochs=1))   # tracing, imports: untimed
    started = time.perf_counter()
    plain = train("alexnet", url, output_dir=work / "plain", **common)
    plain_wall = time.perf_counter() - started
    started = time.perf_counter()
    pinned = train("alexnet", url, output_dir=work / "pinned", pin="bench/alexnet-digits", **common)
    pinned_wall = time.perf_counter() - started
    print(f"train(): {plain_wall:.2f} s; train(pin=...): {pinned_wall:.2f} s "
          f"(pin {pinned.experiment['seconds']:.3f} s)", flush=True)

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
        return min(times)

    def plain_load():
        model = build_model("alexnet", (32, 32, 3), 10, width=0.25)
        model.load_weights(plain.weights_path)

    load_plain = best(plain_load)
    load_pinned = best(lambda: load_experiment("bench/alexnet-digits"))
    weights_mb = Path(pinned.weights_path).stat().st_size / 1e6
    result = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "epochs": epochs, "weights_mb": weights_mb,
        "fit_seconds": pinned.seconds, "pin_seconds": pinned.experiment["seconds"],
        "pin_vs_fit": pinned.experiment["seconds"] / pinned.seconds,
        "train_wall_seconds": plain_wall, "train_pin_wall_seconds": pinned_wall,
        "train_pin_vs_train": pinned_wall / plain_wall,
        "load_weights_seconds": load_plain, "load_experiment_seconds": load_pinned,
        "load_experiment_vs_load_weights": load_pinned / load_plain,
    }
    print(json.dumps(result, indent=2))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "experiments.json").write_text(json.dumps(result, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    axes[0].barh(["train()", "train(pin=...)"], [plain_wall, pinned_wall], color=["#4c72b0", "#dd8452"])
    axes[0].set_xlabel("seconds")
    axes[0].set_title(f"{epochs} epochs; the pin itself: {result['pin_seconds']:.2f} s")
    axes[1].barh(["build + load_weights", "load_experiment"], [load_plain, load_pinned], color=["#4c72b0", "#dd8452"])
    axes[1].set_xlabel("seconds (best of %d)" % repeats)
    axes[1].set_title(f"loading {weights_mb:.1f} MB of weights")
    figure.tight_layout()
    figure.savefig(RESULTS / "experiments.png", dpi=100)
    boards.board_deregister("bench", persist=False)


if __name__ == "__main__":
    main()
