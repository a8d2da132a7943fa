"""The GPU path of `train_torch`, run on the CPU so it never rots: bf16 autocast, channels_last, device-side
JPEG decode (libjpeg-turbo standing in for nvJPEG), ResNet-50 of the reference shape, and the prepared GPU
check (`bench/gpu_check.py --smoke`), which a lent GPU machine runs at full size."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from pinstorm.training import TrainingError, train_torch  # noqa: E402
from pinstorm.training.torch_models import build_torch_model  # noqa: E402

pytest_plugins = ["conftest_training"]
ROOT = Path(__file__).resolve().parents[1]


def test_bf16_channels_last_and_device_decode_train_on_the_cpu(digits_parquet, tmp_path):
    """The device path inside `train_torch`, on the CPU (``"device": "cpu"``: libjpeg-turbo standing in for
    nvJPEG; a third of the batches decoded whole by the CPU, `cpu_share`); without that, ``decode="gpu"`` on a
    machine with no CUDA says so and takes the CPU path."""
    result = train_torch("resnet_small", digits_parquet["train"], digits_parquet["val"], epochs=1, batch_size=8,
                         image_size=32, seed=0, steps_per_epoch=3, output_dir=tmp_path / "run", precision="bf16",
                         channels_last=True, input_options={"decode": "gpu", "device": "cpu", "cpu_share": 1 / 3,
                                                            "flip": False})
    assert {k: result.strategy[k] for k in ("precision", "channels_last", "compiled", "decode", "cpu_share")} == {
        "precision": "bf16", "channels_last": True, "compiled": False, "decode": "gpu", "cpu_share": 1 / 3}
    assert set(result.val_metrics) == {"loss", "accuracy", "top5_accuracy"} and result.images_per_second > 0
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="decode='gpu': no CUDA device here; decoding on the CPU"):
            fallen = train_torch("resnet_small", digits_parquet["train"], epochs=1, batch_size=8, image_size=32,
                                 seed=0, steps_per_epoch=2, output_dir=tmp_path / "fallen",
                                 input_options={"decode": "gpu", "flip": False})
        assert fallen.strategy["decode"] == "cpu"
    plain = train_torch("resnet_small", digits_parquet["train"], epochs=1, batch_size=8, image_size=32, seed=0,
                        steps_per_epoch=2, output_dir=tmp_path / "plain")
    assert plain.strategy["precision"] == "fp32" and plain.strategy["channels_last"] is False   # CPU: as before
    with pytest.raises(TrainingError, match="precision must be one of"):
        train_torch("alexnet", digits_parquet["train"], precision="int8")


def test_resnet50_has_the_reference_shape():
    model = build_torch_model("resnet50", 1000, 224)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032   # torchvision's resnet50
    assert model(torch.zeros(1, 3, 64, 64)).shape == (1, 1000)


def _run_bench(script: str, *args: str) -> None:
    """Run a GPU script of bench/ at toy size; the images and Parquet it generates in a temporary folder of its
    own are gone when it ends (at full size they are gigabytes). That folder is a short one of the system's: under
    pytest's tmp_path, DataLoader workers' sockets would not fit (`check_worker_handover`)."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        done = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args], capture_output=True, text=True,
                              timeout=600, env={**os.environ, "TMPDIR": str(scratch)})
        assert done.returncode == 0, done.stderr[-2000:]
        left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))   # torch.compile's
        assert not left, f"{script} left {left}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_the_prepared_gpu_check_runs_its_code_paths_at_toy_size(tmp_path):
    _run_bench("gpu_check.py", "--smoke", "--out", str(tmp_path), "--quiet")
    data = json.loads((tmp_path / "gpu_check_smoke.json").read_text())
    measures = {(r["model"], r["measure"]) for r in data["runs"]}
    assert {("resnet50", "synthetic"), ("resnet50", "fed, cpu decode"), ("resnet50", "fed, gpu decode"),
            ("alexnet", "fed, gpu decode"), ("alexnet", "fed, gpu + cpu_share 0.4"), ("-", "decode alone, cpu"),
            ("-", "decode alone, gpu")} <= measures
    assert not [r for r in data["runs"] if "error" in r], data["runs"]
    assert all(r["images_per_second"] > 0 for r in data["runs"])
    assert data["summary"]["resnet50"]["synthetic_img_s"] > 0 and data["device"]


def test_the_gpu_decode_probe_times_each_part_at_toy_size(tmp_path):
    _run_bench("gpu_decode_probe.py", "--smoke", "--seconds", "0.2", "--out", str(tmp_path))
    data = json.loads((tmp_path / "gpu_decode_probe.json").read_text())
    parts = {"postprocess_alone", "loader_alone_4_workers", "loader_and_decode_4_workers"}
    assert parts <= set(data) and all(data[p]["images_per_second"] > 0 for p in parts)


def test_the_hybrid_decode_probe_measures_each_feed_and_where_the_time_goes_at_toy_size(tmp_path):
    """The probe a lent GPU runs next (CPU and GPU decode at once, `cpu_share`): its code paths, and its
    diagnosis with and without a share (each thread's core share; on a CPU no GPU busy share, said so)."""
    _run_bench("gpu_hybrid_probe.py", "--smoke", "--rounds", "1", "--seconds", "1", "--out", str(tmp_path))
    data = json.loads((tmp_path / "gpu_hybrid_probe.json").read_text())
    medians = data["medians_img_s"]
    assert set(medians) == {"synthetic", "cpu decode", "gpu decode", "gpu decode, cpu_share 0.5"}
    assert all(rate > 0 for rate in medians.values()), medians
    assert set(data["where_time_goes"]) == {"cpu_share 0", "cpu_share 0.5"}
    for diagnosis in data["where_time_goes"].values():
        assert diagnosis["images_per_second"] > 0 and diagnosis["gpu_busy"] is None, diagnosis
        shares = diagnosis["core_shares"]
        assert {"MainThread", "worker processes (cores)"} <= set(shares) and sum(shares.values()) > 0, shares


def test_uint8_batches_become_floats_on_the_device_as_the_cpu_path_scales_them():
    """CPU decode for a GPU hands uint8 batches (a quarter of the bytes over PCIe); scaled on the device they
    equal the float32 batches the CPU path makes."""
    from pinstorm.training.torch_fit import _to_device

    pixels = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    moved = _to_device(pixels, torch.device("cpu"), torch.channels_last)
    assert moved.dtype == torch.float32 and moved.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(moved, torch.empty(pixels.shape).copy_(pixels).mul_(1 / 255))
    already = torch.rand(2, 3, 4, 4)
    assert torch.equal(_to_device(already, torch.device("cpu"), None), already)
