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
    from pinstorm.boards import registry

    boards_before = registry.board_specs()
    workdir = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--size", "small", "--workdir", str(workdir)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.output
    for stage in ("build ILSVRC digits tree", "repartition", "serve + register data.txt", "fetch categories over HTTP",
                  "convert to Parquet", "strategy + all-reduce probe", "train AlexNet"):
        assert stage in out
    assert re.search(r"fetch categories over HTTP .* images/s .*4 in parallel", out)
    assert "http://127.0.0.1:" in out
    assert "fell back from NcclAllReduce" in out and "with ReductionToOneDevice" in out
    assert re.search(r"final validation accuracy: \d\.\d{4}", out)

    summary = json.loads((workdir / "summary.json").read_text())
    assert len(summary["stages"]) == 7 and all(s["seconds"] >= 0 for s in summary["stages"])
    assert summary["strategy"]["fallback_from"] == "NcclAllReduce" and summary["strategy"]["replicas"] == 2
    assert 0.0 <= summary["val_accuracy"] <= 1.0
    report = (workdir / "report.md").read_text()
    assert "| 7 | train AlexNet" in report and "fell back from NcclAllReduce" in report
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report):
        assert (workdir / image).read_bytes()[:4] == b"\x89PNG"
    assert len(re.findall(r"!\[", report)) == 2                       # stage times + training curves
    # everything stayed in the workdir; the board registry is as it was
    assert registry.board_specs() == boards_before
    assert (workdir / "board" / "categories").is_dir() and (workdir / "cache").is_dir()


def test_train_command_reports_bad_input_clearly(two_cpu_devices, tmp_path):
    runner = CliRunner()
    missing = runner.invoke(cli, ["train", "alexnet", str(tmp_path / "nowhere"), "--strategy", "one-device",
                                  "--output-dir", str(tmp_path / "out")])
    assert missing.exit_code == 1 and "Error:" in missing.output and "Traceback" not in missing.output
    unknown = runner.invoke(cli, ["train", "vgg99", str(tmp_path)])
    assert unknown.exit_code == 2 and "vgg99" in unknown.output


def test_train_command_trains_and_prints_json(two_cpu_devices, digits_parquet, tmp_path):
    result = CliRunner().invoke(cli, [
        "train", "alexnet", digits_parquet["train"], "--val", digits_parquet["val"], "--strategy", "mirrored",
        "--devices", "2", "--cross-device-ops", "hierarchical", "--epochs", "1", "--batch-size", "8",
        "--image-size", "32", "--width", "0.125", "--no-flip", "--json", "--output-dir", str(tmp_path / "out")],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["strategy"]["cross_device_ops"] == "HierarchicalCopyAllReduce"
    assert summary["global_batch_size"] == 16 and summary["epochs"] == [0]
    assert Path(summary["metrics_csv"]).exists()


def test_cli_does_not_load_tensorflow_until_a_training_command_runs():
    code = ("import sys, pinstorm.cli; from click.testing import CliRunner; "
            "r = CliRunner().invoke(pinstorm.cli.cli, ['--help']); "
            "assert 'demo' in r.output and 'train' in r.output and 'convert' in r.output and 'board' in r.output; "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
