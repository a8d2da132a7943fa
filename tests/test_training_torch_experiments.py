"""PyTorch runs as pinned experiments: ``pinstorm train --framework torch --pin`` stores a versioned run and
``load_experiment`` gives the module back. A torch run served by someone else (pinned to a local board,
served over HTTP on 127.0.0.1, read through a URL board) cannot run code, inflate memory, or build a
model beyond ``max_parameters``: each case is one ``ExperimentError`` naming the experiment."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from pinstorm import boards
from training_support import served_experiment

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training.experiments import ExperimentError, experiment_lineage, load_experiment  # noqa: E402
from pinstorm.training.torch_models import build_torch_model  # noqa: E402

LINEAGE = {"format": 1, "model": {"name": "alexnet", "image_size": 32, "num_classes": 10,
                                  "kwargs": {"width": 0.125}, "framework": "torch"}}


@pytest.fixture(scope="module")
def genuine():
    torch.manual_seed(0)
    return build_torch_model("alexnet", 10, 32, width=0.125).state_dict()


def _experiment(tmp_path, name, weights, lineage=None) -> Path:
    """A run folder as ``pin_run`` stages it: ``final.pt`` (a state dict, or whatever `weights` writes)."""
    folder = tmp_path / "runs" / name
    folder.mkdir(parents=True)
    if callable(weights):
        weights(folder / "final.pt")
    else:
        torch.save(weights, folder / "final.pt")
    (folder / "lineage.json").write_text(json.dumps(lineage or LINEAGE))
    return folder


def test_the_cli_pins_a_torch_run_and_it_loads_back(digits_parquet, board, tmp_path):
    from click.testing import CliRunner

    from pinstorm.cli import cli

    outcome = CliRunner().invoke(cli, [
        "train", "alexnet", digits_parquet["train"], "--framework", "torch", "--val", digits_parquet["val"],
        "--epochs", "1", "--batch-size", "8", "--image-size", "32", "--width", "0.125", "-o", str(tmp_path / "run"),
        "--pin", f"{board}/digits-torch", "--steps-per-epoch", "3"])
    assert outcome.exit_code == 0, outcome.output
    assert f"pinned as {board}/digits-torch version " in outcome.output
    files = sorted(Path(p).name for p in boards.pin_get("digits-torch", board=board, files=True))
    assert files == ["curves.png", "final.pt", "lineage.json", "metrics.csv"]
    lineage = experiment_lineage(f"{board}/digits-torch")
    assert lineage["model"]["framework"] == "torch" and lineage["model"]["kwargs"] == {"width": 0.125}
    assert lineage["model"]["parameters"] == sum(p.numel() for p in build_torch_model(
        "alexnet", 10, 32, width=0.125).parameters())
    assert lineage["packages"]["torch"] and set(lineage["val_metrics"]) == {"loss", "accuracy", "top5_accuracy"}
    assert lineage["steps_per_epoch"] == 3 and lineage["arguments"]["steps_per_epoch"] == 3   # --steps-per-epoch

    model = load_experiment(f"{board}/digits-torch")
    trained = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert isinstance(model, torch.nn.Module) and not model.training
    assert all(torch.equal(model.state_dict()[k], v) for k, v in trained.items())
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ExperimentError, match=r"has no final-ema.pt \(it was trained without ema_decay\)"):
        load_experiment(f"{board}/digits-torch", ema=True)
    bad = CliRunner().invoke(cli, ["train", "alexnet", digits_parquet["train"], "--framework", "torch",
                                   "-o", str(tmp_path / "run2"), "--pin", "no-such-board/x"])
    assert bad.exit_code == 1 and not (tmp_path / "run2" / "final.pt").exists()   # refused before the fit


def test_train_torch_pins_as_train_does(digits_parquet, board, tmp_path):
    """`train_torch(pin=..., lineage=...)` pins in Python as `train(pin=...)` does (the weights' moving average
    too, where one was kept); a bad target fails before the fit."""
    from pinstorm.training import train_torch

    result = train_torch("alexnet", digits_parquet["train"], epochs=1, batch_size=8, image_size=32, seed=0,
                         model_kwargs={"width": 0.125}, steps_per_epoch=2, output_dir=tmp_path / "run",
                         pin=f"{board}/py-torch", lineage={"note": "python"}, ema_decay=0.9)
    assert result.experiment["pin"] == f"{board}/py-torch" and "final-ema.pt" in result.experiment["files"]
    lineage = experiment_lineage(f"{board}/py-torch")
    assert lineage["lineage"] == {"note": "python"} and lineage["arguments"]["steps_per_epoch"] == 2
    assert lineage["arguments"]["ema_decay"] == 0.9 and "final-ema.pt" in lineage["files"]
    assert lineage["data"]["rows"] == digits_parquet["rows"]
    assert all(torch.equal(load_experiment(f"{board}/py-torch").state_dict()[k], v)
               for k, v in result.model.state_dict().items())
    average = torch.load(result.ema_weights_path, weights_only=True)
    assert all(torch.equal(load_experiment(f"{board}/py-torch", ema=True).state_dict()[k], v)
               for k, v in average.items())
    with pytest.raises(boards.BoardError, match="no-such-board"):
        train_torch("alexnet", digits_parquet["train"], epochs=1, batch_size=8, image_size=32,
                    output_dir=tmp_path / "run2", pin="no-such-board/x")
    assert not (tmp_path / "run2" / "final.pt").exists()


def test_a_genuine_remote_torch_experiment_loads(http_board, tmp_path, genuine):
    model = load_experiment(served_experiment(http_board, _experiment(tmp_path, "genuine", genuine)))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in genuine.items())


class _RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['PINSTORM_TEST_MARKER']}",))


def test_a_weights_file_that_would_run_code_is_refused(http_board, tmp_path, genuine, monkeypatch):
    marker = tmp_path / "ran"
    monkeypatch.setenv("PINSTORM_TEST_MARKER", str(marker))
    target = served_experiment(http_board, _experiment(tmp_path, "pickle", {**genuine, "extra": _RunsCode()}))
    with pytest.raises(ExperimentError, match="weights of experiment 'pickle' refused"):
        load_experiment(target)
    assert not marker.exists()


@pytest.mark.parametrize("case, match", [
    ("deflated", "compressed entries"),
    ("padded", "more than the model's tensors need"),
    ("declared", "entries declare more"),
    ("not a zip", "not a torch.save zip"),
    ("other tensors", "do not fit alexnet"),
])
def test_weights_beyond_the_model_are_refused_before_torch_reads_them(http_board, tmp_path, genuine, case, match):
    def write(path: Path) -> None:
        torch.save(genuine, path)
        if case == "deflated":                     # the same entries, compressed: a zip bomb's shape
            with zipfile.ZipFile(path) as source:
                entries = [(info, source.read(info)) for info in source.infolist()]
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as target:
                for info, data in entries:
                    target.writestr(info.filename, data)
        elif case == "padded":
            with open(path, "ab") as f:
                f.write(b"\0" * (8 << 20))
        elif case == "declared":                   # a small file whose entry claims 4 GB
            with zipfile.ZipFile(path, "a") as archive:
                archive.writestr("archive/data/huge", b"x")
            data = bytearray(path.read_bytes())
            at = data.rfind(b"archive/data/huge") - 46 + 24   # the central directory entry's uncompressed size
            data[at:at + 4] = (0xFFFFFFF0).to_bytes(4, "little")
            path.write_bytes(bytes(data))
        elif case == "not a zip":
            path.write_bytes(b"\x80\x02}q\x00." + b"\0" * 64)
        elif case == "other tensors":
            torch.save({k: torch.zeros(1) for k in genuine}, path)

    target = served_experiment(http_board, _experiment(tmp_path, case.replace(" ", "-"), write))
    with pytest.raises(ExperimentError, match=match):
        load_experiment(target)


def test_a_model_beyond_max_parameters_is_refused_before_it_is_built(http_board, tmp_path, genuine):
    lineage = json.loads(json.dumps(LINEAGE))
    lineage["model"].update(num_classes=1_000_000, kwargs={"width": 1.0})     # AlexNet: 4 G parameters
    target = served_experiment(http_board, _experiment(tmp_path, "huge", genuine, lineage))
    with pytest.raises(ExperimentError, match="parameters .limit max_parameters"):
        load_experiment(target)
    lineage["model"].update(num_classes=10, kwargs={"width": 0.125, "blocks": 3})   # not AlexNet's kwarg
    target = served_experiment(http_board, _experiment(tmp_path, "kwarg", genuine, lineage))
    with pytest.raises(ExperimentError, match="model kwarg 'blocks' is not one alexnet takes"):
        load_experiment(target)
