"""The command line never shows a traceback for an error: one line and exit 1 (2 for usage), the
traceback only with `--debug` or $PINSTORM_DEBUG=1; warnings print as one plain line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from click.testing import CliRunner

from pinstorm import boards
from pinstorm.cli import cli


def _broken_find(*args, **kwargs):
    raise RuntimeError("boom in pin_find")


def test_an_unexpected_error_is_one_line_that_says_how_to_see_the_traceback(monkeypatch):
    monkeypatch.setattr(boards.api, "pin_find", _broken_find)
    result = CliRunner().invoke(cli, ["find", "x"])
    assert result.exit_code == 1
    assert "RuntimeError: boom in pin_find" in result.output and "--debug" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setattr(boards.api, "pin_find", _broken_find)
    result = CliRunner().invoke(cli, ["--debug", "find", "x"])
    assert isinstance(result.exception, RuntimeError)  # raised through: click prints its traceback
    monkeypatch.setenv("PINSTORM_DEBUG", "1")
    assert isinstance(CliRunner().invoke(cli, ["find", "x"]).exception, RuntimeError)


def test_ordinary_mistakes_are_one_line_with_the_right_exit_code(tmp_path):
    runner = CliRunner()
    for args, code in ((["board", "register", "datatxt", "--name", "x"], 1),   # no --url
                       (["board", "register", "s3", "--name", "y"], 1),        # no --bucket
                       (["get", "no-such-pin"], 1),
                       (["find", "--board", "no-such-board"], 1),
                       (["versions"], 2)):                                    # a missing argument
        result = runner.invoke(cli, args)
        assert result.exit_code == code, (args, result.output)
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


WARNING_SCRIPT = textwrap.dedent("""
    import sys, warnings
    import click
    from pinstorm import cli

    @click.command()
    def warn_cmd():
        warnings.warn("careful: the index is stale", UserWarning)

    cli.COMMANDS["warn"] = ("__main__", "warn_cmd", None)
    sys.argv = ["pinstorm", "warn"]
    cli.main()
""")


def test_warnings_print_as_one_plain_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", WARNING_SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "warning: careful: the index is stale"
