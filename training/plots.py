"""Training-curve plots (PNG) from the metrics CSV a fit writes.

The CSV, not Keras's History, is the source: a run resumed from a backup appends to it, so the
plot shows the whole run. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path


def read_metrics_csv(path) -> dict[str, list[float]]:
    """Columns of a Keras CSVLogger file as float lists (``epoch`` included)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            try:
                number = float(value)
            except (TypeError, ValueError):  # Keras writes "NA" for metrics an epoch did not have
                number = math.nan
            columns.setdefault(key, []).append(number)
    return columns


def _has_values(values) -> bool:
    return any(not math.isnan(v) for v in values)


def plot_curves(metrics: dict[str, list[float]], png_path, title: str = "training") -> Path:
    """Loss and accuracy per epoch (train and validation), and the learning rate where it was scheduled,
    into ``png_path``, written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [int(e) + 1 for e in metrics.get("epoch", range(len(metrics.get("loss", []))))]
    panels = [name for name in ("loss", "accuracy", "learning_rate") if _has_values(metrics.get(name, []))]
    figure, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 3.6), squeeze=False)
    for axis, name in zip(axes[0], panels):
        axis.plot(epochs, metrics[name], marker="o", label=name if name == "learning_rate" else f"train {name}")
        if _has_values(metrics.get(f"val_{name}", [])):
            axis.plot(epochs, metrics[f"val_{name}"], marker="s", label=f"validation {name}")
        if _has_values(metrics.get(f"val_ema_{name}", [])):   # the weights' moving average (torch's ema_decay)
            axis.plot(epochs, metrics[f"val_ema_{name}"], marker="^", label=f"validation {name}, EMA")
        axis.set_xlabel("epoch")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(figure, png_path)


def save_figure(figure, path: Path) -> Path:
    """Write a matplotlib figure as PNG under a temporary name, then rename: never a half-written plot."""
    import matplotlib.pyplot as plt

    temporary = path.with_name(f".{path.name}.tmp")
    figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    os.replace(temporary, path)
    return path
