"""Does splitting JPEG decode between the CPU and the GPU feed AlexNet faster than either alone? (issue 32)

    python3 bench/gpu_hybrid_probe.py --out bench/results/gpu        # on a lent GPU (~3 minutes, 16 cores)
    python3 bench/gpu_hybrid_probe.py --smoke --out DIR              # the same code paths on the CPU, toy size

AlexNet trains at ~12,900 img/s on synthetic input on one H100, but CPU decode on 16 cores feeds ~6,300 and
nvJPEG (which shares the SMs with training) ~7,500-9,200. ``make_torch_loader(decode="gpu", cpu_share=S)``
has the loader's CPU workers decode the share S of the batches whole while nvJPEG decodes the rest. First
where the time goes with GPU decode alone and with a share (`where_time_goes`), then, in interleaved
rounds: CPU decode alone (all cores), GPU decode alone, and both at a few shares. Writes
``gpu_hybrid_probe.json`` (medians of the rounds, and each round).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (beside this file)


def cpu_seconds() -> dict:
    """CPU seconds so far: of each thread of this process (by native id), and of all its descendant
    processes together (the DataLoader workers), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")

    def used(stat_path) -> tuple[int, float] | None:
        try:
            fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks   # ppid, utime + stime

    threads = {int(tid): seconds[1] for tid in os.listdir("/proc/self/task")
               if (seconds := used(f"/proc/self/task/{tid}/stat"))}
    processes = {int(pid): found for pid in os.listdir("/proc") if pid.isdigit()
                 and (found := used(f"/proc/{pid}/stat"))}
    family, descendants = {os.getpid()}, 0.0
    grew = True
    while grew:   # descendants: children of the family, until no more join
        grew = False
        for pid, (ppid, seconds) in processes.items():
            if ppid in family and pid not in family:
                family.add(pid)
                descendants += seconds
                grew = True
    return {"threads": threads, "descendants": descendants}


def core_shares(before: dict, after: dict, seconds: float) -> dict:
    """Each thread's share of one core between two `cpu_seconds`, by its Python name (other threads of
    torch, CUDA and libraries summed as "other threads"), and the descendant processes' cores together."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    shares: Counter = Counter()
    for tid, used in after["threads"].items():
        shares[names.get(tid, "other threads")] += (used - before["threads"].get(tid, 0.0)) / seconds
    shares["worker processes (cores)"] = (after["descendants"] - before["descendants"]) / seconds
    return {name: round(share, 3) for name, share in shares.most_common()}


def gpu_busy(torch, device, batches, trainer, steps: int) -> dict:
    """How much of the wall time of `steps` training steps some kernel ran on the GPU (torch.profiler's
    CUDA activity: the union of kernel intervals), and the kernels that took most of it. A GPU busy ~100 %
    is full (only less GPU work helps); one far below waits on the CPU side."""
    if device.type != "cuda":
        return {"gpu_busy": None, "why": "no CUDA device"}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        gpu_check._sync(torch, device)
        started = time.perf_counter()
        for _ in range(steps):
            trainer.step(*next(batches))
        gpu_check._sync(torch, device)
        wall_us = (time.perf_counter() - started) * 1e6
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, reach, by_name = 0.0, float("-inf"), Counter()
    for start, end, name in kernels:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
        by_name[name[:80]] += end - start
    return {"gpu_busy": busy / wall_us if wall_us else None, "kernels": len(kernels), "steps": steps,
            "wall_ms": wall_us / 1e3,
            "top_kernels_ms": {name: round(us / 1e3, 2) for name, us in by_name.most_common(12)}}


def where_time_goes(*, torch, trainer, url, batch, image_size, cores, settings, cpu_share: float = 0.0) -> dict:
    """AlexNet fed by GPU decode (with `cpu_share`) as `gpu_check.fed` feeds it, with each thread's core share
    over the timed part (`core_shares`) and then the GPU's busy share over a few more steps (`gpu_busy`)."""
    marks = {}

    def marked(batches):
        for count, item in enumerate(batches):
            if count == settings.warmup:
                marks["start"] = (time.perf_counter(), cpu_seconds())
            yield item

    with gpu_check._Cores(cores):
        loader = gpu_check._loader(url, batch=batch, image_size=image_size, cores=cores, decode="gpu",
                                   device=trainer.device, cpu_share=cpu_share)
        batches = iter(loader)
        try:
            result = gpu_check._timed(torch, trainer.device, marked(batches), lambda b: trainer.step(*b),
                                      warmup=settings.warmup, seconds=settings.seconds,
                                      max_batches=settings.max_batches)
            ended, after = time.perf_counter(), cpu_seconds()
            if "start" in marks:
                result["core_shares"] = core_shares(marks["start"][1], after, ended - marks["start"][0])
            try:
                result.update(gpu_busy(torch, trainer.device, batches, trainer, steps=settings.profile_steps))
            except Exception as error:   # noqa: BLE001 - the profiler is a diagnosis; the probe goes on
                result["gpu_busy_error"] = f"{type(error).__name__}: {str(error)[:200]}"
        finally:
            del batches
    return result


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
    settings.profile_steps = 2 if settings.smoke else 10
    gpu_check.use_checkout()
    import torch

    from pinstorm.pipeline import convert, scan

    device = torch.device("cuda" if torch.cuda.is_available() and not settings.smoke else "cpu")
    cpus = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="pinstorm-hybrid-"))
    atexit.register(shutil.rmtree, work, True)   # its generated images and Parquet go with it
    batch, size = (8, 64) if settings.smoke else (256, 224)
    classes, per_class, image = (4, 8, (120, 160)) if settings.smoke else (1000, 10, (375, 500))
    gpu_check.make_tree(work / "tree", classes=classes, per_class=per_class, size=image, workers=cpus)
    url = convert(scan(work / "tree"), str(work / "ds"), split="train", progress=False).url
    trainer = gpu_check.Trainer(torch, "alexnet", device, image_size=size, classes=classes)
    common = dict(torch=torch, trainer=trainer, url=url, batch=batch, image_size=size, settings=settings)
    shares = (0.5,) if settings.smoke else (0.25, 0.4, 0.55)
    configs = {
        "synthetic": lambda: gpu_check.synthetic(torch, trainer, batch=batch, image_size=size, classes=classes,
                                                 settings=settings),
        "cpu decode": lambda: gpu_check.fed(cores=cpus, decode="cpu", **common),
        "gpu decode": lambda: gpu_check.fed(cores=cpus, decode="gpu", **common),
    }
    for share in shares:
        configs[f"gpu decode, cpu_share {share:g}"] = (
            lambda s=share: gpu_check.fed(cores=cpus, decode="gpu", cpu_share=s, **common))
    diagnosis = {}
    for share in (0.0, shares[len(shares) // 2]):
        name = f"cpu_share {share:g}"
        try:
            diagnosis[name] = where_time_goes(cores=cpus, cpu_share=share, **common)
        except Exception as error:   # noqa: BLE001 - recorded; the rounds still run
            diagnosis[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
        print(f"where the time goes, gpu decode, {name}: {json.dumps(diagnosis[name])}", flush=True)
        save(settings, {"partial": True, "where_time_goes": diagnosis})
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
            save(settings, {"partial": True, "where_time_goes": diagnosis, "rounds_img_s": rounds})
    medians = {name: statistics.median(r) for name, r in rounds.items() if r}
    cpu_alone = medians["cpu decode"] or 1e-9
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "cpus": cpus,
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "smoke": settings.smoke, "batch": batch, "image_size": size, "seconds": settings.seconds,
           "medians_img_s": medians, "of_cpu_decode": {n: m / cpu_alone for n, m in medians.items()},
           "rounds_img_s": rounds, "where_time_goes": diagnosis}
    save(settings, out)
    for name, m in medians.items():
        print(f"{name:<45} {m:9,.0f} img/s  {m / cpu_alone:5.2f}x cpu decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
