"""Benchmark `make_torch_loader` (PyTorch DataLoader, simplejpeg decode) against `make_dataset` (tf.data) on 2 CPUs.

All read the same converted dataset of ImageNet-size JPEGs (~450x340, ~110 KB, cut from
scikit-learn's photos) into 224 px random-resized crops with flips, batch 64, in one run, each
run in a fresh process of its own, reader after reader, round after round (so a busy moment on this
shared machine hits all of them):

* `make_dataset`: tf.data, decoding with ``num_parallel_calls=AUTOTUNE`` (as many threads as CPUs);
* `make_torch_loader()`: the default, in the calling process: batches made ahead in a thread,
  decoded by 2 threads (libjpeg-turbo and torch's resize let go of the GIL), no memory handed over;
* `make_torch_loader(num_workers=2)`: two DataLoader worker processes, each decoding its slice of the
  row groups on one thread, uint8 batches handed over in shared memory.

Reported: images/s (best and median of the rounds, timed after 4 warm-up batches, 2 per worker process
or decoding thread: a start, importing torch or TensorFlow's tuning, is once per pass), CPU ms per image
over the same span (the process and, for torch, its worker processes, read from /proc while they
run), the ratio torch (the default) / tf (target >= 0.9), and where the torch path's CPU goes per
image: each stage timed alone on the same JPEGs in a fresh process on one thread (header and crop
window, JPEG decode, crop and resize; without workers, the copy and scaling into the float32 batch in
the decoding thread; with workers, the copy into the uint8 batch, the fresh shared uint8 batch in a
worker and the scaling to float32 in the calling process, in reused memory), and the rest of the
measured CPU (reading and checking row groups, planning the order, batching, handing batches over).

Writes bench/results/torch_loader.json and bench/results/torch_loader.png.

    .venv/bin/python bench/bench_torch_loader.py [--quick] [--images 800] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE_SIZE = 224
BATCH = 64
WORKERS = 2
MIN_ROW_GROUPS = 8    # ~100 rows each at 800 images: 4 per torch worker


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(seen: dict) -> float:
    """CPU seconds of this process and of its worker processes (DataLoader workers), read from /proc
    while they run: the steady state, without forking them. `seen` keeps each worker's last reading,
    as the DataLoader ends a worker as soon as its share is done."""
    import multiprocessing

    for child in multiprocessing.active_children():
        try:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seen[child.pid] = (int(fields[11]) + int(fields[12])) / _TICK   # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + sum(seen.values())


def timed(make, expected: int, warmup_batches: int = 2) -> dict:
    """Iterate a reader: img/s and CPU ms per image (process + workers) after `warmup_batches`."""
    iterator = iter(make())
    warm = sum(len(next(iterator)[1]) for _ in range(warmup_batches))
    seen: dict = {}
    count, start = 0, time.perf_counter()
    cpu = end = _cpu(seen)
    for batch in iterator:
        count += len(batch[1])
        end = _cpu(seen)
    seconds, cpu = time.perf_counter() - start, end - cpu
    del iterator
    return {"img_s": count / seconds, "cpu_ms_per_img": 1000 * cpu / max(1, count),
            "complete": count + warm == expected, "images": count + warm}


def make_reader(name: str, url, epochs: int, seed: int):
    """The reader `name` over `url`: what one measured run iterates."""
    from pinstorm.pipeline import make_dataset, make_torch_loader

    if name == "make_dataset":
        return make_dataset(url, batch_size=BATCH, image_size=IMAGE_SIZE, num_epochs=epochs, seed=seed)
    if name == "make_torch_loader":
        return make_torch_loader(url, batch_size=BATCH, image_size=IMAGE_SIZE, num_epochs=epochs, seed=seed)
    if name == "make_torch_loader_2_workers":
        return make_torch_loader(url, batch_size=BATCH, image_size=IMAGE_SIZE, num_epochs=epochs, seed=seed,
                                 num_workers=WORKERS)
    raise ValueError(name)


READERS = ("make_dataset", "make_torch_loader", "make_torch_loader_2_workers")


def interleaved(url, rounds: int, epochs: int, expected: int) -> dict:
    """Each reader's run in a fresh process of its own (as a user runs one framework, not both in one
    process: torch's threads next to TensorFlow's that have run measured up to 40% slower), reader after
    reader, round after round."""
    runs = {name: [] for name in READERS}
    for round_ in range(rounds):
        for name in READERS:
            done = subprocess.run([sys.executable, __file__, "--run-one", name, str(url), str(epochs), str(round_),
                                   str(expected)], capture_output=True, text=True, check=True)
            run = json.loads(done.stdout.rsplit("RUN", 1)[1])
            runs[name].append(run)
            print(f"  {name}: {run['img_s']:.0f} img/s, {run['cpu_ms_per_img']:.2f} CPU ms/img"
                  + ("" if run["complete"] else f"  SHORT: {run['images']} of {expected}"), flush=True)
    out = {}
    for name, values in runs.items():
        good = [v for v in values if v["complete"]] or values
        rates = sorted(v["img_s"] for v in good)
        out[name] = {"img_s": round(rates[-1], 1), "median_img_s": round(rates[len(rates) // 2], 1),
                     "cpu_ms_per_img": round(min(v["cpu_ms_per_img"] for v in good), 3),
                     "all_runs_img_s": [round(v["img_s"], 1) for v in values],
                     "all_runs_cpu_ms_per_img": [round(v["cpu_ms_per_img"], 3) for v in values],
                     "short_runs": [f"{v['images']} of {expected}" for v in values if not v["complete"]]}
    return out


# Stages of the worker processes' path only (uint8 batches in shared memory, scaled by the caller); without
# workers (the default), each decoding thread copies and scales its image into the float32 batch instead.
WORKER_STAGES = ("copy_into_uint8_batch", "fresh_shared_uint8_batch_memory", "scale_to_float32_in_caller")


def profile_torch_path(jpegs: list[bytes]) -> dict:
    """CPU ms per image of each stage of the torch path, each timed alone on inputs prepared for it
    (best of 5 passes), in one process on one thread, as a DataLoader worker runs."""
    import torch

    from pinstorm.pipeline.torch_loader import BatchMemory, _decode, _empty, decode_window, open_jpeg, train_window

    torch.set_num_threads(1)
    size = (IMAGE_SIZE, IMAGE_SIZE)
    rng = random.Random(0)
    windows = [train_window(*open_jpeg(data).size, rng, (0.25, 1.0)) for data in jpegs]
    arrays = [_decode(open_jpeg(data), 1).copy() for data in jpegs]
    resized = [decode_window(open_jpeg(data), window, size)[0] for data, window in zip(jpegs, windows)]
    planes = torch.empty((3, *size), dtype=torch.uint8)
    float_planes = torch.empty((3, *size), dtype=torch.float32)
    batch = torch.zeros((BATCH, 3, *size), dtype=torch.uint8)
    memory = BatchMemory()

    def per_image(fn, items, reps=5) -> float:
        best = float("inf")
        for _ in range(reps):
            start = time.process_time()
            for item in items:
                fn(item)
            best = min(best, 1000 * (time.process_time() - start) / len(items))
        return best

    def crop_resize(item):
        pixels, (x, y, w, h) = item
        crop = torch.from_numpy(pixels)[y:y + h, x:x + w].permute(2, 0, 1)
        torch.nn.functional.interpolate(crop[None], size=size, mode="bilinear", align_corners=False)

    def fresh_batch(_):
        fresh = _empty((BATCH, 3, *size), torch.uint8, True)
        fresh.fill_(1)   # first touch: the page faults every fresh batch pays once

    def scale(_):
        memory.empty(batch.shape, torch.float32).copy_(batch).mul_(1 / 255)

    header = per_image(lambda data: train_window(*open_jpeg(data).size, rng, (0.25, 1.0)), jpegs)
    stages = {
        "header_and_window": header,
        "jpeg_decode": max(0.0, per_image(lambda data: _decode(open_jpeg(data), 1), jpegs) - header),
        "crop_and_resize": per_image(crop_resize, list(zip(arrays, windows))),
        "copy_and_scale_into_float32_batch": per_image(lambda pixels: float_planes.copy_(pixels).mul_(1 / 255),
                                                       resized),
        "copy_into_uint8_batch": per_image(planes.copy_, resized),
        "fresh_shared_uint8_batch_memory": per_image(fresh_batch, range(8)) / BATCH,
        "scale_to_float32_in_caller": per_image(scale, range(8)) / BATCH,
    }
    common = stages["header_and_window"] + stages["jpeg_decode"] + stages["crop_and_resize"]
    whole = per_image(lambda item: decode_window(open_jpeg(item[0]), item[1], size), list(zip(jpegs, windows)))
    return {"breakdown_ms_per_img": {k: round(v, 3) for k, v in stages.items()},
            "sum_of_stages_in_process": round(common + stages["copy_and_scale_into_float32_batch"], 3),
            "sum_of_stages_2_workers": round(common + sum(stages[k] for k in WORKER_STAGES), 3),
            "decode_window_whole_ms_per_img": round(whole, 3)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images, one round")
    parser.add_argument("--images", type=int, default=None, help="images in the dataset (default 800, quick 240)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per reader run (default 3, quick 2)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4, quick 1)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile-only", type=Path, help=argparse.SUPPRESS)   # the profile's own process
    parser.add_argument("--run-one", nargs=5, help=argparse.SUPPRESS)          # one measured run's process
    args = parser.parse_args(argv)
    if args.run_one:
        name, url, epochs, seed, expected = args.run_one
        warmup = 2 * WORKERS   # every reader alike: 2 batches per worker process or decoding thread
        run = timed(lambda: make_reader(name, url, int(epochs), int(seed)), int(expected), warmup)
        print("RUN" + json.dumps(run))
        return 0
    if args.profile_only:
        paths = sorted(args.profile_only.rglob("*.JPEG"))[:160]
        print("PROFILE" + json.dumps(profile_torch_path([p.read_bytes() for p in paths])))
        return 0
    images = args.images or (240 if args.quick else 800)
    epochs = args.epochs or (2 if args.quick else 3)
    rounds = args.rounds or (1 if args.quick else 4)
    classes = 8
    per_class = max(1, images // classes)

    import tensorflow as tf
    import torch
    import simplejpeg
    from PIL import Image

    from pinstorm.pipeline import convert, dataset_info, scan
    from pinstorm.pipeline.samples import make_imagenet_size_tree

    results: dict = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "tensorflow": tf.__version__,
                    "torch": torch.__version__, "pillow": Image.__version__, "simplejpeg": simplejpeg.__version__,
                    "load_average_at_start": round(os.getloadavg()[0], 2)},
        "images": classes * per_class, "image_size": IMAGE_SIZE, "batch_size": BATCH, "epochs_per_run": epochs,
        "rounds": rounds, "torch_workers": WORKERS,
        "cpu_budget": f"{os.cpu_count()} CPUs: tf.data map with AUTOTUNE parallel calls vs {WORKERS} DataLoader "
                      "worker processes"}
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        tmp = Path(tmp)
        make_imagenet_size_tree(tmp / "tree", classes=classes, per_class=per_class, seed=0)
        layout = scan(tmp / "tree")
        url = tmp / "ds"
        convert(layout, url, min_row_groups=MIN_ROW_GROUPS, progress=False)
        info = dataset_info(url)
        results["dataset"] = {"rows": info["rows"], "row_groups": info["row_groups"],
                              "mb": round(info["bytes"] / 2**20, 1),
                              "mean_kb": round(info["bytes"] / info["rows"] / 1024, 1)}
        print(f"dataset: {info['rows']} rows in {info['row_groups']} row groups, {results['dataset']['mb']} MB",
              flush=True)
        expected = info["rows"] * epochs

        print("read:", flush=True)
        read = interleaved(url, rounds, epochs, expected)
        results["read"] = read
        tf_run, torch_run = read["make_dataset"], read["make_torch_loader"]
        results["ratio_torch_to_tf"] = {
            "best": round(torch_run["img_s"] / tf_run["img_s"], 3),
            "median": round(torch_run["median_img_s"] / tf_run["median_img_s"], 3),
            "cpu": round(tf_run["cpu_ms_per_img"] / torch_run["cpu_ms_per_img"], 3),
        }
        results["target"] = {"ratio": 0.9, "met_best": results["ratio_torch_to_tf"]["best"] >= 0.9}

        print("profile:", flush=True)
        # In a fresh process: TensorFlow's idle threads here would be counted in this process's CPU time.
        done = subprocess.run([sys.executable, __file__, "--profile-only", str(tmp / "tree")], capture_output=True,
                              text=True, check=True)
        profile = json.loads(done.stdout.rsplit("PROFILE", 1)[1])
        profile["rest_of_measured_cpu_ms_per_img"] = round(
            read["make_torch_loader"]["cpu_ms_per_img"] - profile["sum_of_stages_in_process"], 3)
        profile["rest_of_measured_cpu_ms_per_img_2_workers"] = round(
            read["make_torch_loader_2_workers"]["cpu_ms_per_img"] - profile["sum_of_stages_2_workers"], 3)
        results["ratio_2_workers_to_tf"] = {
            "best": round(read["make_torch_loader_2_workers"]["img_s"] / tf_run["img_s"], 3),
            "median": round(read["make_torch_loader_2_workers"]["median_img_s"] / tf_run["median_img_s"], 3)}
        results["profile_torch_path"] = profile
    results["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torch_loader.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "torch_loader.png")
    print(json.dumps({k: results[k] for k in ("read", "ratio_torch_to_tf", "profile_torch_path")}, indent=1))
    print(f"wrote {args.out / 'torch_loader.json'} and {args.out / 'torch_loader.png'}")
    return 0


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1.3, 1]})
    names = list(results["read"])
    rates = [results["read"][n]["img_s"] for n in names]
    medians = [results["read"][n]["median_img_s"] for n in names]
    left.barh(names, rates, color=["#48c", "#c84", "#e9b"][:len(names)], label="best")
    left.scatter(medians, names, color="k", marker="|", s=300, label="median", zorder=3)
    for y, (n, r) in enumerate(zip(names, rates)):
        left.text(r, y, f" {r:.0f} img/s, {results['read'][n]['cpu_ms_per_img']:.2f} CPU ms/img", va="center",
                  fontsize=9)
    left.axvline(0.9 * results["read"]["make_dataset"]["img_s"], color="k", linestyle="--", linewidth=1,
                 label="0.9 x make_dataset")
    left.invert_yaxis()
    left.set_xlim(0, max(rates) * 1.8)
    left.set_xlabel("images / s")
    ratio = results["ratio_torch_to_tf"]
    left.set_title(f"{results['images']} ImageNet-size JPEGs -> {results['image_size']} px crops, batch "
                   f"{results['batch_size']}, {results['machine']['cpus']} CPUs (load "
                   f"{results['machine']['load_average_at_start']:.1f}); torch/tf = {ratio['best']:.2f} (best), "
                   f"{ratio['median']:.2f} (median)", fontsize=9)
    left.legend(loc="upper right", fontsize=8)

    profile = results["profile_torch_path"]
    parts = {k: v for k, v in profile["breakdown_ms_per_img"].items() if k not in WORKER_STAGES}   # in-process
    parts["rest: reading, checksums, planning, batching, threads"] = max(
        0.0, profile["rest_of_measured_cpu_ms_per_img"])
    bottom = 0.0
    colors = ["#999", "#48c", "#8ac", "#2a7", "#c84", "#a5a", "#ddd"]
    label = "make_torch_loader\n(measured; stages\ntimed alone)"
    for (part, value), color in zip(parts.items(), colors):
        right.bar([label], [value], bottom=bottom, label=part, color=color)
        bottom += value
    tf_cpu = results["read"]["make_dataset"]["cpu_ms_per_img"]
    right.bar(["make_dataset\n(measured)"], [tf_cpu], color="#48c", alpha=0.6)
    right.text(1, tf_cpu, f"{tf_cpu:.2f}", ha="center", va="bottom", fontsize=9)
    right.text(0, bottom, f"{bottom:.2f}", ha="center", va="bottom", fontsize=9)
    right.set_ylabel("CPU ms / image")
    right.set_title("where the CPU goes per image", fontsize=10)
    right.legend(fontsize=7, loc="upper right")
    right.set_ylim(0, max(bottom, tf_cpu) * 1.7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
