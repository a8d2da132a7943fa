"""pinstorm: find, pin, cache and share ImageNet-sized data sets, stream them into TensorFlow, train at scale.

Three layers, data flowing one way: `pinstorm.boards` (versioned pins on storage boards; the core
install) -> `pinstorm.pipeline` (image folders -> Parquet -> tf.data; extra `pipeline`) ->
`pinstorm.training` (strategies that survive a broken NCCL, Spark; extras `training`, `spark`).
Each layer is imported when first used, so `import pinstorm` stays light.
"""

from __future__ import annotations

import importlib

from .errors import MissingExtra, PinstormError

_LAYERS = ("boards", "pipeline", "training")
__all__ = ["MissingExtra", "PinstormError", "__version__", *_LAYERS]


def __getattr__(name: str):
    if name in _LAYERS:
        return importlib.import_module(f".{name}", __name__)
    if name == "__version__":  # read when asked: importlib.metadata is most of `import pinstorm` (~25 ms)
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("pinstorm")
        except PackageNotFoundError:  # running from a source tree that was never installed
            found = "0+unknown"
        globals()["__version__"] = found
        return found
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
