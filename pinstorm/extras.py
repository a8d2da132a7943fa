"""Optional dependencies: import them on first use, or say which extra installs them.

`pip install pinstorm` is the boards core; cloud boards, the pipeline, training and Spark each come
with an extra. Like fsspec does for its protocols, using a part whose extra is missing raises
`MissingExtra` naming the `pip install` command, rather than a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import MissingExtra


def require(module: str, extra: str, feature: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingExtra telling how to install `pinstorm[extra]`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise  # the module exists but something it imports is broken: show the real error
        what = feature or module
        raise MissingExtra(f"{what} needs the {module!r} package: pip install 'pinstorm[{extra}]'") from e


def ensure(module: str, extra: str, feature: str | None = None) -> None:
    """Like `require`, without importing: for package start-up, where importing (TensorFlow) is slow."""
    if importlib.util.find_spec(module) is None:
        what = feature or module
        raise MissingExtra(f"{what} needs the {module!r} package: pip install 'pinstorm[{extra}]'")
