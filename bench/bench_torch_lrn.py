"""Benchmark torch AlexNet's LRN (`torch_models.ChannelLRN`, one banded 1x1 convolution) against
``torch.nn.LocalResponseNorm`` (pad + 3-D average pool), on this machine's CPUs.

Two measures, interleaved round by round (so a busy moment of this shared machine hits both alike),
the median of the rounds:

* the LRN layer alone, forward + backward, on AlexNet's first LRN input at three sizes (the demo's
  1/4 width at 32 px, 1/2 width at 64 px, full width at 224 px, batch 32 / 32 / 8);
* a whole AlexNet training step (Adam, cross entropy) with each LRN, at the demo's size (1/4 width,
  32 px, batch 32), the same weights and batch.

Writes bench/results/torch_lrn.json and bench/results/torch_lrn.png.

    .venv/bin/python bench/bench_torch_lrn.py [--quick] [--rounds 7]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
LAYER_SHAPES = {"1/4 width, 32 px": (32, 24, 15, 15), "1/2 width, 64 px": (32, 48, 31, 31),
                "full width, 224 px": (8, 96, 55, 55)}
LRN = dict(size=5, alpha=5e-4, beta=0.75, k=2.0)   # torch_models._normalize's


def _seconds(step, repeats: int) -> float:
    step()   # warm: allocator, one-time kernels
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats


def _layer_step(module, x):
    def step():
        module(x).sum().backward()
    return step


def _train_step(lrn_class, torch):
    from pinstorm.training import torch_models

    def build():
        original = torch_models._normalize
        torch_models._normalize = lambda kind, channels: lrn_class(**LRN) if kind == "lrn" else original(kind, channels)
        try:
            torch.manual_seed(0)
            return torch_models.build_torch_model("alexnet", 10, 32, width=0.25, normalization="lrn", dropout=0.5)
        finally:
            torch_models._normalize = original

    model = build()
    optimizer = torch.optim.Adam(model.parameters(), 1e-3)
    generator = torch.Generator().manual_seed(1)
    images, labels = torch.rand(32, 3, 32, 32, generator=generator), torch.randint(0, 10, (32,), generator=generator)

    def step():
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 rounds, fewer repeats")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    repeats = 5 if args.quick else 20

    import torch

    from pinstorm.training.torch_models import ChannelLRN

    kinds = {"ChannelLRN": ChannelLRN, "nn.LocalResponseNorm": torch.nn.LocalResponseNorm}
    cases = {}
    for label, shape in LAYER_SHAPES.items():
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), requires_grad=True)
        for kind, cls in kinds.items():
            cases[(f"layer {label}", kind)] = _layer_step(cls(**LRN), x)
    for kind, cls in kinds.items():
        cases[("AlexNet training step, 1/4 width, 32 px, batch 32", kind)] = _train_step(cls, torch)

    times = {case: [] for case in cases}
    for _ in range(rounds):
        for case, step in cases.items():
            times[case].append(_seconds(step, repeats))
    rows = []
    for name in dict.fromkeys(name for name, _ in cases):
        ours, theirs = statistics.median(times[(name, "ChannelLRN")]), statistics.median(times[(name, "nn.LocalResponseNorm")])
        rows.append({"case": name, "ChannelLRN ms": ours * 1e3, "nn.LocalResponseNorm ms": theirs * 1e3,
                     "ChannelLRN / nn.LocalResponseNorm": ours / theirs,
                     "rounds ms": {kind: [t * 1e3 for t in times[(name, kind)]] for kind in kinds}})
        print(f"{name:52s} ChannelLRN {ours * 1e3:8.2f} ms  nn.LocalResponseNorm {theirs * 1e3:8.2f} ms  "
              f"ratio {ours / theirs:.2f}")

    RESULTS.mkdir(exist_ok=True)
    result = {"cpus": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "python": platform.python_version(), "rounds": rounds, "repeats": repeats, "rows": rows}
    (RESULTS / "torch_lrn.json").write_text(json.dumps(result, indent=1) + "\n")
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
    axis.set_xlabel(f"ms (median of {rounds} interleaved rounds, {os.cpu_count()} CPUs)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "torch_lrn.png", dpi=100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
