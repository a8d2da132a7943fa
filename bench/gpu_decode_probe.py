"""Where GPU decode's time goes, part by part, on a GPU machine (a profile for issue 32's GPU check).

    python3 bench/gpu_decode_probe.py --out DIR [--smoke]

Measures, on the same ImageNet-size JPEGs as `gpu_check.py`: (1) nvJPEG alone, a batch of 256 in one
``torchvision.io.decode_jpeg(device="cuda")`` call, from 1, 2 and 4 threads at once (does its decoder
serialise?); (2) `DeviceDecoder`'s crop, resize, flip and scale alone, on decoded images; (3) the loader
alone with ``decode="gpu"`` (rows read, headers parsed, batches handed over, nothing decoded); (4) the
loader and the decoder together. Writes ``gpu_decode_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check  # noqa: E402  (beside this file)


class _Undecoded:
    """In the loader's decoder's place: the JPEG batch handed out as it arrives."""

    def __init__(self, device):
        self.device = device

    def __call__(self, batch):
        return batch


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--seconds", type=float, default=4.0)
    settings = parser.parse_args(argv)
    gpu_check.use_checkout()
    import torch
    try:
        import torchvision.io as tvio
    except ImportError:   # a CPU smoke run without torchvision: the nvJPEG parts are skipped
        tvio = None

    from pinstorm.pipeline import convert, make_torch_loader, scan
    from pinstorm.pipeline.device_decode import DeviceDecoder, JpegBatch

    device = torch.device("cuda" if torch.cuda.is_available() and not settings.smoke else "cpu")
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    batch = 16 if settings.smoke else 256
    size = (120, 160) if settings.smoke else (375, 500)
    work = Path(tempfile.mkdtemp(prefix="pinstorm-probe-"))
    classes, per_class = (4, 8) if settings.smoke else (64, 32)
    gpu_check.make_tree(work / "tree", classes=classes, per_class=per_class, size=size, workers=8)
    converted = convert(scan(work / "tree"), str(work / "ds"), split="train", progress=False)
    jpegs = [p.read_bytes() for p in sorted((work / "tree").rglob("*.JPEG"))][:batch]
    tensors = [torch.frombuffer(bytearray(j), dtype=torch.uint8) for j in jpegs]
    out = {"device": str(torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"),
           "batch": batch, "image": list(size), "mean_kb": sum(map(len, jpegs)) / len(jpegs) / 1e3}

    def decode():
        if tvio is None:
            return [torch.randint(0, 255, (3, *size), dtype=torch.uint8) for _ in tensors]
        return tvio.decode_jpeg(tensors, mode=tvio.ImageReadMode.RGB, device=device)

    out["nvjpeg_batched_1_thread"] = rate(decode, batch, settings.seconds, sync)
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
    fake = JpegBatch(batch)
    for i, image in enumerate(decoded):
        h, w = image.shape[-2:]
        fake[i].fill(jpegs[i], (0, 0, w, h), 2, i % 2 == 0, "probe")
    decoder = DeviceDecoder(device, (224, 224), torch.float32)
    decoder._decode = lambda b: decoded
    out["postprocess_alone"] = rate(lambda: decoder(fake), batch, settings.seconds, sync)
    print(json.dumps(out["postprocess_alone"]), flush=True)

    for workers in (4, 8):
        loader = make_torch_loader(converted.url, batch_size=batch, image_size=224, seed=0, num_epochs=None,
                                   decode="gpu", device=device, num_workers=workers, drop_remainder=True)
        loader.device_decoder = _Undecoded(device)
        batches = iter(loader)
        out[f"loader_alone_{workers}_workers"] = rate(lambda: next(batches), batch, settings.seconds, sync)
        del batches
        loader = make_torch_loader(converted.url, batch_size=batch, image_size=224, seed=0, num_epochs=None,
                                   decode="gpu", device=device, num_workers=workers, drop_remainder=True)
        batches = iter(loader)
        out[f"loader_and_decode_{workers}_workers"] = rate(lambda: next(batches), batch, settings.seconds, sync)
        del batches
        print(json.dumps({k: v for k, v in out.items() if "loader" in k}), flush=True)
    Path(settings.out).mkdir(parents=True, exist_ok=True)
    (Path(settings.out) / "gpu_decode_probe.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
