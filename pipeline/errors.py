"""The pipeline's errors, under one base: ``except PipelineError`` catches whatever the pipeline refuses
or fails at on purpose, and each error keeps the built-in class users caught before (a ``ValueError``
for bad input or data, an ``OSError`` for files) as its second base."""

from __future__ import annotations

from pinstorm.errors import PinstormError


class PipelineError(PinstormError):
    """The base of every error the pipeline raises on purpose (a `PinstormError`)."""


class InvalidPipelineInput(PipelineError, ValueError, TypeError):
    """An argument or a source the pipeline cannot use: a bad value, or a value of the wrong type (both
    built-in classes are kept, so `except ValueError` and `except TypeError` still catch what they did)."""


class WorkerHandoverError(PipelineError, OSError):
    """DataLoader workers could not hand batches over: the Unix socket through which a worker passes a batch's
    shared memory cannot be made in multiprocessing's temporary folder (under ``TMPDIR``)."""
