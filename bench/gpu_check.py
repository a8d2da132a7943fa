"""The prepared GPU check: how fast pinstorm's PyTorch path feeds and trains one GPU, in one command.

    make gpu-wheels                            # here: the few small wheels the GPU machine lacks, into .whl/
    make gpu-check                             # there: install them into /tmp/site, run the check
    python3 bench/gpu_check.py                 # on a GPU machine (<= 8 minutes on one H100, 16 cores)
    python3 bench/gpu_check.py --smoke         # the same code paths on the CPU at toy size (the test suite)
    python3 bench/gpu_check.py --plot FILE     # the PNG of a JSON it wrote (where matplotlib is installed)

It generates ImageNet-size JPEGs (~500x375, ~110 KB: smooth random fields with edges and noise, drawn with
numpy and encoded by Pillow, so nothing is downloaded and no scikit-learn is needed) in an ILSVRC tree of
1,000 classes, converts them with `pipeline.convert`, and measures in one run:

(a) ResNet-50 training img/s on synthetic input already on the GPU (bf16 autocast, channels_last): the
    GPU's own limit;
(b) the same fed by `make_torch_loader` with CPU decode on 4, 8 and 16 cores (the process and its
    DataLoader workers pinned to that many cores);
(c) the same with GPU decode (`decode="gpu"`: nvJPEG, batched), and with both decoding at once
    (``cpu_share``: the CPU workers decode that share of the batches, `--cpu-share`, default 0.4);
(d) the decode rate alone: CPU decode on each core count, and GPU decode;
(e) AlexNet the same ((a), CPU decode on all cores, GPU decode, both);

each with its input-stall share (1 - fed / synthetic) and peak GPU memory. Writes
``bench/results/gpu/gpu_check.json`` (naming the device, the cores and every setting) and, where matplotlib
imports, ``gpu_check.png``. It needs only torch, torchvision, pyarrow, fsspec, numpy, pandas, Pillow and
pinstorm from the checkout (with its small pure dependencies).
"""

from __future__ import annotations

import argparse
import atexit
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "gpu"


def use_checkout() -> None:
    """Import pinstorm from this checkout when it is not installed (the lent GPU machine has no venv):
    the layers live beside `pinstorm/` (pyproject's package-dir), so the checkout joins its search path."""
    try:
        import pinstorm.pipeline  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT))
    import pinstorm

    if str(ROOT) not in pinstorm.__path__:
        pinstorm.__path__.append(str(ROOT))


# --------------------------------------------------------------------------- data

def _jpeg(seed: int, size: tuple[int, int], quality: int = 90) -> bytes:
    """One photo-like JPEG: a smooth random field (upsampled noise), a few hard edges, fine noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    height, width = size
    coarse = rng.random((height // 32 + 2, width // 32 + 2, 3)) * 255
    image = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((width, height), Image.BICUBIC),
                       dtype=np.float32)
    for _ in range(3):   # edges: rectangles of another colour
        y, x = rng.integers(0, height // 2), rng.integers(0, width // 2)
        image[y:y + rng.integers(20, height // 2), x:x + rng.integers(20, width // 2)] = rng.random(3) * 255
    image += rng.normal(0, 12, image.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=quality)
    return buffer.getvalue()


def _write_class(args) -> int:
    folder, wnid, first, count, size = args
    folder = Path(folder) / wnid
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for i in range(count):
        data = _jpeg(first + i, size)
        (folder / f"{wnid}_{i + 1}.JPEG").write_bytes(data)
        written += len(data)
    return written


def make_tree(root: Path, *, classes: int, per_class: int, size, workers: int) -> dict:
    """An ILSVRC train tree (`pipeline.scan` reads it) of `classes` x `per_class` JPEGs, made in parallel."""
    started = time.perf_counter()
    train = root / "ILSVRC" / "Data" / "CLS-LOC" / "train"
    wnids = [f"n{90000000 + c:08d}" for c in range(classes)]
    jobs = [(str(train), wnid, c * per_class, per_class, size) for c, wnid in enumerate(wnids)]
    with ProcessPoolExecutor(workers) as pool:
        total = sum(pool.map(_write_class, jobs, chunksize=max(1, len(jobs) // (4 * workers))))
    (root / "LOC_synset_mapping.txt").write_text("".join(f"{w} class {i}\n" for i, w in enumerate(wnids)))
    (root / "ILSVRC" / "Data" / "CLS-LOC" / "val").mkdir(parents=True, exist_ok=True)
    images = classes * per_class
    return {"images": images, "classes": classes, "bytes": total, "mean_kb": total / images / 1e3,
            "seconds": time.perf_counter() - started}


# --------------------------------------------------------------------------- measurements

def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_and_reset(torch, device) -> float | None:
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return round(peak, 2)


class Trainer:
    """A model, its optimiser and one bf16 training step, as `train_torch` runs it on a GPU."""

    def __init__(self, torch, name: str, device, *, image_size: int, classes: int):
        from pinstorm.training.torch_models import build_torch_model

        self.torch, self.device = torch, device
        kwargs = {} if name == "resnet50" else {"width": 1.0}
        self.model = build_torch_model(name, classes, image_size, **kwargs).to(
            device, memory_format=torch.channels_last)
        self.optim = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.amp = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None

    def step(self, images, labels) -> None:
        torch = self.torch
        images = images.to(self.device, non_blocking=True, memory_format=torch.channels_last)
        if images.dtype == torch.uint8:   # CPU decode: uint8 over PCIe, scaled on the GPU (as train_torch does)
            images = images.float().mul_(1 / 255)
        labels = labels.to(self.device, non_blocking=True)
        self.optim.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            loss = torch.nn.functional.cross_entropy(self.model(images).float(), labels)
        loss.backward()
        self.optim.step()


def _timed(torch, device, batches, work, *, warmup: int, seconds: float, max_batches: int) -> dict:
    """img/s of `work(batch)` over `batches` after `warmup` batches, for about `seconds`."""
    count = images = 0
    started = None
    for batch in batches:
        if count == warmup:
            _sync(torch, device)
            started = time.perf_counter()
        work(batch)
        count += 1
        if started is not None:
            images += len(batch[1])
            if time.perf_counter() - started >= seconds or count >= max_batches:
                break
    _sync(torch, device)
    elapsed = time.perf_counter() - started if started else float("nan")
    return {"images_per_second": images / elapsed if images else 0.0, "images": images, "seconds": elapsed}


def synthetic(torch, trainer: Trainer, *, batch: int, image_size: int, classes: int, settings) -> dict:
    images = torch.rand((batch, 3, image_size, image_size), device=trainer.device)
    labels = torch.randint(0, classes, (batch,), device=trainer.device)
    endless = iter(lambda: (images, labels), None)
    return _timed(torch, trainer.device, endless, lambda b: trainer.step(*b), warmup=settings.warmup,
                  seconds=settings.seconds, max_batches=settings.max_batches)


def _loader(url, *, batch: int, image_size: int, cores: int | None, decode: str, device, seed: int = 0,
            cpu_share: float = 0.0):
    from pinstorm.pipeline import make_torch_loader

    options = dict(batch_size=batch, image_size=image_size, seed=seed, num_epochs=None, drop_remainder=True)
    if decode == "gpu" and cpu_share:
        # the workers decode `cpu_share` of the batches whole: all cores but two (the training loop, the
        # device-decode threads), their batches from pinned memory
        return make_torch_loader(url, decode="gpu", device=device, cpu_share=cpu_share,
                                 pin_memory=device.type == "cuda",
                                 num_workers=max(1, (cores or 3) - 2), **options)
    if decode == "gpu":
        # the workers only read rows and parse headers: half the cores, the rest for the loop and nvJPEG's host part
        return make_torch_loader(url, decode="gpu", device=device, num_workers=max(1, (cores or 2) // 2), **options)
    workers = max(1, (cores or 1) - 1)   # one core for the training loop itself
    cuda = device.type == "cuda"
    return make_torch_loader(url, num_workers=workers, pin_memory=cuda, dtype=torch_uint8() if cuda else None,
                             prefetch_factor=2, **options)


def torch_uint8():
    import torch

    return torch.uint8


class _Cores:
    """Pin this process (and the DataLoader workers it starts) to its first `count` cores."""

    def __init__(self, count: int | None):
        self.count = count
        self.saved = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def __enter__(self):
        if self.count and self.saved:
            os.sched_setaffinity(0, sorted(self.saved)[:self.count])
        return self

    def __exit__(self, *exc):
        if self.count and self.saved:
            os.sched_setaffinity(0, self.saved)


def fed(*, torch, trainer: Trainer, url, batch, image_size, cores, decode, settings, cpu_share: float = 0.0) -> dict:
    with _Cores(cores):
        loader = _loader(url, batch=batch, image_size=image_size, cores=cores, decode=decode, device=trainer.device,
                         cpu_share=cpu_share)
        batches = iter(loader)
        try:
            result = _timed(torch, trainer.device, batches, lambda b: trainer.step(*b), warmup=settings.warmup,
                            seconds=settings.seconds, max_batches=settings.max_batches)
        finally:
            del batches
    return result


def decode_only(*, torch, device, url, batch, image_size, cores, decode, settings) -> dict:
    def touch(b):
        if decode == "gpu":
            return   # decoded on the device as the loader hands it out; _timed synchronises at the end
        b[0].to(device, non_blocking=True)

    with _Cores(cores):
        batches = iter(_loader(url, batch=batch, image_size=image_size, cores=cores, decode=decode, device=device))
        try:
            return _timed(torch, device, batches, touch, warmup=settings.warmup, seconds=settings.seconds,
                          max_batches=settings.max_batches)
        finally:
            del batches


# --------------------------------------------------------------------------- the run

def run(settings) -> dict:
    use_checkout()
    import torch

    from pinstorm.pipeline import convert, scan

    device = torch.device("cuda" if torch.cuda.is_available() and not settings.smoke else "cpu")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    core_counts = [c for c in settings.cores if c <= cpus] or [cpus]
    work = Path(settings.workdir or tempfile.mkdtemp(prefix="pinstorm-gpu-check-"))
    if not settings.workdir:   # a folder of its own goes when the check ends; a --workdir is the caller's
        atexit.register(shutil.rmtree, work, True)
    say = print if not settings.quiet else (lambda *a, **k: None)
    out = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.processor()})",
           "cuda": torch.version.cuda, "torch": torch.__version__, "cpus": cpus, "python": sys.version.split()[0],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "smoke": settings.smoke,
           "settings": {k: v for k, v in vars(settings).items() if k not in ("plot",)}}
    try:
        import torchvision

        out["torchvision"] = torchvision.__version__
    except Exception as error:   # noqa: BLE001 - reported, and GPU decode then falls back (and says so)
        out["torchvision"] = f"unavailable: {type(error).__name__}"

    tree = make_tree(work / "tree", classes=settings.classes, per_class=max(1, settings.images // settings.classes),
                     size=(settings.height, settings.width), workers=cpus)
    say(f"generated {tree['images']:,} JPEGs ({tree['mean_kb']:.0f} KB each) in {tree['seconds']:.1f} s")
    started = time.perf_counter()
    converted = convert(scan(work / "tree"), str(work / "ds"), split="train", progress=False)
    tree["convert_seconds"] = time.perf_counter() - started
    say(f"converted in {tree['convert_seconds']:.1f} s: {converted.rows:,} rows")
    out["data"] = tree
    url = converted.url
    runs = []

    def save_partial(data: dict) -> None:
        """The figures so far, on disk after each measurement: a run stopped at its time limit still reports."""
        folder = Path(settings.out)
        folder.mkdir(parents=True, exist_ok=True)
        name = "gpu_check_smoke.partial.json" if settings.smoke else "gpu_check.partial.json"
        (folder / name).write_text(json.dumps(data, indent=2, default=str))

    def attempt(measure, **kwargs) -> dict:
        """One measurement; a failure (no /dev/shm for workers, an nvJPEG error...) is recorded, not fatal."""
        try:
            return measure(**kwargs)
        except Exception as error:   # noqa: BLE001 - the rest of the check still runs
            return {"images_per_second": 0.0, "error": f"{type(error).__name__}: {str(error)[:300]}"}

    def record(model, what, result, cores=None, synthetic_rate=None):
        row = {"model": model, "measure": what, "cores": cores, **result,
               "peak_gpu_gib": _peak_and_reset(torch, device)}
        if synthetic_rate:
            row["of_synthetic"] = result["images_per_second"] / synthetic_rate
            row["input_stall"] = max(0.0, 1.0 - row["of_synthetic"])
        runs.append(row)
        save_partial({**out, "runs": runs, "partial": True})
        say(f"{model:>9} {what:<22} cores={cores!s:>4} {result['images_per_second']:9,.0f} img/s"
            + (f"  stall {row['input_stall']:.0%}" if "input_stall" in row else "")
            + (f"  ERROR {row['error']}" if "error" in row else ""))

    size, batch, classes = settings.image_size, settings.batch, settings.classes
    for model in settings.models:
        trainer = Trainer(torch, model, device, image_size=size, classes=classes)
        base = synthetic(torch, trainer, batch=batch, image_size=size, classes=classes, settings=settings)
        record(model, "synthetic", base)
        rate = base["images_per_second"]
        cpu_cores = core_counts if model == settings.models[0] else core_counts[-1:]
        common = dict(torch=torch, trainer=trainer, url=url, batch=batch, image_size=size, settings=settings)
        for cores in cpu_cores:
            record(model, "fed, cpu decode", attempt(fed, cores=cores, decode="cpu", **common), cores, rate)
        record(model, "fed, gpu decode", attempt(fed, cores=core_counts[-1], decode="gpu", **common),
               core_counts[-1], rate)
        if settings.cpu_share:   # both decode: the CPU workers `cpu_share` of the batches, the GPU the rest
            record(model, f"fed, gpu + cpu_share {settings.cpu_share:g}",
                   attempt(fed, cores=core_counts[-1], decode="gpu", cpu_share=settings.cpu_share, **common),
                   core_counts[-1], rate)
        del trainer, common
    common = dict(torch=torch, device=device, url=url, batch=batch, image_size=size, settings=settings)
    for cores in core_counts:
        record("-", "decode alone, cpu", attempt(decode_only, cores=cores, decode="cpu", **common), cores)
    record("-", "decode alone, gpu", attempt(decode_only, cores=core_counts[-1], decode="gpu", **common),
           core_counts[-1])
    out["runs"] = runs
    out["summary"] = summary(runs)
    return out


def summary(runs: list[dict]) -> dict:
    """The figures the targets name (issue 32): ratios within this run."""
    def rate(model, measure, cores=None):
        for r in runs:
            if r["model"] == model and r["measure"] == measure and (cores is None or r["cores"] == cores):
                return r["images_per_second"]
        return None

    out = {}
    cpu_decode = [r for r in runs if r["measure"] == "decode alone, cpu"]
    gpu_decode = rate("-", "decode alone, gpu")
    if cpu_decode and gpu_decode:
        best = max(cpu_decode, key=lambda r: r["images_per_second"])
        per_core = best["images_per_second"] / max(1, best["cores"] or 1)
        out["gpu_decode_img_s"] = gpu_decode
        out["gpu_decode_vs_one_core"] = gpu_decode / per_core if per_core else None
        out["cpu_decode_img_s_per_core"] = per_core
    for model in {r["model"] for r in runs if r["model"] != "-"}:
        fed_runs = [r for r in runs if r["model"] == model and r["measure"].startswith("fed")]
        good = [r for r in fed_runs if r.get("of_synthetic", 0) >= 0.95]
        cpu_best = max(1e-9, max((r["images_per_second"] for r in fed_runs if r["measure"] == "fed, cpu decode"),
                                 default=0))
        out[model] = {
            "synthetic_img_s": rate(model, "synthetic"),
            "best_fed": max((r.get("of_synthetic", 0) for r in fed_runs), default=None),
            "fewest_cores_at_0.95": min((r["cores"] for r in good if r["measure"] == "fed, cpu decode"), default=None),
            "gpu_decode_vs_cpu_decode_all_cores": (rate(model, "fed, gpu decode") or 0) / cpu_best,
            "gpu_with_cpu_share_vs_cpu_decode_all_cores": max(
                (r["images_per_second"] for r in fed_runs if "cpu_share" in r["measure"]), default=0) / cpu_best,
        }
    return out


def plot(data: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    runs = data["runs"]
    figure, axis = plt.subplots(figsize=(11, 5))
    labels = [f"{r['model']}\n{r['measure']}\n{r['cores'] or ''}" for r in runs]
    colours = ["#55a868" if "gpu" in r["measure"] else "#4c72b0" if r["measure"] != "synthetic" else "#8172b2"
               for r in runs]
    axis.bar(range(len(runs)), [r["images_per_second"] for r in runs], color=colours)
    axis.set_xticks(range(len(runs)), labels, fontsize=7)
    axis.set_ylabel("images/s")
    axis.set_title(f"pinstorm GPU check on {data['device']} ({data['cpus']} CPUs, {data['date']}): "
                   f"{data['data']['images']:,} JPEGs, {data['settings']['image_size']} px, "
                   f"batch {data['settings']['batch']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="toy size on the CPU: the same code paths, in seconds")
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=1_000)
    parser.add_argument("--height", type=int, default=375)
    parser.add_argument("--width", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--cores", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--models", nargs="+", default=["resnet50", "alexnet"])
    parser.add_argument("--cpu-share", type=float, default=0.4,
                        help="also fed with GPU decode and this share of the batches decoded on the CPU (0: not)")
    parser.add_argument("--seconds", type=float, default=15.0, help="timed seconds per measurement")
    parser.add_argument("--warmup", type=int, default=5, help="batches before timing")
    parser.add_argument("--max-batches", type=int, default=10_000)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--plot", default=None, metavar="JSON", help="only draw the PNG of a written JSON")
    settings = parser.parse_args(argv)
    if settings.plot:
        path = Path(settings.plot)
        print(plot(json.loads(path.read_text()), path.with_suffix(".png")) or "matplotlib is not installed")
        return 0
    if settings.smoke:
        settings.images, settings.classes, settings.height, settings.width = 16, 4, 120, 160
        settings.image_size, settings.batch, settings.cores = 64, 4, [1, 2]
        settings.seconds, settings.warmup, settings.max_batches = 0.0, 1, 3
    data = run(settings)
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "gpu_check_smoke.json" if settings.smoke else "gpu_check.json"
    (out / name).write_text(json.dumps(data, indent=2, default=str))
    (out / name).with_suffix(".partial.json").unlink(missing_ok=True)
    png = plot(data, (out / name).with_suffix(".png"))
    print(f"wrote {out / name}" + (f" and {png}" if png else " (no matplotlib here: --plot it elsewhere)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
