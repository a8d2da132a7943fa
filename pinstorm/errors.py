"""The one base class of every error pinstorm raises on purpose.

The command line turns any `PinstormError` into one clear line and exit code 1 (see `pinstorm.cli`);
a script can catch it to handle every failure pinstorm reports, whichever layer raised it. Each layer
has its own base under it (`boards.BoardError`, `pipeline.PipelineError`, `training.TrainingError`),
and each error keeps the built-in class it is (a `ValueError`, an `OSError`, ...) as a second base;
tests/test_architecture.py checks both.
"""

from __future__ import annotations


class PinstormError(Exception):
    """Base class of every boards, pipeline and training error."""


class MissingExtra(PinstormError, ImportError):
    """A feature whose optional dependencies are not installed; the message names the extra."""
