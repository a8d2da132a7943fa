"""One shape for the two frameworks: the options both readers share and those every fit shares are written
once (`pipeline.options.ReaderOptions`, `training.runs.FitOptions`); the public functions keep their keyword
arguments, and this proves their defaults, and the command line's, are those."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from pinstorm.pipeline.options import DEFAULTS as READER, ReaderOptionError, ReaderOptions

torch = pytest.importorskip("torch")


def _defaults(function) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


def test_both_readers_take_every_shared_option_with_its_one_default():
    from pinstorm.pipeline import make_dataset, make_torch_loader

    for reader in (make_dataset, make_torch_loader):
        defaults = _defaults(reader)
        assert {f.name: defaults.get(f.name, "missing") for f in dataclasses.fields(ReaderOptions)} \
            == dataclasses.asdict(READER), reader.__name__


def test_both_fits_take_every_shared_option_with_its_one_default():
    pytest.importorskip("tensorflow")
    from pinstorm.training import FitOptions, train, train_torch
    from pinstorm.training.runs import DEFAULTS as FIT

    for fit in (train, train_torch):
        defaults = _defaults(fit)
        assert {f.name: defaults.get(f.name, "missing") for f in dataclasses.fields(FitOptions)} \
            == dataclasses.asdict(FIT), fit.__name__


def test_the_command_line_flags_default_to_the_options():
    pytest.importorskip("tensorflow")
    from pinstorm.training import cli
    from pinstorm.training.runs import DEFAULTS as FIT, OPTIMIZERS

    for command in (cli.train, cli.spark_train_cmd):
        params = {p.name: p for p in command.params}
        assert params["epochs"].default == FIT.epochs and params["batch_size"].default == FIT.batch_size
        assert params["learning_rate"].default == FIT.learning_rate
        assert params["optimizer"].default == FIT.optimizer and tuple(params["optimizer"].type.choices) == OPTIMIZERS
        assert str(READER.crop_area[0]) in params["crop_min"].help
    assert cli.reader_options(True, 0.5) == {"flip": False, "crop_area": (0.5, READER.crop_area[1])}
    assert cli.reader_options(False, None) == {}


def test_the_pytorch_flags_offer_what_the_functions_take_and_leave_their_defaults_to_them():
    pytest.importorskip("tensorflow")
    from pinstorm.pipeline import DECODES, make_torch_loader
    from pinstorm.training import cli, train_torch
    from pinstorm.training.runs import PRECISIONS

    assert _defaults(train_torch)["precision"] in PRECISIONS and _defaults(make_torch_loader)["decode"] in DECODES
    for command in (cli.train, cli.spark_train_cmd):
        params = {p.name: p for p in command.params}
        assert tuple(params["precision"].type.choices) == PRECISIONS
        assert tuple(params["decode"].type.choices) == DECODES
        assert params["precision"].default is None and params["decode"].default is None
        assert params["cpu_share"].default is None and _defaults(make_torch_loader)["cpu_share"] == 0
    assert cli.torch_only("torch", None, False, None) == {}
    assert cli.torch_only("torch", "fp16", True, "gpu") == {"precision": "fp16", "compile": True,
                                                           "input_options": {"decode": "gpu"}}
    assert cli.torch_only("torch", None, False, "gpu", 0.4) == {"input_options": {"decode": "gpu", "cpu_share": 0.4}}
    assert cli.torch_only("tensorflow", None, False, None) == {}


@pytest.mark.parametrize("change, message", [
    ({"crop_area": (0.0, 1.0)}, "crop_area must satisfy"),
    ({"crop_area": (0.9, 0.5)}, "crop_area must satisfy"),
    ({"crop_area": "big"}, "crop_area must be a"),
    ({"eval_crop": 1.5}, "eval_crop must be in"),
    ({"num_epochs": 0}, "num_epochs must be"),
    ({"retries": -1}, "retries must be"),
    ({"shuffle_buffer": 0}, "shuffle_buffer must be"),
    ({"storage_options": ["key"]}, "storage_options must be a mapping"),
    ({"max_pixels": 0}, "max_pixels must be None or a positive integer"),
    ({"max_pixels": 1.5e6}, "max_pixels must be None or a positive integer"),
])
def test_both_readers_refuse_the_same_mistake_with_the_same_error(digits_url, change, message):
    from pinstorm.pipeline import make_dataset, make_torch_loader

    errors = []
    for reader in (make_dataset, make_torch_loader):
        with pytest.raises(ReaderOptionError, match=message) as caught:
            reader(digits_url, batch_size=4, image_size=16, **change)
        errors.append(str(caught.value))
        assert isinstance(caught.value, ValueError)     # what scripts caught before
    assert errors[0] == errors[1]


@pytest.fixture(scope="module")
def digits_url(tmp_path_factory):
    from pinstorm.pipeline import convert, make_digits_tree, scan

    base = tmp_path_factory.mktemp("options-digits")
    layout = scan(make_digits_tree(base / "tree", image_size=16, per_class=2, seed=0))
    return convert(layout, str(base / "ds"), split="train", progress=False).url


def test_fit_options_refuse_the_same_mistakes_for_both_frameworks():
    pytest.importorskip("tensorflow")
    from pinstorm.training import TrainingError, train, train_torch

    for fit in (train, train_torch):
        for change, message in (({"epochs": 0}, "epochs must be a positive integer"),
                                ({"optimizer": "rmsprop"}, "unknown optimizer 'rmsprop': use 'adam' or 'sgd'"),
                                ({"learning_rate": 0}, "learning_rate must be a positive number")):
            with pytest.raises(TrainingError, match=message):
                fit("alexnet", "/nonexistent/dataset", **change)
