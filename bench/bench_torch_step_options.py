"""What `train_torch`'s two step options cost: a moving average of the weights (``ema_decay``) and gradient
accumulation (``accumulate_batches``).

The moving average adds one update of every weight after each optimizer step: its cost grows with the
model's parameters, not with the data, and must stay a small share of a step. Measured on the models
pinstorm trains: the average's update alone (ms, median) against a training step at batch 8 and 32 px
(AlexNet at 1/4 width, ResNet-small) or 64 px (ResNet-50, pinstorm's own of torchvision's shape), the
baseline timed in the same run. Accumulation changes no work per image: N batches of B cost what N steps
of B cost, less N - 1 optimizer updates; measured as a step of 4 accumulated batches of 8 against 4 steps
of one batch of 8 (the same images, interleaved). CPU, one thread.
Writes bench/results/torch_step_options.json and bench/results/torch_step_options.png.

    .venv/bin/python bench/bench_torch_step_options.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = (("alexnet", 32, {"width": 0.25}), ("resnet_small", 32, {"width": 0.5}), ("resnet50", 64, {}))
ROUNDS = 7


def _setup(name: str, side: int, kwargs: dict):
    import torch

    from pinstorm.training.torch_models import build_torch_model

    torch.manual_seed(0)
    model = build_torch_model(name, 10, side, **kwargs)
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    images, labels = torch.rand(8, 3, side, side), torch.randint(0, 10, (8,))
    return model, optim, images, labels


def measure(name: str, side: int, kwargs: dict) -> dict:
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model, optim, images, labels = _setup(name, side, kwargs)
    average = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9998), use_buffers=True)

    def backward(scale: float = 1.0) -> None:
        (torch.nn.functional.cross_entropy(model(images), labels) * scale).backward()

    def plain_steps() -> None:   # 4 steps of one batch
        for _ in range(4):
            optim.zero_grad(set_to_none=True)
            backward()
            optim.step()

    def accumulated_step() -> None:   # one step of 4 batches
        optim.zero_grad(set_to_none=True)
        for _ in range(4):
            backward(0.25)
        optim.step()

    def update() -> None:
        average.update_parameters(model)

    timings: dict[str, list[float]] = {"steps": [], "accumulated": [], "update": []}
    plain_steps()
    accumulated_step()
    update()
    for round_number in range(ROUNDS):
        order = ("steps", "accumulated", "update") if round_number % 2 == 0 else ("update", "accumulated", "steps")
        for kind in order:   # interleaved, the order flipped each round
            started = time.perf_counter()
            {"steps": plain_steps, "accumulated": accumulated_step, "update": update}[kind]()
            timings[kind].append(time.perf_counter() - started)
    steps, accumulated, update_s = (statistics.median(timings[k]) for k in ("steps", "accumulated", "update"))
    step = steps / 4
    return {"model": name, "image_size": side, "parameters": sum(p.numel() for p in model.parameters()),
            "step_ms": step * 1e3, "ema_update_ms": update_s * 1e3, "ema_share_of_step": update_s / step,
            "four_steps_ms": steps * 1e3, "accumulated_step_ms": accumulated * 1e3,
            "accumulated_over_four_steps": accumulated / steps}


def main() -> None:
    import torch

    torch.set_num_threads(1)
    runs = []
    for name, side, kwargs in MODELS:
        row = measure(name, side, kwargs)
        print(json.dumps(row), flush=True)
        runs.append(row)
    RESULTS.mkdir(exist_ok=True)
    out = {"batch_size": 8, "accumulate_batches": 4, "ema_decay": 0.9998, "threads": 1, "rounds": ROUNDS,
           "torch": torch.__version__, "python": sys.version.split()[0], "runs": runs}
    (RESULTS / "torch_step_options.json").write_text(json.dumps(out, indent=1) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, (ema, accumulate) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [f"{r['model']}\n{r['parameters'] / 1e6:.1f} M params" for r in runs]
    ema.bar(labels, [100 * r["ema_share_of_step"] for r in runs])
    ema.set(ylabel="% of a training step", title="moving-average update, per step (batch 8)")
    accumulate.bar(labels, [r["accumulated_over_four_steps"] for r in runs])
    accumulate.axhline(1.0, color="grey", lw=0.8)
    accumulate.set(ylabel="time, 1 step of 4 batches / 4 steps", title="accumulate_batches=4 (same images)",
                   ylim=(0, 1.2))
    figure.tight_layout()
    figure.savefig(RESULTS / "torch_step_options.png", dpi=110)


if __name__ == "__main__":
    main()
