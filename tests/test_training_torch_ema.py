"""train_torch(ema_decay=d): a moving average of the weights and batch-norm statistics, validated each epoch from
the same decoded batches, kept in the checkpoints (a run killed mid-epoch ends with the uninterrupted average),
written beside the final weights and pinned with them."""

from __future__ import annotations

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training.torch_fit import TrainingError, load_checkpoint, train_torch  # noqa: E402
from training_support import Killed, batch_recorder  # noqa: E402

ARGS = dict(epochs=2, steps_per_epoch=4, batch_size=8, image_size=32, seed=6, ema_decay=0.8,
            model_kwargs={"width": 0.25}, input_options={"flip": False, "crop_area": (0.6, 1.0)})


def test_the_average_is_validated_kept_across_a_kill_and_written_beside_the_weights(digits_parquet, tmp_path):
    whole = train_torch("resnet_small", digits_parquet["train"], digits_parquet["val"],
                        output_dir=str(tmp_path / "whole"), **ARGS)
    assert {"val_accuracy", "val_ema_accuracy", "val_ema_loss", "val_ema_top5_accuracy"} <= set(whole.history)
    assert whole.val_metrics["ema_accuracy"] == whole.history["val_ema_accuracy"][-1]
    average = torch.load(whole.ema_weights_path, weights_only=True)
    weights = whole.model.state_dict()
    assert average.keys() == weights.keys() and whole.ema_weights_path.endswith("final-ema.pt")
    assert not torch.equal(average["classifier.2.weight"], weights["classifier.2.weight"])
    running = [name for name in weights if name.endswith("running_mean")]
    assert running and not torch.equal(average[running[0]], weights[running[0]])   # batch-norm statistics too

    resumable = dict(ARGS, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=2)
    with pytest.raises(Killed):
        train_torch("resnet_small", digits_parquet["train"], digits_parquet["val"],
                    on_batch=batch_recorder([], kill_at=(1, 2)), **resumable)
    assert "ema" in load_checkpoint(tmp_path / "ckpt")   # the backup after step 2 of epoch 1 kept the average
    resumed = train_torch("resnet_small", digits_parquet["train"], digits_parquet["val"], **resumable)
    assert resumed.epochs == [1]
    for name, value in torch.load(resumed.ema_weights_path, weights_only=True).items():
        assert torch.equal(value, average[name]), name
    assert resumed.history["val_ema_accuracy"] == whole.history["val_ema_accuracy"][1:]


def test_without_a_decay_there_is_no_average_and_bad_decays_are_refused(digits_parquet, tmp_path):
    plain = train_torch("resnet_small", digits_parquet["train"], output_dir=str(tmp_path / "plain"),
                        **dict(ARGS, epochs=1, steps_per_epoch=1, ema_decay=None))
    assert plain.ema_weights_path is None and not (tmp_path / "plain" / "final-ema.pt").exists()
    for bad in (0, 1, 1.5, -0.1, True, "0.99"):
        with pytest.raises(TrainingError, match="ema_decay must be a decay a step between 0 and 1"):
            train_torch("resnet_small", digits_parquet["train"], ema_decay=bad)


def test_a_checkpoint_whose_average_does_not_fit_is_a_training_error_naming_it(digits_parquet, tmp_path):
    """A checkpoint is checked before torch reads it (tensors only, bounded); one whose parts do not fit the
    model (here a moving average of another shape, as a foreign or damaged backup may hold) is refused by
    name, not with torch's RuntimeError from deep inside the run."""
    args = dict(ARGS, epochs=1, steps_per_epoch=2, output_dir=str(tmp_path / "run"),
                checkpoint_dir=str(tmp_path / "ckpt"), backup_every=1)
    with pytest.raises(Killed):
        train_torch("resnet_small", digits_parquet["train"], on_batch=batch_recorder([], kill_at=(0, 1)), **args)
    path = tmp_path / "ckpt" / "checkpoint.pt"
    saved = torch.load(path, weights_only=True)
    saved["ema"] = {"n_averaged": torch.tensor(1), "module.classifier.2.weight": torch.zeros(3, 3)}
    torch.save(saved, path)
    with pytest.raises(TrainingError, match=r"checkpoint.pt does not fit this run of resnet_small: RuntimeError"):
        train_torch("resnet_small", digits_parquet["train"], **args)
