"""The command line never shows a traceback for an error: one line and exit 1 (2 for usage), the
traceback only with `--debug` or $PINSTORM_DEBUG=1; warnings print as one plain line."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner
from extras_support import command_extra, has_extra

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


# A usage mistake for every command (exit 2) and a failure where the flags were right (exit 1).
USAGE_MISTAKES = {
    "board register": ["board", "register", "datatxt", "--name", "x"],             # no --url
    "board register s3": ["board", "register", "s3", "--name", "y"],               # no --bucket
    "board register (taken)": ["board", "register", "local", "--path", "elsewhere"],  # re-points the default
    "board list": ["board", "list", "--bogus"],
    "board remove": ["board", "remove"],
    "board repair": ["board", "repair", "--older-than", "-1"],
    "board serve": ["board", "serve", ".", "--port", "70000"],
    "pin": ["pin"],
    "get": ["get"],
    "find": ["find", "--json", "--bogus"],
    "list": ["list", "extra-argument"],
    "info": ["info"],
    "versions": ["versions"],
    "remove": ["remove", "x"],                                                     # no terminal, no --yes
    "repartition": ["repartition", ".", "--board", "b", "--parallel", "0"],
    "fetch": ["fetch", "b", "--partition", "4/4"],
    "convert --partition": ["convert", "board://b", "out", "--partition", "3/2"],
    "convert --partitions": ["convert", ".", "out", "--partitions", "0"],
    "convert --quality": ["convert", ".", "out", "--quality", "80"],               # needs --max-side
    "inspect": ["inspect", "x", "--samples", "0"],
    "verify": ["verify"],
    "train": ["train", "alexnet", "x", "--crop-min", "2"],
    "train --image-size": ["train", "alexnet", "x", "--image-size", "0:0"],
    "train --framework": ["train", "alexnet", "x", "--framework", "torch", "--strategy", "mirrored"],
    "spark-train": ["spark-train", "alexnet"],                                     # neither DATA nor --partition-board
    "demo": ["demo", "--epochs", "0"],
    "profile": ["profile"],                                                        # nothing to profile
}

FAILURES = {
    "board register (unreachable)": ["board", "register", "http://127.0.0.1:9/", "--name", "dead"],
    "board repair": ["board", "repair", "no-such-board"],
    "get": ["get", "no-such-pin"],
    "get --offline": ["get", "no-such-pin", "--offline"],
    "find": ["find", "--board", "no-such-board"],
    "list": ["list", "--board", "no-such-board"],
    "info": ["info", "no-such-pin"],
    "versions": ["versions", "no-such-pin"],
    "remove": ["remove", "no-such-pin", "--yes"],
    "board remove": ["board", "remove", "no-such-board", "--yes"],
    "inspect": ["inspect", "no-such-dataset", "--no-sheet"],
    "verify": ["verify", "no-such-dataset"],
    "convert": ["convert", "no-such-folder", "out"],
    "fetch": ["fetch", "no-such-board"],
}


def _one_line(result) -> str:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("case", sorted(USAGE_MISTAKES))
def test_a_usage_mistake_is_one_line_and_exit_2(case, tmp_path, monkeypatch):
    if not has_extra(command_extra(USAGE_MISTAKES[case][0])):
        pytest.skip(f"`pinstorm {USAGE_MISTAKES[case][0]}` needs the {command_extra(USAGE_MISTAKES[case][0])} extra")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, USAGE_MISTAKES[case])
    assert result.exit_code == 2, (case, result.output)
    line = _one_line(result)
    assert line.startswith("Error: ") and "--help'" in line, line


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failure_is_one_line_and_exit_1(case, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # a command whose extra is missing fails the same way: one line, exit 1
    result = CliRunner().invoke(cli, FAILURES[case])
    assert result.exit_code == 1, (case, result.output)
    assert _one_line(result).startswith("Error: ")


def test_every_command_has_a_usage_mistake_tested():
    from pinstorm.cli import COMMANDS

    tested = {case.split(" (")[0].split(" --")[0].split(" s3")[0] for case in USAGE_MISTAKES}
    board_commands = {f"board {name}" for name in importlib.import_module("pinstorm.boards.cli").board.commands}
    assert (set(COMMANDS) - {"board"}) | board_commands <= tested


def test_python_advice_is_said_in_cli_terms(tmp_path):
    from pinstorm.cli import in_cli_terms

    board = boards.board_folder(tmp_path / "b")
    with pytest.raises(boards.PinNotFound) as caught:
        board.pin_get("absent-from-cache", download=False)
    assert "download=False" in str(caught.value)
    assert "--offline" in in_cli_terms(str(caught.value)) and "download=False" not in in_cli_terms(str(caught.value))
    result = CliRunner().invoke(cli, ["find", "--board", "no-such-board"])
    assert "board_register()" not in result.output and "pinstorm board register" in result.output


def test_registering_a_taken_name_needs_force_and_says_what_it_replaced(tmp_path):
    runner = CliRunner()
    first = runner.invoke(cli, ["board", "register", "local", "--name", "team", "--path", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    again = runner.invoke(cli, ["board", "register", "local", "--name", "team", "--path", str(tmp_path / "b")])
    assert again.exit_code == 2 and "--force" in again.output and str(tmp_path / "a") in again.output
    forced = runner.invoke(cli, ["board", "register", "local", "--name", "team", "--path", str(tmp_path / "b"),
                                 "--force"])
    assert forced.exit_code == 0 and f"replaces board 'team' (local: {tmp_path / 'a'})" in forced.output
    assert boards.registry.board_specs()["team"]["path"] == str(tmp_path / "b")


def test_registration_checks_that_the_board_answers_unless_no_check():
    runner = CliRunner()
    dead = runner.invoke(cli, ["board", "register", "http://127.0.0.1:9/", "--name", "dead"])
    assert dead.exit_code == 1 and "does not answer" in dead.output and "--no-check" in dead.output
    assert "dead" not in boards.registry.board_specs()
    unchecked = runner.invoke(cli, ["board", "register", "http://127.0.0.1:9/", "--name", "dead", "--no-check"])
    assert unchecked.exit_code == 0 and "dead" in boards.registry.board_specs()


def test_listings_print_json(tmp_path):
    runner = CliRunner()
    board = tmp_path / "b"
    assert runner.invoke(cli, ["board", "register", "local", "--name", "team", "--path", str(board)]).exit_code == 0
    source = tmp_path / "hello.txt"
    source.write_text("hi")
    assert runner.invoke(cli, ["pin", str(source), "--board", "team", "-d", "a greeting"]).exit_code == 0
    listed = json.loads(runner.invoke(cli, ["list", "--board", "team", "--json"]).output)
    assert listed == ["hello"]
    found = json.loads(runner.invoke(cli, ["find", "greeting", "--json"]).output)
    assert [row["name"] for row in found] == ["hello"] and found[0]["board"] == "team"
    versions = json.loads(runner.invoke(cli, ["versions", "hello", "--board", "team", "--json"]).output)
    assert len(versions) == 1 and "version" in versions[0]
    registered = json.loads(runner.invoke(cli, ["board", "list", "--json"]).output)
    assert {"name": "team", "kind": "local", "where": str(board)} in registered
    assert runner.invoke(cli, ["list", "--board", "team"]).output.split() == ["hello"]


def test_one_flag_spelling_across_commands():
    """-v is --verbose wherever it exists, -o is --output, and every listing takes --json."""
    from pinstorm.cli import COMMANDS

    ctx = click.Context(cli)
    commands = {name: cli.get_command(ctx, name) for name in COMMANDS if has_extra(COMMANDS[name][2])}
    commands.update({f"board {n}": c for n, c in commands.pop("board").commands.items()})
    for name, command in commands.items():
        for param in command.params:
            if "-v" in param.opts:
                assert "--verbose" in param.opts, (name, param.opts)
            if "-o" in param.opts:
                assert "--output" in param.opts, (name, param.opts)
            if "--version" in param.opts:
                assert param.opts == ["--version"], (name, param.opts)
    for listing in ("find", "list", "versions", "board list", "inspect", "info"):
        assert listing not in commands or any("--json" in p.opts for p in commands[listing].params), listing
    for writer in ("train", "spark-train", "demo", "profile", "convert"):
        assert writer not in commands or any("--overwrite" in p.opts for p in commands[writer].params), writer
        if writer != "convert" and writer in commands:
            assert any("--output" in p.opts for p in commands[writer].params), writer
    for destructive in ("remove", "board remove"):
        assert any("--yes" in p.opts for p in commands[destructive].params), destructive


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
