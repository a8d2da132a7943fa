"""pinstorm's readers against the loaders users pick today, on the same JPEGs and the same decode work.

One run writes the same 3,200 ImageNet-size JPEGs (~450x340, ~110 KB, cut from scikit-learn's photos;
the bytes of a pinstorm conversion, in row groups of the converter's default 32 MB, ~290 rows: the shape
an ImageNet conversion has) in every peer's format, then times each reader in a fresh process of its
own, reader after reader, round after round (each round starting one reader later), on 2 CPUs: 224 px
random-resized crops with flips, float32 in [0, 1], batch 64, 5 epochs a run (16,000 images), timed from
the first batch to the last (the seconds to the first batch reported apart: the reader's start). A
longer warm-up would count, in the window, work that readers decoding ahead into buffers (petastorm's)
did before it; what a reader buffers before its first batch counts for it. That is why the window is not
small: with 800 images (100-row groups) a run was 4,000 images, and TFRecord's 1,024-record shuffle
buffer, filled before the first batch, was a quarter of the run's reads: on the same data TFRecord ran
~4% faster over 5 epochs than over 20, pinstorm ~1%.

* TensorFlow: pinstorm `make_dataset`; TFRecord + tf.data (`TFRecordDataset`, interleaved reads, a
  shuffle buffer, the map `make_dataset` runs: `pipeline.reader.preprocess_fn`, AUTOTUNE); petastorm's
  `make_batch_reader` over the same Parquet into tf.data through a generator, the same map
  (`make_petastorm_dataset` hands the images over as uint8 arrays, which TensorFlow's JPEG ops refuse).
* PyTorch: pinstorm `make_torch_loader` (its default, in-process; and 2 worker processes);
  WebDataset (tar shards, `WebDataset` + `WebLoader`, 2 workers); Mosaic Streaming (`MDSWriter`,
  `StreamingDataset`, DataLoader, 2 workers); HF `datasets` (the JPEGs in Parquet, `load_dataset`,
  `set_transform`, DataLoader, 2 workers); petastorm's `petastorm.pytorch.DataLoader` over
  `make_batch_reader` with a `TransformSpec` on 2 threads. Every torch reader decodes with the same
  per-image function, pinstorm's (`pipeline.torch_loader`: libjpeg-turbo through simplejpeg, crop,
  torch's resize, flip, scale), so the table compares the data paths, not the decoders.

petastorm needs pyarrow 14 and numpy < 2 (the project's `.venv`); recent HF `datasets` needs pyarrow
>= 24: the other readers run in `.venv-peers` (`bench/peers-env`). Writes bench/results/peers.json
and bench/results/peers.png.

    bench/peers-env && .venv-peers/bin/python bench/bench_peers.py [--quick] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = Path(__file__).resolve().parent / "results"
IMAGE_SIZE, BATCH, WORKERS, SHARDS = 224, 64, 2, 8
PETASTORM_PYTHON = ROOT / ".venv" / "bin" / "python"
READERS = {   # name -> (framework, environment)
    "pinstorm make_dataset": ("tensorflow", "peers"),
    "TFRecord + tf.data": ("tensorflow", "peers"),
    "petastorm make_batch_reader + tf.data": ("tensorflow", "petastorm"),
    "pinstorm make_torch_loader": ("torch", "peers"),
    "pinstorm make_torch_loader, 2 workers": ("torch", "peers"),
    "WebDataset": ("torch", "peers"),
    "Mosaic Streaming (MDS)": ("torch", "peers"),
    "HF datasets (Parquet)": ("torch", "peers"),
    "petastorm.pytorch DataLoader": ("torch", "petastorm"),
}


# --------------------------------------------------------------------------- the same decode work

def torch_decode(jpeg: bytes, rng: random.Random):
    """One image as every torch reader here decodes it: pinstorm's per-image path, float32 [3, H, W]."""
    from pinstorm.pipeline.torch_loader import decode_window, open_jpeg, train_window

    image = open_jpeg(jpeg)
    window = train_window(*image.size, rng, (0.25, 1.0))
    pixels, _ = decode_window(image, window, (IMAGE_SIZE, IMAGE_SIZE))
    if rng.random() < 0.5:
        pixels = pixels.flip(-1)
    return pixels.float().mul_(1 / 255)


def _worker_rng() -> random.Random:
    import torch

    info = torch.utils.data.get_worker_info()
    return random.Random((os.getpid() << 8) + (info.id if info else 0))


def _tf_map():
    from pinstorm.pipeline.reader import preprocess_fn

    return preprocess_fn((IMAGE_SIZE, IMAGE_SIZE), training=True)


# --------------------------------------------------------------------------- the readers

def _epochs(make_epoch, epochs: int):
    for epoch in range(epochs):
        yield from make_epoch(epoch)


def make_reader(name: str, data: Path, epochs: int, seed: int):
    """An iterable of (images, labels) batches: `name` reading `epochs` epochs of the data in `data`."""
    if name == "pinstorm make_dataset":
        from pinstorm.pipeline import make_dataset

        return make_dataset(data / "parquet", batch_size=BATCH, image_size=IMAGE_SIZE, num_epochs=epochs, seed=seed)
    if name.startswith("pinstorm make_torch_loader"):
        from pinstorm.pipeline import make_torch_loader

        return make_torch_loader(data / "parquet", batch_size=BATCH, image_size=IMAGE_SIZE, num_epochs=epochs,
                                 seed=seed, num_workers=WORKERS if "workers" in name else 0)
    if name == "TFRecord + tf.data":
        return _tfrecord(data, epochs, seed)
    if name == "petastorm make_batch_reader + tf.data":
        return _petastorm_tf(data, epochs, seed)
    if name == "WebDataset":
        return _webdataset(data, epochs, seed)
    if name == "Mosaic Streaming (MDS)":
        return _mds(data, epochs, seed)
    if name == "HF datasets (Parquet)":
        return _hf(data, epochs, seed)
    if name == "petastorm.pytorch DataLoader":
        return _petastorm_torch(data, epochs, seed)
    raise ValueError(name)


def _tfrecord(data: Path, epochs: int, seed: int):
    import tensorflow as tf

    files = sorted(str(p) for p in (data / "tfrecord").glob("*.tfrecord"))
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    preprocess = _tf_map()

    def parse(index, record):
        row = tf.io.parse_single_example(record, spec)
        return preprocess(row["image"], tf.cast(row["label"], tf.int32), tf.stack([tf.cast(index, tf.int32), seed]))

    rows = (tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed)
            .interleave(tf.data.TFRecordDataset, cycle_length=WORKERS, num_parallel_calls=tf.data.AUTOTUNE)
            .shuffle(1024, seed=seed).repeat(epochs).enumerate())
    return rows.map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def _petastorm_tf(data: Path, epochs: int, seed: int):
    """petastorm's batch reader into tf.data through a generator: ``make_petastorm_dataset`` hands the
    image column over as uint8 arrays (from the Unischema), which TensorFlow's JPEG ops do not take."""
    import numpy as np
    import tensorflow as tf
    from petastorm import make_batch_reader

    from pinstorm.pipeline.epochs import quiet_petastorm

    quiet_petastorm()

    def rows():
        with make_batch_reader((data / "parquet").as_uri(), schema_fields=["image", "label"], num_epochs=epochs,
                               shuffle_row_groups=True, seed=seed, reader_pool_type="thread",
                               workers_count=WORKERS) as reader:
            for batch in reader:
                yield from zip((bytes(np.asarray(image)) for image in batch.image), batch.label)

    preprocess = _tf_map()
    rows = tf.data.Dataset.from_generator(rows, output_signature=(tf.TensorSpec([], tf.string),
                                                                  tf.TensorSpec([], tf.int64)))
    rows = rows.shuffle(1024, seed=seed).enumerate()
    return rows.map(lambda i, row: preprocess(row[0], tf.cast(row[1], tf.int32), tf.stack([tf.cast(i, tf.int32), seed])),
                    num_parallel_calls=tf.data.AUTOTUNE).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def _decoded_batch(samples):
    """(images [B, 3, H, W], labels [B]) from (jpeg, label) pairs, decoded in the calling worker."""
    import torch

    rng = _worker_rng()
    return (torch.stack([torch_decode(jpeg, rng) for jpeg, _ in samples]),
            torch.tensor([int(label) for _, label in samples], dtype=torch.int64))


def _loader(dataset, **kwargs):
    import torch

    return torch.utils.data.DataLoader(dataset, num_workers=WORKERS, persistent_workers=True, **kwargs)


def _webdataset(data: Path, epochs: int, seed: int):
    import webdataset as wds

    urls = sorted(str(p) for p in (data / "webdataset").glob("*.tar"))
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), seed=seed, nodesplitter=wds.split_by_node,
                              workersplitter=wds.split_by_worker, empty_check=False)
               .shuffle(1024).to_tuple("jpg", "cls").batched(BATCH, collation_fn=_decoded_batch, partial=True))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    return _epochs(lambda epoch: loader, epochs)


def _mds(data: Path, epochs: int, seed: int):
    from streaming import StreamingDataset

    class Decoded(StreamingDataset):
        def __getitem__(self, index):
            sample = super().__getitem__(index)
            return torch_decode(sample["image"], _worker_rng()), int(sample["label"])

    dataset = Decoded(local=str(data / "mds"), shuffle=True, shuffle_seed=seed, batch_size=BATCH)
    loader = _loader(dataset, batch_size=BATCH)
    return _epochs(lambda epoch: loader, epochs)


def _hf(data: Path, epochs: int, seed: int):
    import torch
    from datasets import load_dataset

    dataset = load_dataset("parquet", data_files=sorted(str(p) for p in (data / "hf").glob("*.parquet")),
                           split="train", cache_dir=str(data / "hf-cache"))

    def transform(batch):
        rng = _worker_rng()
        return {"image": [torch_decode(jpeg, rng) for jpeg in batch["image"]], "label": batch["label"]}

    dataset.set_transform(transform)
    generator = torch.Generator().manual_seed(seed)
    loader = _loader(dataset, batch_size=BATCH, shuffle=True, generator=generator,
                     collate_fn=lambda rows: (torch.stack([r["image"] for r in rows]),
                                              torch.tensor([r["label"] for r in rows])))
    return _epochs(lambda epoch: loader, epochs)


def _petastorm_torch(data: Path, epochs: int, seed: int):
    import numpy as np
    from petastorm import TransformSpec, make_batch_reader
    from petastorm.pytorch import DataLoader

    from pinstorm.pipeline.epochs import quiet_petastorm

    quiet_petastorm()
    rng = random.Random(seed)

    def decode(frame):
        frame["image"] = [torch_decode(jpeg, rng).numpy() for jpeg in frame["image"]]
        return frame

    spec = TransformSpec(decode, edit_fields=[("image", np.float32, (3, IMAGE_SIZE, IMAGE_SIZE), False)],
                         selected_fields=["image", "label"])
    reader = make_batch_reader((data / "parquet").as_uri(), schema_fields=["image", "label"], num_epochs=epochs,
                               shuffle_row_groups=True, seed=seed, reader_pool_type="thread", workers_count=WORKERS,
                               transform_spec=spec)
    loader = DataLoader(reader, batch_size=BATCH, shuffling_queue_capacity=1024)
    return ((batch["image"], batch["label"]) for batch in loader)


# --------------------------------------------------------------------------- writing the formats

def write_formats(rows: list[tuple[bytes, int]], data: Path) -> dict:
    """The same (jpeg, label) rows as TFRecord, WebDataset tars, MDS and HF Parquet; seconds each."""
    from streaming import MDSWriter   # before TensorFlow: importing it after TensorFlow crashed (SIGSEGV) here

    import datasets
    import numpy as np
    import tensorflow as tf
    import webdataset as wds

    seconds, shards = {}, np.array_split(np.arange(len(rows)), SHARDS)
    started = time.perf_counter()
    (data / "tfrecord").mkdir()
    for i, shard in enumerate(shards):
        with tf.io.TFRecordWriter(str(data / "tfrecord" / f"{i:03d}.tfrecord")) as writer:
            for at in shard:
                jpeg, label = rows[at]
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    seconds["tfrecord"] = time.perf_counter() - started
    started = time.perf_counter()
    (data / "webdataset").mkdir()
    for i, shard in enumerate(shards):
        with wds.TarWriter(str(data / "webdataset" / f"{i:03d}.tar")) as sink:
            for at in shard:
                sink.write({"__key__": f"{at:07d}", "jpg": rows[at][0], "cls": rows[at][1]})
    seconds["webdataset"] = time.perf_counter() - started
    started = time.perf_counter()
    with MDSWriter(out=str(data / "mds"), columns={"image": "bytes", "label": "int"}, size_limit=1 << 24) as out:
        for jpeg, label in rows:
            out.write({"image": jpeg, "label": label})
    seconds["mds"] = time.perf_counter() - started
    started = time.perf_counter()
    (data / "hf").mkdir()
    table = datasets.Dataset.from_dict({"image": [r[0] for r in rows], "label": [r[1] for r in rows]})
    for i in range(SHARDS):
        table.shard(SHARDS, i, contiguous=True).to_parquet(str(data / "hf" / f"{i:03d}.parquet"))
    seconds["hf_parquet"] = time.perf_counter() - started
    return {k: round(v, 2) for k, v in seconds.items()}


# --------------------------------------------------------------------------- timing

MODULES = {   # imported (and TensorFlow started) before a run is timed: a process's start, not the reader's
    "pinstorm make_dataset": ("tensorflow", "pinstorm.pipeline.reader"),
    "TFRecord + tf.data": ("tensorflow", "pinstorm.pipeline.reader"),
    "petastorm make_batch_reader + tf.data": ("tensorflow", "petastorm", "pinstorm.pipeline.reader"),
    "WebDataset": ("webdataset",),
    "Mosaic Streaming (MDS)": ("streaming",),
    "HF datasets (Parquet)": ("datasets",),
    "petastorm.pytorch DataLoader": ("petastorm", "petastorm.pytorch"),
}


def _import_for(name: str) -> None:
    import importlib

    for module in ("torch", "pinstorm.pipeline.torch_loader") if READERS[name][0] == "torch" else ():
        importlib.import_module(module)
    for module in MODULES.get(name, ()):
        importlib.import_module(module)
    if READERS[name][0] == "tensorflow":
        import tensorflow as tf

        tf.constant(0) + 1   # the runtime's start


def run_one(name: str, data: Path, epochs: int, seed: int, expected: int) -> dict:
    """One run: the seconds to the first batch (the reader's start), then images/s and CPU ms per image
    (this process and its workers) from the first batch to the last. Not after a longer warm-up:
    readers that decode ahead into buffers (petastorm's shuffling queue and thread pool hold decoded
    rows) would have work done before the window counted in it; what a reader buffers before its first
    batch counts for it, not against it."""
    from bench_torch_loader import _cpu

    _import_for(name)
    seen: dict = {}
    started = time.perf_counter()
    batches = iter(make_reader(name, data, epochs, seed))
    count = len(next(batches)[1])
    first, cpu = time.perf_counter(), _cpu(seen)
    end_cpu, timed = cpu, 0
    for batch in batches:
        timed += len(batch[1])
        end_cpu = _cpu(seen)
    seconds = time.perf_counter() - first
    return {"img_s": timed / seconds, "cpu_ms_per_img": 1000 * (end_cpu - cpu) / max(1, timed),
            "first_batch_s": round(first - started, 3), "complete": count + timed == expected,
            "images": count + timed}


def interleaved(data: Path, rounds: int, epochs: int, expected: int, readers) -> dict:
    """Each reader once a round, in its own process; each round starts one reader later, so no reader
    always runs first (after the data was written) or always after the same one."""
    runs: dict = {name: [] for name in readers}
    for round_ in range(rounds):
        shift = round_ % len(readers)
        for name in readers[shift:] + readers[:shift]:
            python = PETASTORM_PYTHON if READERS[name][1] == "petastorm" else Path(sys.executable)
            done = subprocess.run([str(python), __file__, "--run-one", name, str(data), str(epochs), str(round_),
                                   str(expected)], capture_output=True, text=True)
            if done.returncode != 0 or "RUN" not in done.stdout:
                runs[name].append({"error": (done.stderr or done.stdout).strip().splitlines()[-1:]})
                print(f"  {name}: FAILED {runs[name][-1]['error']}", flush=True)
                continue
            run = json.loads(done.stdout.rsplit("RUN", 1)[1])
            runs[name].append(run)
            print(f"  {name}: {run['img_s']:.0f} img/s, {run['cpu_ms_per_img']:.2f} CPU ms/img"
                  + ("" if run["complete"] else f"  SHORT: {run['images']} of {expected}"), flush=True)
    out = {}
    for name, values in runs.items():
        good = [v for v in values if v.get("complete")]
        if not good:
            out[name] = {"framework": READERS[name][0], "error": [v.get("error") or v for v in values][-1]}
            continue
        rates = sorted(v["img_s"] for v in good)
        out[name] = {"framework": READERS[name][0], "img_s": round(rates[-1], 1),
                     "median_img_s": round(rates[(len(rates) - 1) // 2], 1),
                     "cpu_ms_per_img": round(min(v["cpu_ms_per_img"] for v in good), 3),
                     "all_runs_img_s": [round(v["img_s"], 1) for v in good],
                     "first_batch_s": min(v["first_batch_s"] for v in good)}
    return out


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "cpus": os.cpu_count()}
    for package in ("tensorflow", "torch", "webdataset", "mosaicml-streaming", "datasets", "pyarrow", "numpy",
                    "simplejpeg", "pinstorm"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = None
    petastorm = subprocess.run([str(PETASTORM_PYTHON), "-c", "import petastorm, pyarrow; print(petastorm.__version__, "
                                "pyarrow.__version__)"], capture_output=True, text=True)
    out["petastorm (in .venv)"] = petastorm.stdout.strip() or petastorm.stderr.strip()[-200:]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="240 images, 2 epochs, one round")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    parser.add_argument("--readers", default=None, help="comma-separated reader names (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--run-one", nargs=5, help=argparse.SUPPRESS)   # one measured run's own process
    args = parser.parse_args(argv)
    if args.run_one:
        name, data, epochs, seed, expected = args.run_one
        print("RUN" + json.dumps(run_one(name, Path(data), int(epochs), int(seed), int(expected))))
        return 0
    images, epochs = (240, 2) if args.quick else (3200, 5)
    rounds = args.rounds or (1 if args.quick else 3)
    readers = [r.strip() for r in args.readers.split(",")] if args.readers else list(READERS)

    import pyarrow.parquet as pq

    from pinstorm.pipeline import convert, dataset_info, scan
    from pinstorm.pipeline.samples import make_imagenet_size_tree

    results: dict = {"machine": {**versions(), "load_average_at_start": round(os.getloadavg()[0], 2)},
                     "images": images, "epochs_per_run": epochs, "rounds": rounds, "batch_size": BATCH,
                     "image_size": IMAGE_SIZE, "workers": WORKERS, "shards": SHARDS,
                     "decode": "TensorFlow readers: make_dataset's map (pipeline.reader.preprocess_fn: window decode, "
                               "DCT scaling, resize, flip); torch readers: pinstorm's per-image function "
                               "(pipeline.torch_loader: simplejpeg decode, crop, torch resize, flip, scale)"}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        data = Path(tmp)
        make_imagenet_size_tree(data / "tree", classes=8, per_class=images // 8, seed=0)
        convert(scan(data / "tree"), data / "parquet", min_row_groups=SHARDS, progress=False)
        info = dataset_info(data / "parquet")
        table = pq.read_table(data / "parquet", columns=["image", "label"])
        rows = list(zip(table.column("image").to_pylist(), table.column("label").to_pylist()))
        results["dataset"] = {"rows": info["rows"], "row_groups": info["row_groups"],
                              "mb": round(info["bytes"] / 2**20, 1)}
        results["write_seconds"] = write_formats(rows, data)
        print(f"dataset: {info['rows']} rows, {results['dataset']['mb']} MB; formats written "
              f"{results['write_seconds']}", flush=True)
        results["read"] = interleaved(data, rounds, epochs, info["rows"] * epochs, readers)
    results["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    results["ratios"] = ratios(results["read"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / "peers.png")
    print(json.dumps(results["ratios"], indent=1))
    print(f"wrote {args.out / 'peers.json'} and {args.out / 'peers.png'}")
    return 0


def ratios(read: dict) -> dict:
    """Per framework: pinstorm's best reader against the best peer (best run and median)."""
    out = {}
    for framework in ("tensorflow", "torch"):
        ours = [v for n, v in read.items() if v["framework"] == framework and n.startswith("pinstorm") and "img_s" in v]
        peers = {n: v for n, v in read.items() if v["framework"] == framework and not n.startswith("pinstorm")
                 and "img_s" in v}
        if not ours or not peers:
            continue
        best_peer = max(peers, key=lambda n: peers[n]["img_s"])
        mine = max(ours, key=lambda v: v["img_s"])
        out[framework] = {"best_peer": best_peer,
                          "pinstorm_to_best_peer": round(mine["img_s"] / peers[best_peer]["img_s"], 3),
                          "pinstorm_to_best_peer_median": round(
                              max(v["median_img_s"] for v in ours) / max(v["median_img_s"] for v in peers.values()),
                              3)}
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    read = {n: v for n, v in results["read"].items() if "img_s" in v}
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, framework in zip(axes, ("tensorflow", "torch")):
        names = [n for n, v in read.items() if v["framework"] == framework]
        rates = [read[n]["img_s"] for n in names]
        colors = ["#c84" if n.startswith("pinstorm") else "#48c" for n in names]
        ax.barh(names, rates, color=colors)
        ax.scatter([read[n]["median_img_s"] for n in names], names, color="k", marker="|", s=300, zorder=3)
        for y, n in enumerate(names):
            ax.text(read[n]["img_s"], y, f" {read[n]['img_s']:.0f} img/s, {read[n]['cpu_ms_per_img']:.2f} CPU ms",
                    va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(rates or [1]) * 1.7)
        ax.set_xlabel("images / s (bar: best run; |: median)")
        ratio = results["ratios"].get(framework)
        ax.set_title(f"{framework}: pinstorm / best peer = {ratio['pinstorm_to_best_peer']:.2f}" if ratio
                     else framework, fontsize=10)
    fig.suptitle(f"{results['images']} ImageNet-size JPEGs -> {IMAGE_SIZE} px crops, batch {BATCH}, "
                 f"{results['machine']['cpus']} CPUs (load {results['machine']['load_average_at_start']:.1f} to "
                 f"{results['machine']['load_average_at_end']:.1f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
