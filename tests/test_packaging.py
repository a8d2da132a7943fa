"""One installable `pinstorm`: the namespace, light start-up, and extras that name themselves.

Missing extras are simulated in a fresh interpreter by putting `None` in `sys.modules` for the
dependency, which makes its import fail exactly as an uninstalled package does.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest
from extras_support import has_extra, needs


def _run(code: str, env: dict | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=180,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_only_the_pinstorm_namespace_is_installed():
    import pinstorm

    assert {"boards", "pipeline", "training"} <= set(pinstorm.__all__)
    assert pinstorm.boards.pin is not None
    if has_extra("pipeline"):
        assert pinstorm.pipeline.convert is not None
    provided = {top for top, dists in importlib.metadata.packages_distributions().items() if "pinstorm" in dists}
    assert provided == {"pinstorm"}, provided
    for generic in ("boards", "pipeline", "training", "tests", "bench"):
        assert generic not in provided


def test_board_commands_load_no_heavy_layer():
    out = _run("""
        import json, sys
        from click.testing import CliRunner
        from pinstorm.cli import cli
        result = CliRunner().invoke(cli, ["board", "list"])
        assert result.exit_code == 0, result.output
        heavy = ["tensorflow", "pyspark", "PIL", "petastorm", "pinstorm.pipeline", "pinstorm.training", "s3fs", "gcsfs",
                 "adlfs", "azure.storage.blob"]
        print(json.dumps([m for m in heavy if m in sys.modules]))
    """)
    assert json.loads(out) == []


@pytest.mark.parametrize("blocked, code, extra", [
    ("s3fs", "from pinstorm import boards; boards.board_register('s3', name='x', bucket='b')", "s3"),
    ("gcsfs", "from pinstorm import boards; boards.board_register('gcs', name='x', bucket='b')", "gcs"),
    ("adlfs", "from pinstorm import boards; boards.board_azure('c', name='x')", "azure"),
    ("kaggle", "from pinstorm import boards; boards.board_register('kaggle', name='k')", "kaggle"),
    ("PIL", "import pinstorm.pipeline", "pipeline"),
    ("tensorflow", "from pinstorm.training import train", "training"),   # the torch half needs no TensorFlow
    ("pyspark", "from pinstorm.training import spark_train", "spark"),
])
def test_a_missing_extra_names_what_to_install(blocked, code, extra):
    if extra == "spark" and not has_extra("training"):
        pytest.skip("without the training extra, training's own MissingExtra comes first")
    out = _run(f"""
        import sys
        sys.modules[{blocked!r}] = None
        import pinstorm
        try:
            {code}
        except pinstorm.MissingExtra as e:
            print("MissingExtra:", e)
        else:
            print("no error")
    """)
    assert out.startswith("MissingExtra:") and f"pinstorm[{extra}]" in out, out


def test_cli_reports_a_missing_extra_instead_of_a_traceback(tmp_path):
    out = _run("""
        import sys
        sys.modules["tensorflow"] = None
        from click.testing import CliRunner
        from pinstorm.cli import cli
        helped = CliRunner().invoke(cli, ["--help"])
        ran = CliRunner().invoke(cli, ["demo"])
        print(repr((helped.exit_code, "pinstorm[training]" in helped.output, ran.exit_code, ran.output)))
    """, env={**os.environ, "TMPDIR": str(tmp_path)})
    help_code, named_in_help, run_code, run_output = eval(out)
    assert help_code == 0   # the training commands stay listed: `train --framework torch` needs no TensorFlow
    assert run_code == 1 and "MissingExtra" in run_output and "pinstorm[training]" in run_output
    assert "Traceback" not in run_output
    assert not list(tmp_path.iterdir())   # the demo failed before making its temporary folder


@needs("pipeline")
def test_every_layers_errors_share_one_base_and_one_cli_policy(tmp_path):
    from click.testing import CliRunner

    from pinstorm import PinstormError
    from pinstorm.boards import BoardError
    from pinstorm.cli import cli
    from pinstorm.pipeline import LayoutError

    assert issubclass(BoardError, PinstormError) and issubclass(LayoutError, PinstormError)
    empty = tmp_path / "not-a-tree"
    empty.mkdir()
    result = CliRunner().invoke(cli, ["convert", str(empty), str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output.startswith("Error: LayoutError:"), result.output


def test_an_extra_this_python_cannot_have_says_why(monkeypatch):
    from pinstorm import extras

    monkeypatch.setattr(extras.sys, "version_info", (3, 10, 13, "final", 0))
    assert "needs Python 3.11 or newer" in extras._message("kaggle", "kaggle", "a Kaggle board")
    monkeypatch.setattr(extras.sys, "version_info", (3, 13, 0, "final", 0))
    assert "no wheels for Python 3.13" in extras._message("petastorm", "petastorm", None)
    assert "not on this Python" not in extras._message("kaggle", "kaggle", None)
