"""Pinned experiments: train(pin=...) stores a versioned run; pin_find finds it; its weights load back."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from pinstorm import boards
from pinstorm.training import experiment_lineage, find_experiments, load_experiment, make_strategy, train
from pinstorm.training.experiments import ExperimentError
from training_support import NO_FLIP, TINY

pytest_plugins = ["conftest_training"]


def _digits_on_board(board, base):
    """The digits tree converted straight onto a board (board://...), so lineage has a pin version."""
    from pinstorm.pipeline import convert, make_digits_tree, scan

    layout = scan(make_digits_tree(base / "tree", image_size=32, per_class=10, seed=0))
    converted = convert(layout, f"board://{board}/digits-train", split="train", min_row_groups=2, progress=False)
    return {"board": board, "url": converted.url, "rows": converted.rows}


@pytest.mark.slow
def test_a_pinned_run_is_versioned_found_and_loads_back(two_cpu_devices, board, tmp_path):
    pinned_digits = _digits_on_board(board, tmp_path)
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="nccl")   # falls back on CPUs
    args = dict(strategy=strategy, epochs=1, input_options=NO_FLIP, verbose=0, seed=0, **TINY)
    first = train("alexnet", pinned_digits["url"], output_dir=tmp_path / "run1", pin=f"{board}/digits-alexnet",
                  lineage={"note": "first"}, **args)
    second = train("alexnet", pinned_digits["url"], output_dir=tmp_path / "run2", pin=f"{board}/digits-alexnet", **args)

    assert first.experiment["pin"] == f"{board}/digits-alexnet" and "alexnet, val accuracy" in repr(first.experiment)
    versions = boards.pin_versions("digits-alexnet", board=board)
    assert list(versions["version"]) == [first.experiment["version"], second.experiment["version"]]

    files = sorted(p.split("/")[-1] for p in boards.pin_get("digits-alexnet", board=board, files=True))
    assert files == ["curves.png", "final.weights.h5", "lineage.json", "metrics.csv", "tensorboard.zip"]
    tensorboard = next(p for p in boards.pin_get("digits-alexnet", board=board, files=True) if p.endswith(".zip"))
    assert any(n.startswith("train/events.out.tfevents") for n in zipfile.ZipFile(tensorboard).namelist())

    lineage = experiment_lineage(f"{board}/digits-alexnet", version=first.experiment["version"])
    assert lineage["lineage"] == {"note": "first"}
    assert lineage["data"]["url"] == pinned_digits["url"] and lineage["data"]["rows"] == pinned_digits["rows"]
    data_version = str(boards.pin_versions("digits-train", board=pinned_digits["board"])["version"].iloc[-1])
    assert lineage["data"]["pins"] == [{"board": pinned_digits["board"], "pin": "digits-train",
                                        "version": data_version}]
    assert lineage["model"] == {"name": "alexnet", "image_size": 32, "num_classes": 10, "kwargs": {"width": 0.125},
                                "keras_name": "alexnet", "parameters": first.model.count_params()}
    assert lineage["strategy"]["fallback_from"] == "NcclAllReduce" and lineage["replicas"] == 2
    assert lineage["arguments"]["input_options"]["flip"] is False and lineage["arguments"]["seed"] == 0
    assert lineage["packages"]["tensorflow"] and lineage["packages"]["pinstorm"]
    assert lineage["wall_seconds"] >= lineage["fit_seconds"] > 0

    # found by model and by dataset; a dataset pin is not an experiment
    assert list(find_experiments(model="alexnet", board=board)["name"]) == ["digits-alexnet"]
    assert list(find_experiments(dataset="digits-train", board=board)["name"]) == ["digits-alexnet"]
    assert find_experiments(model="resnet50", board=board).empty
    assert list(find_experiments(board=board)["name"]) == ["digits-alexnet"]     # not the dataset pin

    # the latest run's weights come back into a freshly built model; an older version on request
    images = np.random.default_rng(0).random((4, 32, 32, 3), dtype=np.float32)
    loaded = load_experiment(f"{board}/digits-alexnet")
    for a, b in zip(loaded.get_weights(), second.model.get_weights()):   # the weights: exactly the same
        np.testing.assert_array_equal(a, b)
    # predictions of the same weights may differ in the last bits (thread scheduling of the reductions)
    np.testing.assert_allclose(loaded.predict(images, verbose=0), second.model.predict(images, verbose=0),
                               rtol=1e-5, atol=1e-6)
    older = load_experiment("digits-alexnet", board=board, version=first.experiment["version"])
    for a, b in zip(older.get_weights(), first.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_bad_targets_fail_before_training(two_cpu_devices, digits_arrays, board, tmp_path):
    import tensorflow as tf

    x, y, _, _ = digits_arrays
    data = tf.data.Dataset.from_tensor_slices((x[:16], y[:16]))
    strategy = make_strategy("one-device")
    with pytest.raises(boards.BoardNotRegistered):
        train("alexnet", data, strategy=strategy, num_classes=10, output_dir=tmp_path, pin="nowhere/run", **TINY)
    with pytest.raises(ExperimentError, match="cannot pin the experiment: .*path separator"):
        train("alexnet", data, strategy=strategy, num_classes=10, output_dir=tmp_path, pin=f"{board}/../x", **TINY)
    with pytest.raises(ExperimentError, match="reserved device name on Windows"):   # the boards' own rule
        train("alexnet", data, strategy=strategy, num_classes=10, output_dir=tmp_path, pin=f"{board}/con", **TINY)
    assert not (tmp_path / "metrics.csv").exists()                    # nothing was trained


def test_a_failed_pin_after_the_fit_names_the_outputs(two_cpu_devices, digits_arrays, board, tmp_path):
    import tensorflow as tf
    import tf_keras as keras

    class BoardGoes(keras.callbacks.Callback):     # the board disappears while the model trains
        def on_train_end(self, logs=None):
            boards.board_deregister(board, persist=False)

    x, y, _, _ = digits_arrays
    data = tf.data.Dataset.from_tensor_slices((x[:32], y[:32]))
    with pytest.raises(ExperimentError, match=r"training finished \(outputs in .*out\) but pinning the run as"):
        train("alexnet", data, strategy=make_strategy("one-device"), num_classes=10, epochs=1,
              output_dir=tmp_path / "out", pin=f"{board}/run", callbacks=[BoardGoes()], verbose=0, **TINY)
    assert (tmp_path / "out" / "final.weights.h5").stat().st_size > 0


def test_a_tampered_lineage_is_refused(two_cpu_devices, board, tmp_path):
    folder = tmp_path / "fake"
    folder.mkdir()
    (folder / "lineage.json").write_text(json.dumps({"model": {"name": "alexnet", "image_size": 10 ** 9,
                                                               "num_classes": 10}}))
    (folder / "final.weights.h5").write_bytes(b"not hdf5")
    boards.pin(str(folder), name="fake-run", board=board)
    with pytest.raises(ExperimentError, match="out of range"):
        load_experiment(f"{board}/fake-run")
    boards.pin(str(tmp_path / "fake" / "final.weights.h5"), name="not-a-run", board=board)
    with pytest.raises(ExperimentError, match="not a pinstorm experiment"):
        load_experiment("not-a-run", board=board)


def test_targets_name_a_board_object_or_a_registered_name_and_use_the_boards_pin_name_rule(tmp_path):
    from pinstorm.training.experiments import check_target, parse_target

    folder = boards.board_folder(tmp_path / "board", cache=tmp_path / "cache")
    assert parse_target((folder, "run")) == (folder, "run")
    assert check_target((folder, "run")) == (folder, "run")             # no registration needed
    assert parse_target("lab/run") == ("lab", "run") and parse_target("run") == (None, "run")
    for bad in ("con", "aux.txt", "a/b", "x..y", "-x", ""):
        with pytest.raises(ExperimentError):
            parse_target((folder, bad))


def test_an_experiment_record_shows_run_model_accuracy_board_pin_version_and_sizes():
    from pinstorm.training.experiments import ExperimentRecord

    record = ExperimentRecord(board="lab", name="digits-alexnet", version="20250101T000000Z-abc12",
                              pin="lab/digits-alexnet", run="/runs/r1", model="alexnet",
                              val_metrics={"accuracy": 0.91234, "loss": 0.3},
                              files={"final.weights.h5": 1_500_000, "lineage.json": 2_000})
    text = repr(record)
    assert text == ("<ExperimentRecord lab/digits-alexnet version 20250101T000000Z-abc12: alexnet, val accuracy "
                    "0.9123, 2 files, 1.5 MB>")
    html = record._repr_html_()
    for shown in ("/runs/r1", "alexnet", "0.9123", "lab", "digits-alexnet", "20250101T000000Z-abc12", "1.5 MB"):
        assert shown in html
    assert json.loads(json.dumps(record))["version"] == record["version"]     # still a plain JSON-able dict
    assert "<script>" not in ExperimentRecord(record, run="<script>")._repr_html_()   # escaped
