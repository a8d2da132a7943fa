"""The training recipe both fits share (`FitOptions`: lr_schedule, warmup_epochs, weight_decay,
label_smoothing): one rule for the learning rate of every step, the same decay and smoothing in PyTorch and
in TensorFlow, and the rates a fit logs are the rates it trained with, across resumes and resizing phases."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from pinstorm.training import TrainingError  # noqa: E402
from pinstorm.training.runs import FitOptions, decays  # noqa: E402

pytest_plugins = ["conftest_training"]


def rates(recipe: FitOptions, steps: int) -> list[float]:
    return [recipe.learning_rate_at(s, steps) for s in range(recipe.epochs * steps)]


def test_warmup_rises_linearly_then_the_schedule_runs():
    warm = rates(FitOptions(epochs=4, learning_rate=0.4, warmup_epochs=1), steps=4)
    assert warm == pytest.approx([0.1, 0.2, 0.3, 0.4] + [0.4] * 12)

    cosine = rates(FitOptions(epochs=3, learning_rate=1.0, lr_schedule="cosine", warmup_epochs=1), steps=2)
    assert cosine[:2] == pytest.approx([0.5, 1.0])                       # the warm-up, then the cosine from 1
    assert cosine[2:] == pytest.approx([0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)])
    assert all(a > b > 0 for a, b in zip(cosine[2:], cosine[3:]))       # down to, not at, zero

    step = FitOptions(epochs=90, learning_rate=0.1, lr_schedule="step", warmup_epochs=5)
    by_epoch = {epoch: step.learning_rate_at(epoch * 10, 10) for epoch in (5, 29, 30, 59, 60, 79, 80, 89)}
    assert by_epoch == pytest.approx({5: 0.1, 29: 0.1, 30: 0.01, 59: 0.01, 60: 1e-3, 79: 1e-3, 80: 1e-4, 89: 1e-4})
    assert FitOptions(epochs=2).learning_rate_at(7, 4) == FitOptions().learning_rate   # constant: no schedule
    assert not FitOptions().scheduled and FitOptions(warmup_epochs=0.5).scheduled


@pytest.mark.parametrize("option, value, message", [
    ("lr_schedule", "linear", "lr_schedule must be one of"),
    ("warmup_epochs", 11, r"warmup_epochs must be a number from 0 to epochs \(10\), got 11"),
    ("warmup_epochs", -1, "warmup_epochs"),
    ("weight_decay", -1e-4, "weight_decay must be a number of at least 0"),
    ("weight_decay", "1e-4", "weight_decay"),
    ("label_smoothing", 1.0, r"label_smoothing must be a number in \[0, 1\), got 1.0"),
    ("label_smoothing", True, "label_smoothing"),
    ("accumulate_batches", 0, "accumulate_batches must be a positive number of batches, got 0"),
    ("accumulate_batches", 2.0, "accumulate_batches"),
    ("ema_decay", 1, r"ema_decay must be a decay a step between 0 and 1 \(e.g. 0.9998\), got 1"),
    ("ema_decay", 0.0, "ema_decay"),
    ("ema_decay", True, "ema_decay"),
    ("ema_decay", "0.99", "ema_decay"),
])
def test_a_bad_recipe_is_refused_before_any_work(option, value, message):
    with pytest.raises(TrainingError, match=message):
        FitOptions(**{option: value})


def test_the_command_line_offers_the_recipe_on_both_training_commands():
    from pinstorm.cli import cli

    runner = CliRunner()
    for command in ("train", "spark-train"):
        shown = runner.invoke(cli, [command, "--help"]).output
        for flag in ("--lr-schedule", "--warmup-epochs", "--weight-decay", "--label-smoothing", "--accumulate-batches",
                     "--ema-decay"):
            assert flag in shown, (command, flag)
    refused = runner.invoke(cli, ["train", "alexnet", "data", "--label-smoothing", "1"])
    assert refused.exit_code == 2 and "--label-smoothing" in refused.output


def test_only_weights_of_more_than_one_dimension_decay():
    assert decays((64, 3, 3, 3)) and decays((3, 3, 3, 64)) and decays((4096, 1000))
    assert not decays((64,)) and not decays(())


# --------------------------------------------------------------------------- PyTorch

def test_torch_optimizers_decay_the_weights_alone():
    torch = pytest.importorskip("torch")
    from pinstorm.training.torch_fit import _optimizer

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                                torch.nn.Linear(4, 2))
    sgd = _optimizer(FitOptions(optimizer="sgd", weight_decay=1e-4), model)
    assert type(sgd) is torch.optim.SGD and sgd.defaults["momentum"] == 0.9
    decayed, kept = sgd.param_groups
    assert decayed["weight_decay"] == 1e-4 and kept["weight_decay"] == 0.0
    assert sorted(p.dim() for p in decayed["params"]) == [2, 4] and {p.dim() for p in kept["params"]} == {1}
    assert type(_optimizer(FitOptions(weight_decay=0.05), model)) is torch.optim.AdamW
    assert type(_optimizer(FitOptions(), model)) is torch.optim.Adam           # no decay: as before


def test_torch_label_smoothing_is_torchs_own():
    """What `train_torch` minimises with `label_smoothing` equals TensorFlow's smoothed loss on the same outputs."""
    torch = pytest.importorskip("torch")
    from pinstorm.training.keras_recipe import loss

    logits = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, 0])
    by_torch = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                                                 label_smoothing=0.1).item()
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    by_keras = float(loss(FitOptions(label_smoothing=0.1), 5)(labels, probabilities))
    assert by_keras == pytest.approx(by_torch, rel=1e-5)
    assert by_torch != pytest.approx(torch.nn.functional.cross_entropy(torch.from_numpy(logits),
                                                                       torch.from_numpy(labels)).item(), rel=1e-3)


def test_train_torch_follows_the_schedule_and_logs_its_rates(digits_parquet, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    from pinstorm.training.torch_fit import train_torch

    seen, step = [], torch.optim.SGD.step

    def recorded(self, *args, **kwargs):   # the rate each training step runs at
        seen.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.SGD, "step", recorded)
    recipe = dict(epochs=3, learning_rate=0.05, optimizer="sgd", lr_schedule="cosine", warmup_epochs=1,
                  weight_decay=1e-4, label_smoothing=0.1)
    result = train_torch("resnet_small", digits_parquet["train"], batch_size=8, image_size=32, steps_per_epoch=3,
                         seed=0, input_options={"flip": False}, model_kwargs={"width": 0.25},
                         output_dir=tmp_path / "run", **recipe)

    expected = FitOptions(**recipe)
    assert seen == pytest.approx(rates(expected, 3))
    assert result.history["learning_rate"] == pytest.approx([expected.learning_rate_at(3 * e + 2, 3)
                                                             for e in range(3)])
    assert all(np.isfinite(result.history["loss"]))


def test_torch_top5_counts_a_label_among_the_five_highest_outputs():
    torch = pytest.importorskip("torch")
    from pinstorm.training.torch_fit import _metrics, _step_sums

    logits = torch.tensor([[9., 8., 7., 6., 5., 4.], [9., 8., 7., 6., 5., 4.], [0., 1., 2., 3., 4., 5.]])
    labels = torch.tensor([0, 3, 0])   # top-1; fourth highest; sixth of six
    sums = _step_sums(torch.tensor(3.0), logits, labels, top_k=True).tolist()
    assert _metrics(sums) == pytest.approx({"loss": 1.0, "accuracy": 1 / 3, "top5_accuracy": 2 / 3})
    assert set(_metrics(_step_sums(torch.tensor(3.0), logits, labels, top_k=False).tolist())) == {"loss", "accuracy"}


# --------------------------------------------------------------------------- TensorFlow

def test_keras_sgd_decay_is_l2_on_the_gradient_and_adamw_spares_biases():
    """A zero gradient: SGD's first step moves a kernel by lr * wd * w (L2 through the momentum, as torch's SGD),
    AdamW's by lr * wd * w (decoupled); neither moves a bias."""
    import tf_keras as keras

    from pinstorm.training.keras_recipe import optimizer

    for name in ("sgd", "adam"):
        layer = keras.layers.Dense(3)
        model = keras.Sequential([keras.Input((4,)), layer])
        layer.bias.assign(np.ones(3, np.float32))
        kernel = layer.kernel.numpy()
        opt = optimizer(FitOptions(optimizer=name, learning_rate=0.5, weight_decay=0.1), 1, model)
        opt.apply_gradients([(np.zeros(v.shape, np.float32), v) for v in model.trainable_variables])
        assert layer.kernel.numpy() == pytest.approx(kernel * (1 - 0.5 * 0.1), rel=1e-5), name
        assert layer.bias.numpy() == pytest.approx(np.ones(3)), name


def test_train_needs_the_steps_of_an_epoch_for_a_schedule(tmp_path):
    """`train` (TensorFlow) with a tf.data.Dataset of unknown length: a schedule counts steps per epoch, so it
    needs `steps_per_epoch` (the schedule across progressive-resizing phases: tests/test_training_schedule.py)."""
    import tensorflow as tf

    from pinstorm.training import train

    data = tf.data.Dataset.from_tensor_slices((np.zeros((8, 8, 8, 3), np.float32), np.zeros(8, np.int32))).batch(4)
    with pytest.raises(TrainingError, match="needs the steps of an epoch"):
        train("mobilenet_v2", data, epochs=1, num_classes=3, lr_schedule="cosine", output_dir=tmp_path / "unknown",
              strategy=tf.distribute.OneDeviceStrategy("/cpu:0"), verbose=0)
    assert not (tmp_path / "unknown").exists()   # refused before it made its folder
