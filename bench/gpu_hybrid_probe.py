"""Does splitting JPEG decode between the CPU and the GPU feed AlexNet faster than either alone? (issue 32)

    python3 bench/gpu_hybrid_probe.py --out bench/results/gpu        # on a lent GPU (~3 minutes, 16 cores)
    python3 bench/gpu_hybrid_probe.py --smoke --out DIR              # the same code paths on the CPU, toy size

AlexNet trains at ~12,900 img/s on synthetic input on one H100, but CPU decode on 16 cores feeds ~6,300 and
nvJPEG (which shares the SMs with training) ~7,500-9,200. Two loaders over disjoint shards of the same
dataset -- one decoding on CPU workers, one with ``decode="gpu"`` -- run at once and their batches are
interleaved in a fixed pattern (``cpu_share`` of the batches from the CPU loader). In one run, interleaved
rounds of: CPU decode alone (all cores), GPU decode alone, and the hybrid at a few CPU shares and core
splits. Writes ``gpu_hybrid_probe.json`` (medians of the rounds, and each round).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (beside this file)


def interleave(cpu_batches, gpu_batches, pattern: str):
    """Endless batches taken in turn from the two loaders, by `pattern` ("cg": one each, "cgg": one CPU, two GPU)."""
    sources = {"c": cpu_batches, "g": gpu_batches}
    while True:
        for which in pattern:
            yield next(sources[which])


def hybrid(*, torch, trainer, url, batch, image_size, cpu_workers, gpu_workers, pattern, settings) -> dict:
    from pinstorm.pipeline import make_torch_loader

    device = trainer.device
    parts = len(pattern)
    common = dict(batch_size=batch, image_size=image_size, seed=0, num_epochs=None, drop_remainder=True)
    # disjoint row groups: each loader reads the shard (of len(pattern)) of its letter's first place; the
    # epochs are endless, so a loader asked for more batches than its shard holds simply goes round again
    # forkserver: the second loader's workers must not be forked while the first one's pin-memory and
    # device threads run (a fork then copies their held locks: the first H100 run hung here)
    context = "forkserver"
    cpu = make_torch_loader(url, shard=(pattern.index("c"), parts), num_workers=cpu_workers,
                            pin_memory=device.type == "cuda", multiprocessing_context=context,
                            dtype=gpu_check.torch_uint8() if device.type == "cuda" else None,
                            prefetch_factor=2, **common)
    gpu = make_torch_loader(url, shard=(pattern.index("g"), parts), decode="gpu", device=device,
                            num_workers=gpu_workers, multiprocessing_context=context, **common)
    cpu_it, gpu_it = iter(cpu), iter(gpu)
    try:
        return gpu_check._timed(torch, device, interleave(cpu_it, gpu_it, pattern), lambda b: trainer.step(*b),
                                warmup=settings.warmup, seconds=settings.seconds, max_batches=settings.max_batches)
    finally:
        del cpu_it, gpu_it


def save(settings, data: dict) -> None:
    """The figures so far, after each measurement: a run stopped at its time limit still reports."""
    folder = Path(settings.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu_hybrid_probe.json").write_text(json.dumps(data, indent=2))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    settings = parser.parse_args(argv)
    settings.warmup, settings.max_batches = (2, 6) if settings.smoke else (5, 10_000)
    gpu_check.use_checkout()
    import torch

    from pinstorm.pipeline import convert, scan

    device = torch.device("cuda" if torch.cuda.is_available() and not settings.smoke else "cpu")
    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="pinstorm-hybrid-"))
    batch, size = (8, 64) if settings.smoke else (256, 224)
    classes, per_class, image = (4, 8, (120, 160)) if settings.smoke else (1000, 10, (375, 500))
    gpu_check.make_tree(work / "tree", classes=classes, per_class=per_class, size=image, workers=cpus)
    url = convert(scan(work / "tree"), str(work / "ds"), split="train", progress=False).url
    trainer = gpu_check.Trainer(torch, "alexnet", device, image_size=size, classes=classes)
    common = dict(torch=torch, trainer=trainer, url=url, batch=batch, image_size=size, settings=settings)
    loop = 1   # the training loop's own core
    configs = {
        "synthetic": lambda: gpu_check.synthetic(torch, trainer, batch=batch, image_size=size, classes=classes,
                                                 settings=settings),
        "cpu decode": lambda: gpu_check.fed(cores=cpus, decode="cpu", **common),
        "gpu decode": lambda: gpu_check.fed(cores=cpus, decode="gpu", **common),
    }
    for pattern in ("cg", "ccg", "cgg"):
        for gpu_workers in (2, 4):
            cpu_workers = max(1, cpus - loop - gpu_workers)
            configs[f"hybrid {pattern} cpu_workers={cpu_workers} gpu_workers={gpu_workers}"] = (
                lambda p=pattern, c=cpu_workers, g=gpu_workers: hybrid(
                    cpu_workers=c, gpu_workers=g, pattern=p, **common))
    rounds: dict[str, list[float]] = {name: [] for name in configs}
    for round_ in range(settings.rounds):
        for name, measure in configs.items():
            try:
                rate = measure()["images_per_second"]
            except Exception as error:   # noqa: BLE001 - recorded; the other configurations still run
                rate = 0.0
                print(f"{name}: {type(error).__name__}: {str(error)[:200]}")
            rounds[name].append(rate)
            print(f"round {round_} {name:<45} {rate:9,.0f} img/s", flush=True)
            save(settings, {"partial": True, "rounds_img_s": rounds})
    medians = {name: statistics.median(r) for name, r in rounds.items() if r}
    cpu_alone = medians["cpu decode"] or 1e-9
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "cpus": cpus,
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "smoke": settings.smoke, "batch": batch, "image_size": size, "seconds": settings.seconds,
           "medians_img_s": medians, "of_cpu_decode": {n: m / cpu_alone for n, m in medians.items()},
           "rounds_img_s": rounds}
    save(settings, out)
    for name, m in medians.items():
        print(f"{name:<45} {m:9,.0f} img/s  {m / cpu_alone:5.2f}x cpu decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
