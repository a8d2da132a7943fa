"""Pad glibc's heaps once a tf.data reader is used, so its buffers are reused, not faulted in again.

Why: TensorFlow 2.21's ``GeneratorDataset`` kernel (``tf.data.Dataset.from_generator``, `make_dataset`'s row
source) calls ``mallopt(M_MMAP_THRESHOLD, 128 KiB)`` for the whole process (``ApplyPython311MemoryPatch``: by
its name, a patch for Python 3.11's memory use). That turns glibc's adaptive threshold off: from then on, every
buffer of 128 KiB or more (a 112x112 float image is 147 KiB, a 224x224 one 588 KiB) that a thread's heap cannot
serve from its top is mapped afresh and its pages faulted in, image after image. Measured at 40,000 small images
(1,000 classes, 120x160 JPEGs as `bench/bench_small_images.py` makes them, to 112 px; one epoch in a fresh
process, 5 interleaved rounds): `make_dataset` took 9-34 minor page faults an image and 441 us of CPU (median;
427-502), plain tf.data 0.2 faults and 354 us (352-369). With a top pad of 64 MiB (``M_TOP_PAD``: a heap keeps
that much free space at its top rather than handing it back), `make_dataset` took 3-4 faults and 387 us
(375-431), plain tf.data 354 (347-372). The Spark converter's tf reader (`columns_reader.make_columns_dataset`,
also ``from_generator``, a row group at a time) pads too: over two epochs of 500,000 tabular rows it took 0.91x
the CPU and a third of the page faults (`bench/bench_malloc_pad.py --tabular`).

The pad is memory a heap may keep instead of returning it, at most 64 MiB a heap: the peak RSS of those runs
did not grow (1.06-1.07 GB with it, 1.10-1.11 without). ``PINSTORM_MALLOC_TOP_PAD=0`` leaves the allocator
alone, another value sets the pad in bytes; a pad the user set (``GLIBC_TUNABLES``' ``glibc.malloc.top_pad``,
``MALLOC_TOP_PAD_``) is kept. Only glibc is touched.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from pinstorm.boards.safety import secrets

TOP_PAD = 64 << 20        # bytes each glibc heap keeps free at its top (glibc's per-thread heaps are 64 MiB)
_M_TOP_PAD = -2           # mallopt's parameter number (malloc.h)
_ENV = "PINSTORM_MALLOC_TOP_PAD"

log = secrets.logger(__name__)
_lock = threading.Lock()
_applied: list[int] = []   # the pad set in this process (at most one entry)


def pad_heaps() -> int | None:
    """Set glibc's heap top pad once per process (module docstring); the pad set, or None where left alone."""
    with _lock:
        if _applied:
            return _applied[0]
        pad = _wanted_pad()
        if pad is None:
            return None
        try:
            libc = ctypes.CDLL(None)   # this process's own symbols, glibc's among them (no ldconfig run)
            ok = libc.mallopt(_M_TOP_PAD, ctypes.c_int(pad)) == 1
        except (OSError, AttributeError):
            ok = False
        if not ok:
            log.debug("mallopt(M_TOP_PAD) not available; heaps left as they are")
            return None
        _applied.append(pad)
        return pad


def _wanted_pad() -> int | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    if "top_pad" in os.environ.get("GLIBC_TUNABLES", "") or "MALLOC_TOP_PAD_" in os.environ:
        return None   # the user's own setting
    value = os.environ.get(_ENV, "").strip()
    if not value:
        return TOP_PAD
    try:
        pad = int(value)
    except ValueError:
        log.warning("%s=%r is not a number of bytes; using %d", _ENV, value, TOP_PAD)
        return TOP_PAD
    return None if pad <= 0 else min(pad, 2**31 - 1)
