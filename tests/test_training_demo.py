"""`pinstorm demo` end to end (small size) and the `pinstorm train` command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pinstorm.cli import cli

pytest_plugins = ["conftest_training"]


@pytest.mark.slow
def test_demo_runs_end_to_end_and_writes_its_report(two_cpu_devices, tmp_path):
    from pinstorm import boards

    boards_before = boards.board_list()
    workdir = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--size", "small", "--workdir", str(workdir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("build ILSVRC digits tree", "repartition", "serve + open data.txt board",
                  "fetch categories over HTTP",
                  "convert to Parquet", "strategy + all-reduce probe", "train AlexNet"):
        assert stage in out
    assert re.search(r"fetch categories over HTTP .* images/s .*4 in parallel", out)
    assert "http://127.0.0.1:" in out
    assert "fell back from NcclAllReduce" in out and "with ReductionToOneDevice" in out
    assert re.search(r"final validation accuracy: \d\.\d{4}", out)

    summary = json.loads((workdir / "summary.json").read_text())
    assert len(summary["stages"]) == 7 and all(s["seconds"] >= 0 for s in summary["stages"])
    assert summary["strategy"]["fallback_from"] == "NcclAllReduce" and summary["strategy"]["replicas"] == 2
    # 40 balanced validation digits, chance 0.1: P(>= 20 right by luck) ~ 1e-9
    assert summary["train"]["num_classes"] == 10 and summary["val_accuracy"] >= 0.5, summary["history"]
    report = (workdir / "report.md").read_text()
    assert "| 7 | train AlexNet" in report and "fell back from NcclAllReduce" in report
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        assert (workdir / image).read_bytes()[:4] == b"\x89PNG"
    assert len(re.findall(r"!\[", report)) == 2                       # stage times + training curves

    # the run is pinned to the demo board; the report links the version and its lineage
    experiment = summary["experiment"]
    assert f"pinned as alexnet-digits version {experiment['version']}" in out
    version_dir = workdir / "board" / "alexnet-digits" / experiment["version"]
    links = [link for _, link in re.findall(r"(?<!!)\[([^\]]+)\]\(([^)]+)\)", report)]
    assert f"board/alexnet-digits/{experiment['version']}/" in links
    assert (workdir / f"board/alexnet-digits/{experiment['version']}/lineage.json").is_file()
    lineage = json.loads((version_dir / "lineage.json").read_text())
    assert len(lineage["lineage"]["category_pins"]) == 10
    assert all(p["version"] and p["url"].startswith("http://127.0.0.1:") for p in lineage["lineage"]["category_pins"])
    assert lineage["strategy"]["fallback_from"] == "NcclAllReduce"

    # everything stayed in the workdir; nothing was registered
    assert boards.board_list() == boards_before
    assert (workdir / "board" / "categories").is_dir() and (workdir / "cache").is_dir()

    # the report's own snippet loads the pinned run back (a board from a constructor, nothing registered)
    snippet = re.search(r"```python\n(.*?)```", report, re.S).group(1)
    scope: dict = {}
    exec(snippet, scope)
    model = scope["model"]
    assert model.output_shape == (None, 10) and model.count_params() == lineage["model"]["parameters"]
    assert boards.board_list() == boards_before
    # and through a registered board, as a user of the registry would
    from pinstorm.training import load_experiment
    boards.board_register("local", name="demo-again", path=workdir / "board", cache=tmp_path / "cache")
    assert load_experiment("demo-again/alexnet-digits").count_params() == model.count_params()


def test_train_command_reports_bad_input_clearly(two_cpu_devices, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(cli, ["train", "alexnet", str(tmp_path / "nowhere"), "--strategy", "one-device",
                                  "--output-dir", str(tmp_path / "out")])
    assert missing.exit_code == 1 and "Error:" in missing.output and "Traceback" not in missing.output
    unknown = runner.invoke(cli, ["train", "vgg99", str(tmp_path)])
    assert unknown.exit_code == 2 and "vgg99" in unknown.output
    bad_schedule = runner.invoke(cli, ["train", "alexnet", str(tmp_path), "--image-size", "0:128,six:192"])
    assert bad_schedule.exit_code == 2 and "EPOCH:SIZE" in bad_schedule.output


def test_train_command_takes_a_progressive_resizing_schedule(two_cpu_devices, digits_parquet, tmp_path):
    """`--image-size 0:32,1:40` reaches train() as [(0, 32), (1, 40)]: AlexNet's size-bound dense layers refuse it."""
    result = CliRunner().invoke(cli, ["train", "alexnet", digits_parquet["train"], "--strategy", "one-device",
                                      "--epochs", "2", "--image-size", "0:32,1:40", "--output-dir", str(tmp_path)])
    assert result.exit_code == 1 and "InvalidTrainingInput" in result.output and "Traceback" not in result.output
    assert "schedule" in result.output.lower() or "pooling" in result.output.lower(), result.output


def test_train_command_trains_pins_and_prints_json(two_cpu_devices, digits_parquet, tmp_path):
    from pinstorm import boards

    boards.board_register("local", name="runs", path=tmp_path / "board", cache=tmp_path / "cache")
    result = CliRunner().invoke(cli, [
        "train", "alexnet", digits_parquet["train"], "--val", digits_parquet["val"], "--strategy", "mirrored",
        "--devices", "2", "--cross-device-ops", "hierarchical", "--epochs", "1", "--batch-size", "8",
        "--image-size", "32", "--width", "0.125", "--no-flip", "--json", "--output-dir", str(tmp_path / "out"),
        "--ema-decay", "0.9", "--pin", "runs/cli-run"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # the summary is stdout's one line (CliRunner's output also holds stderr, where other threads may write)
    summary = json.loads(next(line for line in reversed(result.output.splitlines()) if line.startswith("{")))
    assert summary["strategy"]["cross_device_ops"] == "HierarchicalCopyAllReduce"
    assert summary["global_batch_size"] == 16 and summary["epochs"] == [0]
    assert Path(summary["metrics_csv"]).exists()
    versions = boards.pin_versions("cli-run", board="runs")
    assert list(versions["version"]) == [summary["experiment"]["version"]]
    lineage = json.loads(Path(next(p for p in boards.pin_get("cli-run", board="runs", files=True)
                                   if p.endswith("lineage.json"))).read_text())
    assert lineage["data"]["url"] == digits_parquet["train"] and lineage["validation_data"]["url"] == digits_parquet["val"]
    assert lineage["strategy"]["cross_device_ops"] == "HierarchicalCopyAllReduce"
    # the moving average of the weights, on two replicas: validated, written and pinned
    assert summary["ema_weights_path"].endswith("final-ema.weights.h5") and "ema_accuracy" in summary["val_metrics"]
    assert lineage["arguments"]["ema_decay"] == 0.9 and "final-ema.weights.h5" in lineage["files"]


def test_cli_does_not_load_tensorflow_until_a_training_command_runs():
    code = ("import sys, pinstorm.cli; from click.testing import CliRunner; "
            "r = CliRunner().invoke(pinstorm.cli.cli, ['--help']); "
            "assert 'demo' in r.output and 'train' in r.output and 'convert' in r.output and 'board' in r.output; "
            "assert 'profile' in r.output; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
