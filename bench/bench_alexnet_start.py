"""How AlexNet's starting weights decide whether the demo learns: Keras's default Glorot-uniform against the
He-uniform start its ReLU layers now take (`training.models.RELU_INIT`).

With Glorot, the variance of the signal halves at each of AlexNet's seven ReLU layers, and LRN divides it
again; the demo's digits AlexNet (1/4 width, LRN, dropout 0.5, Adam 1e-3) then sat at chance for epochs
before it learned, and in one `make demo` of 15 for all 12 epochs. He-uniform keeps the scale. Trains the
demo's full size (~1,440 digits, 32 px, MirroredStrategy on two CPU devices) for each start and seed, one
fresh process a run, the two starts interleaved seed by seed. Writes bench/results/alexnet_start.json and
.png: validation accuracy after every epoch, and how many epochs each run stayed at chance (< 0.2).

    .venv/bin/python bench/bench_alexnet_start.py [--seeds 5] [--epochs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
STARTS = ("glorot_uniform", "he_uniform")
CHANCE = 0.2   # ten classes: 0.1 is chance; below 0.2 nothing has been learned yet


def one_run(start: str, seed: int, epochs: int, data: Path) -> dict:
    """Trains the demo's AlexNet from `start` in this process and returns its history."""
    from pinstorm.training import models
    from pinstorm.training.strategy import configure_cpu_devices, make_strategy

    configure_cpu_devices(2)
    models.RELU_INIT = start
    from pinstorm.training.demo import DIGIT_AUGMENTATION, SIZES
    from pinstorm.training.fit import alexnet_train

    settings = SIZES["full"]
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="nccl")
    with tempfile.TemporaryDirectory() as out:
        result = alexnet_train(
            str(data / "train"), strategy=strategy, epochs=epochs, batch_size=settings["batch_size"],
            image_size=settings["image_size"], width=settings["width"], normalization=settings["normalization"],
            dropout=settings["dropout"], validation_data=str(data / "val"), output_dir=Path(out) / "run",
            input_options=DIGIT_AUGMENTATION, seed=seed, verbose=0, learning_rate=settings["learning_rate"])
    val = [round(v, 4) for v in result.history["val_accuracy"]]
    return {"start": start, "seed": seed, "val_accuracy": val, "loss": [round(v, 4) for v in result.history["loss"]],
            "epochs_at_chance": next((i for i, v in enumerate(val) if v >= CHANCE), len(val))}


def prepare(data: Path) -> None:
    from pinstorm.pipeline import convert, make_digits_tree, scan
    from pinstorm.training.demo import SIZES

    layout = scan(make_digits_tree(data / "tree", image_size=SIZES["full"]["tree_image_size"]))
    convert(layout, str(data / "train"), progress=False)
    convert(layout, str(data / "val"), split="val", progress=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--one", nargs=3, metavar=("START", "SEED", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        start, seed, data = args.one
        print("RUN " + json.dumps(one_run(start, int(seed), args.epochs, Path(data))), flush=True)
        return
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder)
        prepare(data)
        for seed in range(args.seeds):
            for start in (STARTS if seed % 2 == 0 else tuple(reversed(STARTS))):
                done = subprocess.run([sys.executable, __file__, "--epochs", str(args.epochs), "--one", start,
                                       str(seed), str(data)], capture_output=True, text=True, check=True)
                run = json.loads(done.stdout.split("RUN ", 1)[1])
                print(json.dumps(run), flush=True)
                runs.append(run)
    summary = {}
    for start in STARTS:
        mine = [r for r in runs if r["start"] == start]
        summary[start] = {"final_val_accuracy": [r["val_accuracy"][-1] for r in mine],
                          "median_final": statistics.median(r["val_accuracy"][-1] for r in mine),
                          "epochs_at_chance": [r["epochs_at_chance"] for r in mine],
                          "median_first_epoch": statistics.median(r["val_accuracy"][0] for r in mine)}
    RESULTS.mkdir(exist_ok=True)
    out = {"model": "alexnet, 1/4 width, LRN, dropout 0.5", "data": "demo full: digits at 32 px", "optimizer":
           "adam 1e-3", "strategy": "mirrored x2 CPU", "epochs": args.epochs, "chance_below": CHANCE,
           "summary": summary, "runs": runs}
    (RESULTS / "alexnet_start.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axis = plt.subplots(figsize=(6.4, 4))
    colours = {"glorot_uniform": "tab:red", "he_uniform": "tab:blue"}
    for run in runs:
        epochs = range(1, len(run["val_accuracy"]) + 1)
        label = run["start"] if run["seed"] == 0 else None
        axis.plot(epochs, run["val_accuracy"], color=colours[run["start"]], alpha=0.7, lw=1.2, label=label)
    axis.axhline(0.1, color="grey", lw=0.8, ls=":")
    axis.set(xlabel="epoch", ylabel="validation accuracy", ylim=(0, 1.02),
             title=f"The demo's AlexNet from two starts ({args.seeds} seeds each)")
    axis.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(RESULTS / "alexnet_start.png", dpi=110)


if __name__ == "__main__":
    main()
