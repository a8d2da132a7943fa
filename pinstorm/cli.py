"""The `pinstorm` console script: one command group, built here, explicitly.

Each layer keeps its commands beside the code they call (`boards/cli.py`, `pipeline/cli.py`,
`training/cli.py`); this module lists them and imports a layer only when one of its commands runs,
so `pinstorm board list` never loads pyarrow, TensorFlow or Spark, and works on the boards core
alone.

The one error policy: a usage mistake (a missing or invalid flag) is one line and exit 2; any other
error is one line and exit 1, in the CLI's terms (`CLI_TERMS`), with the traceback only on `--debug`.

The flags mean one thing everywhere: `-v/--verbose`, `-o/--output` (the folder a command writes),
`--overwrite` (replace what a command would otherwise refuse to touch), `--json` (every listing and
report as JSON), `-y/--yes` (do the destructive thing without asking), `-b/--board`, `--version` a
pin's version.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from .errors import MissingExtra, PinstormError

# command name -> (module, attribute, extra that brings its dependencies)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "board": ("pinstorm.boards.cli", "board", None),
    "pin": ("pinstorm.boards.cli", "pin_cmd", None),
    "get": ("pinstorm.boards.cli", "get_cmd", None),
    "find": ("pinstorm.boards.cli", "find_cmd", None),
    "list": ("pinstorm.boards.cli", "list_cmd", None),
    "info": ("pinstorm.boards.cli", "info_cmd", None),
    "versions": ("pinstorm.boards.cli", "versions_cmd", None),
    "remove": ("pinstorm.boards.cli", "remove_cmd", None),
    "repartition": ("pinstorm.pipeline.cli", "repartition", "pipeline"),
    "fetch": ("pinstorm.pipeline.cli", "fetch", "pipeline"),
    "convert": ("pinstorm.pipeline.cli", "convert", "pipeline"),
    "inspect": ("pinstorm.pipeline.cli", "inspect", "pipeline"),
    "verify": ("pinstorm.pipeline.cli", "verify", "pipeline"),
    "train": ("pinstorm.training.cli", "train", "training"),
    "demo": ("pinstorm.training.cli", "demo", "training"),
    "spark-train": ("pinstorm.training.cli", "spark_train_cmd", "spark"),
    "profile": ("pinstorm.training.cli", "profile", "training"),
}


class PinstormGroup(click.Group):
    """Loads each command's module on first use and reports pinstorm's errors without a traceback."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attribute, extra = COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attribute)
        except MissingExtra as e:   # named by the command's own extra, which holds whatever else it needs
            named = not extra or f"pinstorm[{extra}]" in str(e)
            return _unavailable(name, str(e) if named else f"needs pip install 'pinstorm[{extra}]' ({e})")
        except ModuleNotFoundError as e:
            if e.name and e.name.split(".")[0] == "pinstorm":
                raise
            return _unavailable(name, f"needs pip install 'pinstorm[{extra}]' (missing: {e.name})")

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.UsageError as e:
            raise OneLineUsageError(e) from e
        except (click.exceptions.Exit, click.Abort, click.ClickException, KeyboardInterrupt):
            raise
        except (PinstormError, OSError, ValueError) as e:   # ValueError: an argument the library refused
            if debugging(ctx):
                raise
            raise click.ClickException(_shown(in_cli_terms(f"{type(e).__name__}: {e}"))) from e
        except Exception as e:  # noqa: BLE001 - a bug or an unforeseen input: one line, the traceback on demand
            if debugging(ctx):
                raise
            raise click.ClickException(f"{type(e).__name__}: {_shown(str(e))} (unexpected: run again with "
                                       f"--debug, or set {DEBUG_ENV}=1, for the traceback)") from e


class OneLineUsageError(click.UsageError):
    """A usage mistake as one line that says where help is, exit 2 (click's own form takes four)."""

    def __init__(self, error: click.UsageError):
        super().__init__(error.format_message(), error.ctx)
        self.hint = f"see '{error.ctx.command_path} --help'" if error.ctx else "see 'pinstorm --help'"

    def show(self, file=None) -> None:
        click.echo(f"Error: {_shown(self.format_message())} ({self.hint})", file=file or sys.stderr)


DEBUG_ENV = "PINSTORM_DEBUG"

# Advice the library gives in Python terms, as the command line says it (library phrase -> CLI phrase).
CLI_TERMS = (
    ("register it with board_register() or `pinstorm board register`", "register it with `pinstorm board register`"),
    ("and download=False", "and --offline was given"),
    ("with create_bucket=True", "with --option create_bucket=true"),
    ("with allow_external=True (or a list of allowed origins)", "with --option allow_external=true"),
    ("pass overwrite=True (--overwrite)", "add --overwrite"),
    ("read its path with pin_get(..., files=True)", "take its files with `pinstorm get`"),
    ("use pin_download()", "use `pinstorm get`"),
)


def in_cli_terms(message: str) -> str:
    """`message` with its Python advice replaced by the flags and commands that do the same."""
    for python, cli_words in CLI_TERMS:
        message = message.replace(python, cli_words)
    return message


def _masked(text: str) -> str:
    """`text` with URL passwords and secret query values masked (`boards.safety.secrets`, the one rule). Imported
    here, not at the top: this module imports no layer until one of its commands runs."""
    from pinstorm.boards.safety.secrets import redact_text

    return redact_text(text)


def _shown(text: str) -> str:
    """`text` as pinstorm prints a message (an error, a warning): secrets masked, then one line with
    every control character escaped (`boards.display.escape`, the one rule: a message may quote a
    remote pin name, file name or YAML snippet, which must not drive the terminal)."""
    from pinstorm.boards.display import escape

    return escape(_masked(text))


def debugging(ctx: click.Context | None = None) -> bool:
    """--debug or $PINSTORM_DEBUG=1: show tracebacks instead of one line."""
    flag = bool(ctx and ctx.find_root().params.get("debug"))
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one plain line ("warning: ..."), not Python's path, line number and source line."""
    print(f"warning: {_shown(in_cli_terms(str(message)))}", file=file or sys.stderr)


def _unavailable(name: str, message: str) -> click.Command:
    """A stand-in for a command whose extra is not installed: its help and its run say what to install."""

    def run(**_):
        raise MissingExtra(f"pinstorm {name} {message}")

    return click.Command(name, callback=run, help=f"(unavailable: {message})", short_help=f"(unavailable: {message})",
                         context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


@click.group(cls=PinstormGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pinstorm")
@click.option("--debug", is_flag=True, help=f"Show the traceback of an error (also: ${DEBUG_ENV}=1).")
def cli(debug: bool) -> None:
    """pinstorm: pin, cache and share image data sets, stream them into TensorFlow, train at scale."""


def main() -> None:
    """The `pinstorm` console script."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
    if not debugging():
        import warnings

        warnings.showwarning = _one_line_warning
    try:
        cli(prog_name="pinstorm")
        code = 0
    except SystemExit as done:  # click ends every run this way
        code = done.code
    _leave(code)


def _leave(code) -> None:
    """End the process once the command's work and output are done, without the interpreter's final
    teardown: there, pyarrow's C++ thread pools can still abort a finished run ("terminate called
    without an active exception", apache/arrow#34314), and TensorFlow's can hang it. Python's own exit
    handlers (temporary folders, logging, filelock) run first, as in a normal exit."""
    import atexit
    import contextlib

    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits 1
        print(_shown(code), file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code or 0)


if __name__ == "__main__":
    main()
