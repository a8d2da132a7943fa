"""train_torch(backup_every=N): a run killed mid-epoch (SIGKILL in the middle of a step) resumes with
exactly the samples it had not trained on, and ends with the weights and metrics of a run never killed."""

from __future__ import annotations

import json
import signal
import sys
import textwrap

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training.torch_fit import TrainingError, load_checkpoint, train_torch  # noqa: E402

MODEL = dict(width=0.125, normalization=None, dropout=0.5)   # dropout: the random state must resume too
DIGITS = {"flip": True, "crop_area": (0.6, 1.0)}             # crops and flips: the input position must too

KILLED_AT_STEP = """
import os, signal, sys, json
import torch
from pinstorm.training.torch_fit import train_torch

steps = 0
def count_steps(module, inputs, output):   # the whole model's forward: one per training step
    global steps
    if type(module).__name__ == "AlexNet":
        steps += 1
        if steps == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)   # a crash in the middle of a step, after its input was taken
torch.nn.modules.module.register_module_forward_hook(count_steps)
train_torch("alexnet", sys.argv[1], **json.loads(sys.argv[3]))
"""


def test_a_run_killed_mid_epoch_resumes_with_the_rest_and_ends_as_if_never_killed(digits_parquet, tmp_path,
                                                                                  processes):
    args = dict(epochs=2, batch_size=8, image_size=32, model_kwargs=MODEL, seed=0, input_options=DIGITS)
    whole = train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"), **args)
    steps = whole.steps_per_epoch
    assert steps > 8

    kill_at = steps + 5   # in the second epoch, two steps after its backup at step 3
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=3)
    child = processes.start(["-c", textwrap.dedent(KILLED_AT_STEP), digits_parquet["train"], str(kill_at),
                             json.dumps(resumable)])
    assert child.wait(180) == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == (1, 3)
    (epoch, received), = json.loads(saved["partial"]["positions"])[0]["streams"]   # the loader's position
    assert epoch * digits_parquet["rows"] + received == (steps + 3) * 8     # what the fit had taken, no more

    resumed = train_torch("alexnet", digits_parquet["train"], **resumable)
    assert resumed.initial_epoch == 1 and resumed.epochs == [1]
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
    assert resumed.history["loss"] == pytest.approx(whole.history["loss"][1:], rel=1e-12)
    assert resumed.history["accuracy"] == whole.history["accuracy"][1:]
    assert not (tmp_path / "ckpt" / "checkpoint.pt").exists()


def test_a_backup_at_an_epoch_end_also_resumes_exactly(digits_parquet, tmp_path, processes):
    args = dict(epochs=2, batch_size=8, image_size=32, model_kwargs=MODEL, seed=1, input_options=DIGITS)
    whole = train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"), **args)
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"),
                     backup_every=whole.steps_per_epoch + 1)   # no mid-epoch backup: only the epoch's end
    child = processes.start(["-c", textwrap.dedent(KILLED_AT_STEP), digits_parquet["train"],
                             str(whole.steps_per_epoch + 2), json.dumps(resumable)])
    assert child.wait(180) == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == (1, 0)
    resumed = train_torch("alexnet", digits_parquet["train"], **resumable)
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_backup_every_needs_a_checkpoint_dir(digits_parquet):
    with pytest.raises(TrainingError, match="backup_every must be a positive number of steps, with a checkpoint_dir"):
        train_torch("alexnet", digits_parquet["train"], backup_every=3)
    with pytest.raises(TrainingError, match="backup_every"):
        train_torch("alexnet", digits_parquet["train"], backup_every=0, checkpoint_dir=sys.prefix)
