"""Fixtures of the training tests, loaded through ``pytest_plugins = ["conftest_training"]``.

Mirrored tests need two logical CPU devices, and TensorFlow fixes its devices when its runtime
starts. Test modules are all imported (collected) before any test runs, so splitting the CPU here,
at import time, happens before any other area's test can start the runtime with one device. Two
devices change nothing for single-device users (tf.data and one-device code run on CPU:0).
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from pinstorm.training.strategy import StrategyError, configure_cpu_devices  # noqa: E402
from training_support import Processes  # noqa: E402

try:
    configure_cpu_devices(2)
    _DEVICE_ERROR = None
except StrategyError as error:  # reported by the fixture, so only the tests that need two devices fail
    _DEVICE_ERROR = str(error)

@pytest.fixture
def two_cpu_devices():
    """The names of the two logical CPU devices (fails clearly if TF started with another count)."""
    if _DEVICE_ERROR:
        pytest.fail(f"two logical CPU devices are needed: {_DEVICE_ERROR}")
    return ["/device:CPU:0", "/device:CPU:1"]


@pytest.fixture(autouse=True)
def _no_tf_config(monkeypatch):
    """In-process tests never see a TF_CONFIG from the environment."""
    monkeypatch.delenv("TF_CONFIG", raising=False)


@pytest.fixture(scope="session")
def digits_arrays():
    """scikit-learn's digits as float32 RGB 8x8 images in [0, 1]: (x_train, y_train, x_val, y_val)."""
    import numpy as np
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.repeat((digits.images / 16.0).astype("float32")[..., None], 3, axis=-1)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order].astype("int32")
    cut = int(len(images) * 0.8)
    return images[:cut], labels[:cut], images[cut:], labels[cut:]


@pytest.fixture(scope="session")
def digits_parquet(tmp_path_factory):
    """A small digits tree converted to Parquet: {"root", "train", "val", "rows", "val_rows", "classes"}."""
    from pinstorm.pipeline import convert, make_digits_tree, scan

    base = tmp_path_factory.mktemp("training-digits")
    layout = scan(make_digits_tree(base / "tree", image_size=32, per_class=20, seed=0))
    train = convert(layout, str(base / "train"), split="train", min_row_groups=8, progress=False)
    val = convert(layout, str(base / "val"), split="val", classes=train.classes, min_row_groups=2, progress=False)
    return {"root": base / "tree", "train": train.url, "val": val.url, "rows": train.rows, "val_rows": val.rows,
            "classes": train.classes}


@pytest.fixture
def processes():
    tracker = Processes()
    yield tracker
    tracker.kill_all()


@pytest.fixture
def board(tmp_path):
    """A local board registered in this process only (the user's config is never touched)."""
    import contextlib
    import uuid

    from pinstorm import boards

    name = f"experiments-{uuid.uuid4().hex[:6]}"
    boards.board_register("local", name=name, path=tmp_path / "board", cache=tmp_path / "cache")
    yield name
    with contextlib.suppress(boards.BoardNotRegistered):
        boards.board_deregister(name, persist=False)
