"""`pinstorm train` into a log: the epoch's progress as lines (not silence for a whole epoch), and the
input-stall share where it is measured (the torch path)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["conftest_training"]

PINSTORM = str(Path(sys.executable).parent / "pinstorm")


def _train(framework: str, digits_parquet, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PINSTORM_PROGRESS"}   # as a user's job would run
    env["PINSTORM_PROGRESS_INTERVAL"] = "0"    # every step is past the interval: each one is a line
    return subprocess.run([PINSTORM, "train", "alexnet", digits_parquet["train"], "--framework", framework,
                           "--epochs", "2", "--steps-per-epoch", "3", "--batch-size", "8", "--image-size", "32",
                           "--width", "0.125", "--no-flip", "--output-dir", str(tmp_path / framework)],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("framework", ["tensorflow", "torch"])
def test_a_logged_training_run_shows_each_epoch_advancing(framework, digits_parquet, tmp_path):
    if framework == "torch":
        pytest.importorskip("torch")
    done = _train(framework, digits_parquet, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if re.match(r"epoch [12]/2: ", line)]
    assert any(line.startswith("epoch 1/2:") and "1/3 steps" in line for line in lines), done.stderr[-3000:]
    assert any(line.startswith("epoch 2/2: 100% |") and "3/3 steps" in line for line in lines), lines
    summary = next(line for line in done.stdout.splitlines() if "images/s" in line)
    if framework == "torch":
        assert re.search(r"images/s, input stall \d+%, global batch 8", summary), summary
    else:   # fetched inside TensorFlow's compiled step: `pinstorm profile` measures it there
        assert "input stall" not in summary
