"""pinstorm's data path: ImageNet layout -> per-category pins -> Parquet in petastorm's format -> tf.data.

Importing this package does not import TensorFlow (only `make_dataset` does, when called), nor
petastorm, nor torch (`make_torch_loader` loads `torch_loader`, and torch, when first asked for).
"""

from pinstorm.extras import ensure

ensure("PIL", "pipeline", "pinstorm.pipeline")

from .convert import ConvertResult, DatasetExistsError, convert
from .images import UndecodableImage, check_image
from .info import dataset_info
from .layout import EmptyClassesWarning, Layout, LayoutError, scan
from .metadata import IncompleteDatasetError, MalformedDatasetError, UntrustedSchemaError
from .options import ReaderOptionError, ReaderOptions
from .reader import DatasetPosition, IncompleteEpochError, dataset_position, make_dataset
from .repartition import imagenet_partition, repartition
from .samples import digits_quirks, imagenet_size_jpegs, make_digits_tree, make_imagenet_size_tree
from .verify import CorruptPartError, MissingPartError, verify_dataset

__all__ = [
    "scan", "repartition", "imagenet_partition", "convert", "make_dataset", "dataset_position", "DatasetPosition",
    "dataset_info", "make_digits_tree",
    "Layout", "LayoutError", "ConvertResult", "DatasetExistsError", "IncompleteDatasetError",
    "IncompleteEpochError", "UndecodableImage", "check_image", "digits_quirks", "imagenet_size_jpegs",
    "make_imagenet_size_tree", "EmptyClassesWarning", "CorruptPartError", "MissingPartError", "verify_dataset",
    "MalformedDatasetError", "UntrustedSchemaError", "ReaderOptions", "ReaderOptionError",
]


def __getattr__(name):
    """`make_torch_loader` imports torch (or raises MissingExtra naming the `torch` extra) on first use."""
    if name == "make_torch_loader":
        import importlib

        return importlib.import_module(".torch_loader", __name__).make_torch_loader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
