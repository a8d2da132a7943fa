"""Progressive resizing with PyTorch (`train_torch(image_size=[(epoch, size), ...])`): each phase trains and
validates at its size with one set of weights, a model whose weights depend on the size is refused before any
work, and a run killed in a later phase resumes there and ends as if never killed."""

from __future__ import annotations

import json
import signal
import textwrap

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training import TrainingError  # noqa: E402
from pinstorm.training.torch_fit import load_checkpoint, train_torch  # noqa: E402

SMALL = {"width": 0.25}
DIGITS = {"flip": True, "crop_area": (0.6, 1.0)}


def test_each_phase_trains_and_validates_at_its_size(digits_parquet, tmp_path, monkeypatch):
    from pinstorm.training import torch_models

    seen = []   # (training?, side) of every forward of the whole model
    forward = torch_models._ResNet.forward

    def recorded(self, images):
        seen.append((self.training, images.shape[-1]))
        return forward(self, images)

    monkeypatch.setattr(torch_models._ResNet, "forward", recorded)
    result = train_torch("resnet_small", digits_parquet["train"], digits_parquet["val"], epochs=3, batch_size=8,
                         image_size=[(0, 16), (2, 32)], steps_per_epoch=2, model_kwargs=SMALL, seed=0,
                         input_options=DIGITS, output_dir=tmp_path / "run")
    assert [side for training, side in seen if training] == [16, 16, 16, 16, 32, 32]
    evaluated = [side for training, side in seen if not training]
    batches = -(-digits_parquet["val_rows"] // 8)   # every validation row once an epoch
    assert evaluated == [16] * 2 * batches + [32] * batches
    assert result.epochs == [0, 1, 2] and len(result.history["val_accuracy"]) == 3


def test_a_model_whose_weights_depend_on_the_size_is_refused(digits_parquet, tmp_path):
    with pytest.raises(TrainingError, match=r"alexnet.s weights depend on the image size \(24 against 32 px\)"):
        train_torch("alexnet", digits_parquet["train"], epochs=2, batch_size=8, image_size=[(0, 24), (1, 32)],
                    model_kwargs={"width": 0.125}, output_dir=tmp_path / "run")
    with pytest.raises(TrainingError, match="must start at epoch 0"):
        train_torch("resnet_small", digits_parquet["train"], image_size=[(1, 16)], output_dir=tmp_path / "run")


KILLED_AT_STEP = """
import os, signal, sys, json
import torch
from pinstorm.training.torch_fit import train_torch
from pinstorm.training import torch_models

steps, forward = 0, torch_models._ResNet.forward
def counted(self, images):   # the whole model's training forwards: one per step
    global steps
    if self.training:
        steps += 1
        if steps == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)   # a crash in the middle of a step, after its input was taken
    return forward(self, images)
torch_models._ResNet.forward = counted
train_torch("resnet_small", sys.argv[1], **json.loads(sys.argv[3]))
"""


@pytest.mark.parametrize("kill_after_steps_of_phase_two, backup", [(2, (1, 0)), (5, (1, 3))])
def test_a_run_killed_in_a_later_phase_resumes_there_as_if_never_killed(digits_parquet, tmp_path, processes,
                                                                         kill_after_steps_of_phase_two, backup):
    args = dict(epochs=2, batch_size=8, image_size=[(0, 16), (1, 24)], model_kwargs=SMALL, seed=0,
                input_options=DIGITS, steps_per_epoch=8, learning_rate=0.05, optimizer="sgd", lr_schedule="cosine")
    whole = train_torch("resnet_small", digits_parquet["train"], output_dir=str(tmp_path / "whole"), **args)

    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=3)
    child = processes.start(["-c", textwrap.dedent(KILLED_AT_STEP), digits_parquet["train"],
                             str(8 + kill_after_steps_of_phase_two), json.dumps(resumable)])
    assert child.wait(180) == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == backup

    resumed = train_torch("resnet_small", digits_parquet["train"], **resumable)
    assert resumed.epochs == [1]
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
    assert resumed.history["loss"] == pytest.approx(whole.history["loss"][1:], rel=1e-12)
