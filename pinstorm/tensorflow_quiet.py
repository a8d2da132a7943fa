"""Import TensorFlow without its start-up noise, for every layer that uses it.

TensorFlow (2.16 and later) writes its C++ start-up lines straight to file descriptor 2 *before* it
reads ``TF_CPP_MIN_LOG_LEVEL`` ("All log messages before absl::InitializeLog() is called are written
to STDERR", oneDNN's notice, "Could not find cuda drivers"), and on a machine without an NVIDIA driver
the first device listing logs "failed call to cuInit" as an ERROR, which level 2 still shows. So the
first import and the first GPU listing run with descriptor 2 captured, and what was captured is
written back minus the lines the log level hides, and minus the cuInit failure where there is no
driver to initialise. Everything else (Python warnings, real errors) is written back as it came.
The pipeline's readers and the training modules both get TensorFlow from `tensorflow()`.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
from typing import Iterator

# TensorFlow's C++ INFO and WARNING lines (oneDNN, "could not find cuda drivers") bury pinstorm's
# own output; errors still show. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# glog/absl lines: "I0000 00:00:1795474712.218618    3350 port.cc:153] ..."
_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] ")
_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}
_PRE_INIT_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_DRIVER_LINES = ("failed call to cuInit", "Could not find cuda drivers")
NVIDIA_DRIVER = "/proc/driver/nvidia/version"     # present wherever the NVIDIA kernel driver is loaded

_lock = threading.Lock()
_loaded = False


def min_log_level() -> int:
    """TensorFlow's ``TF_CPP_MIN_LOG_LEVEL`` (0 shows everything, 3 hides errors too)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def has_nvidia_driver() -> bool:
    return os.path.exists(NVIDIA_DRIVER)


def is_noise(line: str, level: int, driver: bool) -> bool:
    """Whether TensorFlow's own ``level`` setting would hide ``line``, or it is a CUDA failure on a
    machine that has no NVIDIA driver (nothing to fix there: TensorFlow runs on the CPU)."""
    if not driver and any(text in line for text in _NO_DRIVER_LINES):
        return True
    if line.startswith(_PRE_INIT_BANNER):
        return level >= 1
    match = _LOG_LINE.match(line)
    return bool(match) and _LEVELS[match.group(1)] < level


@contextlib.contextmanager
def filtered_stderr(level: int | None = None, driver: bool | None = None) -> Iterator[None]:
    """Capture file descriptor 2 (C++ and Python alike) and write it back without the noise lines."""
    level = min_log_level() if level is None else level
    driver = has_nvidia_driver() if driver is None else driver
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines(keepends=True)
                    if not is_noise(line, level, driver)]
            if kept:
                os.write(2, "".join(kept).encode())


def tensorflow():
    """The ``tensorflow`` module, imported (the first time) without its start-up noise; see above."""
    global _loaded
    if _loaded:
        return sys.modules["tensorflow"]
    from .extras import ensure

    ensure("tensorflow", "training", "TensorFlow (tf.data readers, Keras training)")   # MissingExtra, not a traceback
    with _lock:
        if not _loaded:
            with filtered_stderr():
                import tensorflow as tf

                tf.config.list_physical_devices("GPU")   # CUDA is initialised here (once per process)
            _loaded = True
    return sys.modules["tensorflow"]
