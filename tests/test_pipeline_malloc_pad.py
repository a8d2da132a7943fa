"""`make_dataset` pads glibc's heaps (`pipeline.malloc_pad`): under the mmap threshold TensorFlow's
``from_generator`` kernel fixes at 128 KiB, a thread's buffer of an image's size is still served from its heap,
not mapped and faulted in afresh each time. Measured in real processes, by their own page-fault counters."""

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

# A process where TensorFlow's GeneratorDataset kernel would have run (its mallopt call, as traced in TF 2.21),
# padded by `pad_heaps` or not; then a new thread (a heap of its own) takes and frees a 112x112 float image's
# buffer 100 times: its page faults a buffer.
_PROBE = r"""
import ctypes, json, sys, threading
libc = ctypes.CDLL(None)
libc.mallopt(-3, 128 * 1024)   # M_MMAP_THRESHOLD, what ApplyPython311MemoryPatch sets
if sys.argv[1] == "pad":
    from pinstorm.pipeline.malloc_pad import pad_heaps
    assert pad_heaps()
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

# `make_dataset` reads one batch; the pad this process then has.
_READ = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from pinstorm.pipeline import make_dataset, malloc_pad
next(iter(make_dataset(sys.argv[1], batch_size=2, image_size=112, num_epochs=1, seed=1)))
print(malloc_pad._applied)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("pad")
    return convert(make_imagenet_size_tree(root / "tree", classes=2, per_class=2, seed=1), root / "ds",
                   progress=False).url


def _last_line(*args: str, **env) -> str:
    run = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


@glibc
def test_an_image_buffer_stays_in_the_heap_under_tensorflows_threshold():
    padded = json.loads(_last_line(_PROBE, "pad"))["faults"]
    unpadded = json.loads(_last_line(_PROBE, "none"))["faults"]
    assert unpadded > 30   # every page of the buffer (37), each time: what TensorFlow's threshold brings
    assert padded < 4, f"{padded} page faults a 147 KiB buffer: mapped afresh each time"


@glibc
def test_make_dataset_pads_the_heaps_unless_told_not_to(dataset):
    pytest.importorskip("tensorflow")
    assert _last_line(_READ, dataset) == f"[{malloc_pad.TOP_PAD}]"
    assert _last_line(_READ, dataset, PINSTORM_MALLOC_TOP_PAD="0") == "[]"


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
