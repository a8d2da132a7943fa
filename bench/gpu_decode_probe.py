"""Where GPU decode's time goes, part by part, on a GPU machine (a profile for issue 32's GPU check).

    python3 bench/gpu_decode_probe.py --out bench/results/gpu             # on a lent GPU
    python3 bench/gpu_decode_probe.py --smoke --device cpu --out DIR      # the same code paths, toy size

Measures, on the same ImageNet-size JPEGs as `gpu_check.py`: (1) nvJPEG alone, a batch of 256 in one
``torchvision.io.decode_jpeg(device="cuda")`` call, from 1, 2 and 4 threads at once (does its decoder
serialise?); (2) `DeviceDecoder`'s crop, resize, flip and scale alone, on decoded images, batched
(``DeviceDecoder(batched=True)``: a grid_sample or matrix product a group) against the per-image reference
(an ``interpolate`` an image), in interleaved rounds, medians and their ratio: once with the windows and
DCT ratios the loader draws for training at 224 px (few antialiased), once all antialiased (the last run's
``postprocess_alone``); (3) the loader alone with ``decode="gpu"`` (rows read, headers parsed, batches
handed over through both device threads, nothing decoded); (4) the loader and the decoder together,
batched (``loader_and_decode_*``) and per image (``loader_and_decode_per_image_*``). Writes
``gpu_decode_probe.json`` and, where matplotlib imports, ``gpu_decode_probe.png``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (beside this file)


class _Undecoded:
    """In the loader's decoder's place: nothing decoded, an empty tensor handed on (the loader's own cost)."""

    def __init__(self, device):
        import torch

        self.device, self.empty = device, torch.empty(1, device=device)

    def decode(self, batch):
        return []

    def finish(self, images, batch):
        return self.empty


def rate(work, images_per_call: int, seconds: float, sync) -> dict:
    work()
    sync()
    calls, started = 0, time.perf_counter()
    while True:
        work()
        calls += 1
        sync()
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return {"images_per_second": calls * images_per_call / elapsed, "calls": calls}


def compared(works: dict, images_per_call: int, seconds: float, rounds: int, sync) -> dict:
    """Each of `works` timed in `rounds` interleaved rounds: per work the median img/s, and each work's
    median ratio to the first (the baseline) over the rounds."""
    seen = {name: [] for name in works}
    for _ in range(rounds):
        for name, work in works.items():
            seen[name].append(rate(work, images_per_call, seconds / rounds, sync)["images_per_second"])
    baseline = next(iter(works))
    return {name: {"images_per_second": statistics.median(rates), "rounds": [round(r, 1) for r in rates],
                   f"vs_{baseline}": statistics.median(r / b for r, b in zip(rates, seen[baseline]))}
            for name, rates in seen.items()}


def training_windows(images: list, size, seed: int = 0):
    """(window, DCT ratio, flip) for each decoded image, drawn as the loader draws them in training."""
    from pinstorm.pipeline.options import DEFAULTS
    from pinstorm.pipeline.torch_loader import dct_ratio, full_size_window, sample_rng, train_window

    out = []
    for i, image in enumerate(images):
        height, width = image.shape[-2:]
        rng = sample_rng(seed, i)
        window = train_window(width, height, rng, DEFAULTS.crop_area)
        ratio = dct_ratio(window, size)
        out.append((full_size_window(window, ratio, width, height), ratio, rng.random() < 0.5))
    return out


def plot(data: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    bars = [(name, value["images_per_second"]) for name, value in data.items()
            if isinstance(value, dict) and "images_per_second" in value]
    bars += [(f"{part} {name}", value["images_per_second"])
             for part in ("crop_resize_training", "crop_resize_antialiased")
             for name, value in data.get(part, {}).items() if isinstance(value, dict)]
    figure, axis = plt.subplots(figsize=(11, 5))
    axis.barh(range(len(bars)), [b[1] for b in bars],
              color=["#55a868" if "batched" in b[0] else "#4c72b0" for b in bars])
    axis.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    axis.set_xlabel("images/s")
    axis.set_title(f"GPU decode, part by part, on {data['device']}: batch {data['batch']}, "
                   f"{data['image'][1]}x{data['image'][0]} JPEGs", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--smoke", action="store_true", help="toy size: the same code paths, in seconds")
    parser.add_argument("--device", default=None, help="cuda (the default where there is one) or cpu")
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the compared crop/resizes")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="loader workers (default 4 8)")
    settings = parser.parse_args(argv)
    gpu_check.use_checkout()
    import torch
    try:
        import torchvision.io as tvio
    except ImportError:   # a CPU smoke run without torchvision: the nvJPEG parts are skipped
        tvio = None

    from pinstorm.pipeline import convert, make_torch_loader, scan
    from pinstorm.pipeline.device_decode import DeviceDecoder, JpegBatch
    from pinstorm.pipeline.torch_loader import decode_whole

    device = torch.device(settings.device or ("cuda" if torch.cuda.is_available() and not settings.smoke else "cpu"))
    if device.type == "cpu":
        tvio = None   # libjpeg-turbo stands in for nvJPEG, as in the loader
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    batch = 16 if settings.smoke else 256
    size = (120, 160) if settings.smoke else (375, 500)
    target = (64, 64) if settings.smoke else (224, 224)
    workers_list = settings.workers or ([4] if settings.smoke else [4, 8])
    work = Path(tempfile.mkdtemp(prefix="pinstorm-probe-"))
    atexit.register(shutil.rmtree, work, True)   # its generated images and Parquet go with it
    classes, per_class = (4, 8) if settings.smoke else (64, 32)
    gpu_check.make_tree(work / "tree", classes=classes, per_class=per_class, size=size,
                        workers=2 if settings.smoke else 8)
    converted = convert(scan(work / "tree"), str(work / "ds"), split="train", progress=False)
    jpegs = [p.read_bytes() for p in sorted((work / "tree").rglob("*.JPEG"))][:batch]
    tensors = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
    out = {"device": str(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "smoke": settings.smoke, "batch": batch, "image": list(size), "target": list(target),
           "mean_kb": sum(map(len, jpegs)) / len(jpegs) / 1e3}

    def decode():
        if tvio is None:
            return [torch.from_numpy(decode_whole(j, "probe").copy()).permute(2, 0, 1) for j in jpegs]
        return tvio.decode_jpeg(tensors, mode=tvio.ImageReadMode.RGB, device=device)

    out["nvjpeg_batched_1_thread" if tvio is not None else "libjpeg_turbo_1_thread"] = rate(
        decode, batch, settings.seconds, sync)
    if tvio is not None:
        out["nvjpeg_one_by_one"] = rate(lambda: [tvio.decode_jpeg(t, mode=tvio.ImageReadMode.RGB, device=device)
                                                 for t in tensors], batch, settings.seconds, sync)
    for threads in (2, 4) if tvio is not None else ():
        def parallel(threads=threads):
            workers = [threading.Thread(target=decode) for _ in range(threads)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        out[f"nvjpeg_batched_{threads}_threads"] = rate(parallel, batch * threads, settings.seconds, sync)
    print(json.dumps(out, indent=1), flush=True)

    decoded = decode()
    per_image = DeviceDecoder(device, target, torch.float32, batched=False)
    batched = DeviceDecoder(device, target, torch.float32, batched=True)
    for part, windows in (("crop_resize_training", training_windows(decoded, target)),
                          ("crop_resize_antialiased", [((0, 0, image.shape[-1], image.shape[-2]), 2, i % 2 == 0)
                                                       for i, image in enumerate(decoded)])):
        fake = JpegBatch(batch)
        for i, (window, ratio, flip) in enumerate(windows):
            fake[i].fill(jpegs[i], window, ratio, flip, "probe")
        difference = (batched.finish(decoded, fake) - per_image.finish(decoded, fake)).abs().max()
        out[part] = compared({"per_image": lambda: per_image.finish(decoded, fake),
                              "batched": lambda: batched.finish(decoded, fake)},
                             batch, 2 * settings.seconds, settings.rounds, sync)
        out[part]["antialiased_share"] = sum(r > 1 for _, r, _ in windows) / len(windows)
        out[part]["max_difference_levels"] = float(difference) * 255   # float rounding: well under 0.05
        if out[part]["max_difference_levels"] > 0.05:
            print(f"{part}: the batched crop/resize differs from the per-image one by "
                  f"{out[part]['max_difference_levels']:.3f} levels of 255", file=sys.stderr)
        print(json.dumps({part: out[part]}), flush=True)
    # the last runs' name for the decoder's own crop and resize (now batched) on all-antialiased windows
    out["postprocess_alone"] = dict(out["crop_resize_antialiased"]["batched"], as_in="crop_resize_antialiased")

    for workers in workers_list:
        options = dict(batch_size=batch, image_size=target, seed=0, num_epochs=None, decode="gpu", device=device,
                       num_workers=workers, drop_remainder=True)
        for name in ("loader_alone", "loader_and_decode_per_image", "loader_and_decode"):
            loader = make_torch_loader(converted.url, **options)
            if name == "loader_alone":
                loader.device_decoder = _Undecoded(device)
            else:
                loader.device_decoder.batched = not name.endswith("per_image")
            batches = iter(loader)
            out[f"{name}_{workers}_workers"] = rate(lambda: next(batches), batch, settings.seconds, sync)
            batches.close()
            del batches, loader
        print(json.dumps({k: v for k, v in out.items() if "loader" in k}), flush=True)
    Path(settings.out).mkdir(parents=True, exist_ok=True)
    path = Path(settings.out) / "gpu_decode_probe.json"
    path.write_text(json.dumps(out, indent=2))
    png = plot(out, path.with_suffix(".png"))
    print(json.dumps(out, indent=1))
    print(f"wrote {path}" + (f" and {png}" if png else " (no matplotlib here)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
