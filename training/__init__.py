"""pinstorm training: strategies that survive a broken NCCL, models, fits, scale-out, the demo.

Importing the package only selects tf-keras (``TF_USE_LEGACY_KERAS=1``); TensorFlow itself is
imported when one of the exported functions is first used, so the CLI stays fast.

``training.train`` is the function; the module of the same name is ``sys.modules["training.train"]``
(``from training.train import TrainResult`` works as usual).
"""

import importlib
import sys
import types

from . import keras_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before anything imports TensorFlow)

_EXPORTS = {
    "make_strategy": "strategy",
    "strategy_choice": "strategy",
    "alexnet_train": "train",
    "train": "train",
    "TrainResult": "train",
    "build_model": "models",
    "spark_train": "spark",
    "run_demo": "demo",
}

__all__ = sorted(_EXPORTS)


class _Package(types.ModuleType):
    """Keeps exported functions from being replaced by the same-named submodule when it loads."""

    def __setattr__(self, name, value):
        if name in _EXPORTS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __getattr__(self, name):
        if name in _EXPORTS:
            value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
            super().__setattr__(name, value)
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


sys.modules[__name__].__class__ = _Package
