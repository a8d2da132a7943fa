"""pinstorm training: strategies that survive a broken NCCL, models, fits, scale-out, the demo.

``train_torch`` is the PyTorch path (DDP, gloo or a probed NCCL); torch is imported only when it is used,
and it needs no TensorFlow (a GPU machine often has torch alone).

Importing the package only selects tf-keras (``TF_USE_LEGACY_KERAS=1``); TensorFlow itself is
imported when one of the exported functions is first used (PEP 562), so the CLI stays fast.
"""

import importlib
from typing import TYPE_CHECKING, Any

from pinstorm.extras import ensure

from . import keras_env  # noqa: F401  (sets TF_USE_LEGACY_KERAS before anything imports TensorFlow)

_EXPORTS = {
    "make_strategy": "strategy",
    "strategy_choice": "strategy",
    "alexnet_train": "fit",
    "train": "fit",
    "TrainResult": "results",
    "TrainingError": "errors",
    "InvalidTrainingInput": "errors",
    "FitOptions": "runs",
    "build_model": "models",
    "spark_train": "spark",
    "run_demo": "demo",
    "load_experiment": "experiments",
    "experiment_lineage": "experiments",
    "find_experiments": "experiments",
    "profile": "profiling",
    "train_torch": "torch_fit",
    "init_distributed": "torch_fit",
    "build_torch_model": "torch_models",
}
_NEEDS = {"spark": ("pyspark", "spark"), "torch_fit": ("torch", "torch"), "torch_models": ("torch", "torch")}
_WITHOUT_TENSORFLOW = {"torch_fit", "torch_models", "errors", "results", "runs"}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` imports on first use
    from .demo import run_demo
    from .experiments import experiment_lineage, find_experiments, load_experiment
    from .fit import alexnet_train, train
    from .models import build_model
    from .profiling import profile
    from .errors import InvalidTrainingInput, TrainingError
    from .results import TrainResult
    from .runs import FitOptions
    from .spark import spark_train
    from .strategy import make_strategy, strategy_choice
    from .torch_fit import init_distributed, train_torch
    from .torch_models import build_torch_model


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        if _EXPORTS[name] not in _WITHOUT_TENSORFLOW:
            ensure("tensorflow", "training", f"pinstorm.training.{name}")
        if _EXPORTS[name] in _NEEDS:
            ensure(*_NEEDS[_EXPORTS[name]], f"pinstorm.training.{name}")
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
