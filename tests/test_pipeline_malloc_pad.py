"""`make_dataset` pads glibc's heaps (`pipeline.malloc_pad`): after TensorFlow's ``from_generator`` kernel
fixed glibc's mmap threshold at 128 KiB, a thread's buffer of an image's size is still served from its heap,
not mapped and faulted in afresh each time. Measured in a real process, by its own page-fault counter."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from pinstorm.pipeline import convert, make_imagenet_size_tree
from pinstorm.pipeline import malloc_pad

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")

# A process that reads one batch with `make_dataset` (so TensorFlow's GeneratorDataset kernel has run), then, in
# a new thread (a heap of its own), takes and frees a 112x112 float image's buffer 100 times: its page faults.
_PROBE = r"""
import ctypes, json, os, sys, threading
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from pinstorm.pipeline import make_dataset
next(iter(make_dataset(sys.argv[1], batch_size=2, image_size=112, num_epochs=1, seed=1)))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def faults():
    return int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[7])
out = {}
def work():
    before = faults()
    for _ in range(100):
        p = libc.malloc(150_528)
        libc.memset(p, 1, 150_528)
        libc.free(p)
    out["faults"] = (faults() - before) / 100
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("pad")
    return convert(make_imagenet_size_tree(root / "tree", classes=2, per_class=2, seed=1), root / "ds",
                   progress=False).url


def _faults_per_buffer(url: str, **env) -> float:
    run = subprocess.run([sys.executable, "-c", _PROBE, url], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])["faults"]


@glibc
def test_an_image_buffer_comes_from_the_heap_after_make_dataset(dataset):
    pytest.importorskip("tensorflow")
    padded = _faults_per_buffer(dataset)
    assert padded < 4, f"{padded} page faults a 147 KiB buffer: mapped afresh each time"
    alone = _faults_per_buffer(dataset, PINSTORM_MALLOC_TOP_PAD="0")
    if alone < 20:
        pytest.skip(f"this TensorFlow no longer fixes glibc's mmap threshold ({alone} faults a buffer unpadded)")
    assert alone > 30   # every page of the buffer (37), each time: what the pad avoids


def test_the_pad_wanted_follows_the_environment(monkeypatch):
    for name in ("PINSTORM_MALLOC_TOP_PAD", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(malloc_pad.platform, "system", lambda: "Linux")
    monkeypatch.setattr(malloc_pad.platform, "libc_ver", lambda: ("glibc", "2.36"))
    assert malloc_pad._wanted_pad() == malloc_pad.TOP_PAD
    monkeypatch.setenv("PINSTORM_MALLOC_TOP_PAD", "1048576")
    assert malloc_pad._wanted_pad() == 1 << 20
    monkeypatch.setenv("PINSTORM_MALLOC_TOP_PAD", "0")
    assert malloc_pad._wanted_pad() is None
    monkeypatch.setenv("PINSTORM_MALLOC_TOP_PAD", "lots")
    assert malloc_pad._wanted_pad() == malloc_pad.TOP_PAD   # a warning names the variable
    monkeypatch.delenv("PINSTORM_MALLOC_TOP_PAD")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.top_pad=1")   # the user's own pad is kept
    assert malloc_pad._wanted_pad() is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1")
    assert malloc_pad._wanted_pad() is None
    monkeypatch.delenv("MALLOC_TOP_PAD_")
    monkeypatch.setattr(malloc_pad.platform, "libc_ver", lambda: ("", ""))   # musl and others: untouched
    assert malloc_pad._wanted_pad() is None
