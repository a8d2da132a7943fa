"""TensorFlow loads without its start-up noise: the lines TF_CPP_MIN_LOG_LEVEL should hide (TensorFlow
prints them before it reads the variable) and the cuInit failure on a machine without an NVIDIA driver."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pinstorm.training.keras_env import filtered_stderr, has_nvidia_driver, is_noise

INFO = "I0000 00:00:1795474712.218618    3350 port.cc:153] oneDNN custom operations are on."
WARNING = "W0000 00:00:1795474712.218618    3350 x.cc:1] something TensorFlow warns about"
CUINIT = ("E0000 00:00:1795474713.118620    3350 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          "Failed call to cuInit: UNKNOWN ERROR (303)")
ERROR = "E0000 00:00:1795474713.118620    3350 collective_ops.cc:9] a real error"
BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def test_the_log_level_decides_like_tensorflow_would():
    assert is_noise(INFO, 2, True) and is_noise(WARNING, 2, True) and is_noise(BANNER, 2, True)
    assert not is_noise(ERROR, 2, True) and is_noise(ERROR, 3, True)
    assert not any(is_noise(line, 0, True) for line in (INFO, WARNING, ERROR, BANNER))
    assert not is_noise("Traceback (most recent call last):", 3, False)     # not a TensorFlow log line


def test_cuinit_failing_is_noise_only_where_there_is_no_driver():
    assert is_noise(CUINIT, 0, False) and is_noise(CUINIT, 2, False)
    assert not is_noise(CUINIT, 2, True)          # a driver that fails to initialise is worth seeing


def test_captured_stderr_is_written_back_without_the_noise(capfd):
    with filtered_stderr(level=2, driver=False):
        for line in (BANNER, INFO, CUINIT, ERROR):
            os.write(2, (line + "\n").encode())
        print("a Python warning", file=sys.stderr)
    assert sorted(capfd.readouterr().err.splitlines()) == sorted([ERROR, "a Python warning"])


@pytest.mark.slow
def test_importing_training_modules_prints_no_tensorflow_start_up_lines():
    if has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver: CUDA lines are real here")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    code = ("from pinstorm.training.strategy import make_strategy\n"
            "make_strategy('one-device')\n"
            "import tensorflow as tf; print(tf.constant(2).numpy())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "2", run.stderr[-2000:]
    for noise in ("cuInit", "absl::InitializeLog", "oneDNN custom operations", "Could not find cuda drivers"):
        assert noise not in run.stderr, run.stderr[-2000:]
