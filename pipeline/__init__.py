"""pinstorm's data path: ImageNet layout -> per-category pins -> Parquet in petastorm's format -> tf.data.

Importing this package does not import TensorFlow (only `make_dataset` does, when called), nor
petastorm, nor torch (`make_torch_loader` loads `torch_loader`, and torch, when first asked for), nor
pyspark (`make_spark_converter` and `SparkDatasetConverter` load `spark_converter` when first asked for;
pyspark itself is imported only by a call that takes a Spark session or DataFrame).
"""

from pinstorm.extras import ensure

ensure("PIL", "pipeline", "pinstorm.pipeline")

from .columns_reader import ColumnBatches, ColumnError, TorchColumnsLoader, make_columns_dataset
from .contracts import DataMap, DatasetInfo
from .convert import ConvertResult, DatasetExistsError, convert
from .epochs import shard_row_groups
from .errors import InvalidPipelineInput, PipelineError, WorkerHandoverError
from .images import UndecodableImage, check_image
from .info import dataset_info
from .layout import EmptyClassesWarning, Layout, LayoutError, scan
from .metadata import DatasetNotFound, IncompleteDatasetError, MalformedDatasetError, UntrustedSchemaError, read_info
from .options import DECODES, ReaderOptionError, ReaderOptions
from .positions import ResumeStateError
from .reader import DatasetPosition, IncompleteEpochError, dataset_position, make_dataset
from .repartition import imagenet_partition, repartition
from .samples import digits_quirks, imagenet_size_jpegs, make_digits_tree, make_imagenet_size_tree
from .storage import Location, locate
from .verify import CHECKSUMMED, CorruptPartError, MissingPartError, open_part, read_row_group, verify_dataset

__all__ = [
    "scan", "repartition", "imagenet_partition", "convert", "make_dataset", "dataset_position", "DatasetPosition",
    "dataset_info", "make_digits_tree", "DatasetInfo", "DataMap",
    "Layout", "LayoutError", "ConvertResult", "DatasetExistsError", "IncompleteDatasetError",
    "IncompleteEpochError", "UndecodableImage", "check_image", "digits_quirks", "imagenet_size_jpegs",
    "make_imagenet_size_tree", "EmptyClassesWarning", "CorruptPartError", "MissingPartError", "verify_dataset",
    "MalformedDatasetError", "UntrustedSchemaError", "ReaderOptions", "ReaderOptionError", "DECODES",
    "PipelineError", "InvalidPipelineInput", "DatasetNotFound", "ResumeStateError", "WorkerHandoverError",
    # for training and tools that read row groups themselves: locate a dataset, read its checked info,
    # open a part and read a row group with every check, cut an epoch into shards
    "Location", "locate", "read_info", "open_part", "read_row_group", "CHECKSUMMED", "shard_row_groups",
    "make_spark_converter", "SparkDatasetConverter", "SparkConverterError",
    # a tabular dataset's (the Spark converter's DataFrames without images) readers
    "ColumnBatches", "make_columns_dataset", "TorchColumnsLoader", "ColumnError",
]

_SPARK_NAMES = ("make_spark_converter", "SparkDatasetConverter", "SparkConverterError")


def __getattr__(name):
    """`make_torch_loader` imports torch (or raises MissingExtra naming the `torch` extra) on first use; the
    Spark converter's names load `spark_converter` (which imports pyspark only when called)."""
    if name == "make_torch_loader":
        import importlib

        return importlib.import_module(".torch_loader", __name__).make_torch_loader
    if name in _SPARK_NAMES:
        import importlib

        return getattr(importlib.import_module(".spark_converter", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
