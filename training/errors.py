"""The training layer's errors, under one base: ``except TrainingError`` catches whatever training
refuses or fails at on purpose, and each error keeps the built-in class users caught before (a
``ValueError`` for bad input, a ``RuntimeError`` for a broken runtime) as its second base."""

from __future__ import annotations

from pinstorm.errors import PinstormError


class TrainingError(PinstormError):
    """The base of every error the training layer raises on purpose (a `PinstormError`)."""


class InvalidTrainingInput(TrainingError, ValueError):
    """Training cannot start with what it was given: arguments, options, data, classes or a checkpoint."""
