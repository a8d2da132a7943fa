"""Which of pinstorm's layers this environment can run: the boards core alone (CI runs it on the
oldest and newest Python) has neither the pipeline nor the training extras, and their tests skip."""

from __future__ import annotations

import importlib.util

import pytest

# extra -> the packages whose absence means the extra is not installed
EXTRA_MODULES = {"pipeline": ("PIL",), "training": ("PIL", "tensorflow"), "spark": ("PIL", "tensorflow", "pyspark"),
                 "kaggle": ("kaggle", "kagglesdk")}


def has_extra(extra: str | None) -> bool:
    return extra is None or all(importlib.util.find_spec(m) is not None for m in EXTRA_MODULES[extra])


def needs(extra: str | None):
    """A skip mark for a test of a layer whose extra is not installed here."""
    return pytest.mark.skipif(not has_extra(extra), reason=f"the {extra} extra is not installed (boards core only)")


def command_extra(command: str) -> str | None:
    """The extra a `pinstorm` command needs (`pinstorm.cli.COMMANDS`)."""
    from pinstorm.cli import COMMANDS

    return COMMANDS[command.split()[0]][2]
