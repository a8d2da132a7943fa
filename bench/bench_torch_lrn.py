"""Benchmark torch AlexNet's LRN (`torch_models.ChannelLRN`, one banded 1x1 convolution) against
``torch.nn.LocalResponseNorm`` (pad + 3-D average pool), on this machine's CPUs.

Two measures, interleaved round by round (so a busy moment of this shared machine hits both alike),
the median of the rounds:

* the LRN layer alone, forward + backward, on AlexNet's first LRN input at three sizes (the demo's
  1/4 width at 32 px, 1/2 width at 64 px, full width at 224 px, batch 32 / 32 / 8);
* a whole AlexNet training step (Adam, cross entropy) with each LRN, at the demo's size (1/4 width,
  32 px, batch 32), the same weights and batch.

With ``--device cuda`` (the lent GPU) it times the same on the GPU under bf16 autocast and checks the
layer's agreement with a float32 ``nn.LocalResponseNorm`` under float16 and bfloat16 autocast (the reason
ChannelLRN runs in float32 there: a sum of squares overflows float16).

Writes bench/results/torch_lrn.json and bench/results/torch_lrn.png (``--out``: another folder).

    .venv/bin/python bench/bench_torch_lrn.py [--quick] [--rounds 7] [--device cuda] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import use_checkout  # noqa: E402  (pinstorm from this checkout where nothing is installed)

RESULTS = Path(__file__).resolve().parent / "results"
LAYER_SHAPES = {"1/4 width, 32 px": (32, 24, 15, 15), "1/2 width, 64 px": (32, 48, 31, 31),
                "full width, 224 px": (8, 96, 55, 55)}
LRN = dict(size=5, alpha=5e-4, beta=0.75, k=2.0)   # torch_models._normalize's


def _seconds(step, repeats: int, synchronize=lambda: None) -> float:
    step()   # warm: allocator, one-time kernels
    synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    synchronize()
    return (time.perf_counter() - started) / repeats


def _autocast_agreement(torch, device: str) -> dict:
    """Largest relative difference from float32 nn.LocalResponseNorm, per autocast dtype, on activations
    scaled up as a trained AlexNet's first layer can make them (squares past float16's 65,504)."""
    from pinstorm.training.torch_models import ChannelLRN

    x = torch.randn(8, 96, 55, 55, generator=torch.Generator().manual_seed(0)).to(device) * 300
    reference = torch.nn.LocalResponseNorm(**LRN)(x)
    modules = {"ChannelLRN": ChannelLRN(**LRN), "nn.LocalResponseNorm": torch.nn.LocalResponseNorm(**LRN)}
    found = {}
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast(device, dtype=dtype):
            for name, module in modules.items():
                y = module(x.to(dtype)).float()
                error = ((y - reference).abs() / reference.abs().clamp_min(1e-6)).max().item()
                found[f"{name} under {str(dtype).split('.')[-1]} autocast: max relative error"] = error
    return found


def _layer_step(module, x, torch, amp):
    def step():
        with torch.autocast(x.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            y = module(x)
        y.float().sum().backward()
    return step


def _train_step(lrn_class, torch, device, amp):
    from pinstorm.training import torch_models

    def build():
        original = torch_models._normalize
        torch_models._normalize = lambda kind, channels: lrn_class(**LRN) if kind == "lrn" else original(kind, channels)
        try:
            torch.manual_seed(0)
            if device == "cpu":
                return torch_models.build_torch_model("alexnet", 10, 32, width=0.25, normalization="lrn", dropout=0.5)
            return torch_models.build_torch_model("alexnet", 1000, 224, normalization="lrn", dropout=0.5).to(device)
        finally:
            torch_models._normalize = original

    model = build()
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    generator = torch.Generator().manual_seed(1)
    batch, size, classes = (32, 32, 10) if device == "cpu" else (256, 224, 1000)
    images = torch.rand(batch, 3, size, size, generator=generator).to(device)
    labels = torch.randint(0, classes, (batch,), generator=generator).to(device)

    def step():
        with torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, fewer repeats")
    parser.add_argument("--device", default="cpu", help="cpu (float32) or cuda (bf16 autocast, full-size AlexNet step)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    repeats = 5 if args.quick else 20

    import torch

    use_checkout()
    from pinstorm.training.torch_models import ChannelLRN

    device = args.device
    amp = None if device == "cpu" else torch.bfloat16
    synchronize = (lambda: None) if device == "cpu" else torch.cuda.synchronize
    step_name = ("AlexNet training step, 1/4 width, 32 px, batch 32" if device == "cpu"
                 else "AlexNet training step, full width, 224 px, batch 256, bf16")
    kinds = {"ChannelLRN": ChannelLRN, "nn.LocalResponseNorm": torch.nn.LocalResponseNorm}
    cases = {}
    for label, shape in LAYER_SHAPES.items():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
        for kind, cls in kinds.items():
            cases[(f"layer {label}", kind)] = _layer_step(cls(**LRN), x, torch, amp)
    for kind, cls in kinds.items():
        cases[(step_name, kind)] = _train_step(cls, torch, device, amp)

    times = {case: [] for case in cases}
    for _ in range(rounds):
        for case, step in cases.items():
            times[case].append(_seconds(step, repeats, synchronize))
    rows = []
    for name in dict.fromkeys(name for name, _ in cases):
        ours, theirs = statistics.median(times[(name, "ChannelLRN")]), statistics.median(times[(name, "nn.LocalResponseNorm")])
        rows.append({"case": name, "ChannelLRN ms": ours * 1e3, "nn.LocalResponseNorm ms": theirs * 1e3,
                     "ChannelLRN / nn.LocalResponseNorm": ours / theirs,
                     "rounds ms": {kind: [t * 1e3 for t in times[(name, kind)]] for kind in kinds}})
        print(f"{name:52s} ChannelLRN {ours * 1e3:8.2f} ms  nn.LocalResponseNorm {theirs * 1e3:8.2f} ms  "
              f"ratio {ours / theirs:.2f}")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "python": platform.python_version(), "rounds": rounds, "repeats": repeats, "device": device,
              "device name": torch.cuda.get_device_name() if device != "cpu" else platform.processor(),
              "autocast": str(amp), "rows": rows}
    if device != "cpu":
        result["agreement"] = _autocast_agreement(torch, device)
        print(json.dumps(result["agreement"], indent=1))
    (out / "torch_lrn.json").write_text(json.dumps(result, indent=1) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    figure, axis = plt.subplots(figsize=(9, 3.5))
    positions = range(len(rows))
    axis.barh([p + 0.2 for p in positions], [r["nn.LocalResponseNorm ms"] for r in rows], 0.4,
              label="nn.LocalResponseNorm", color="#c44e52")
    axis.barh([p - 0.2 for p in positions], [r["ChannelLRN ms"] for r in rows], 0.4, label="ChannelLRN", color="#4c72b0")
    axis.set_yticks(list(positions), [r["case"] for r in rows])
    axis.set_xscale("log")
    where = f"{os.cpu_count()} CPUs" if device == "cpu" else result["device name"] + ", bf16 autocast"
    axis.set_xlabel(f"ms (median of {rounds} interleaved rounds, {where})")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "torch_lrn.png", dpi=100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
