"""Optional dependencies: import them on first use, or say which extra installs them.

`pip install pinstorm` is the boards core; cloud boards, the pipeline, training and Spark each come
with an extra. Like fsspec does for its protocols, using a part whose extra is missing raises
`MissingExtra` naming the `pip install` command, rather than a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from .errors import MissingExtra


def require(module: str, extra: str, feature: str | None = None) -> ModuleType:
    """Import `module`, or raise MissingExtra telling how to install `pinstorm[extra]`."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
            raise  # the module exists but something it imports is broken: show the real error
        raise MissingExtra(_message(module, extra, feature)) from e


def ensure(module: str, extra: str, feature: str | None = None) -> None:
    """Like `require`, without importing: for package start-up, where importing (TensorFlow) is slow."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(_message(module, extra, feature))


# Extras whose dependencies exist only for some Pythons (pyproject's markers say the same):
# extra -> (oldest Python, first Python without it, why).
PYTHON_RANGE = {
    "kaggle": ((3, 11), None, "the Kaggle client pinstorm speaks (kaggle >= 1.8) needs Python 3.11 or newer"),
    "petastorm": (None, (3, 13), "petastorm 0.13.1 needs numpy < 2 and pyarrow 14, which have no wheels for "
                                 "Python 3.13 or newer"),
}


def _message(module: str, extra: str, feature: str | None) -> str:
    text = f"{feature or module} needs the {module!r} package: pip install 'pinstorm[{extra}]'"
    oldest, too_new, why = PYTHON_RANGE.get(extra, (None, None, ""))
    here = sys.version_info[:2]
    if (oldest and here < oldest) or (too_new and here >= too_new):
        text += f" (not on this Python {here[0]}.{here[1]}: {why})"
    return text
