"""Pinned experiments: a finished run stored as one version of a pin, found again, loaded back.

``train(..., pin="board/name")`` ends with ``pin_run``: the final weights, ``metrics.csv``,
``curves.png``, the TensorBoard folder zipped and a ``lineage.json`` (datasets and the pin versions
they came from, model, arguments, strategy record with any NCCL fallback, package versions, wall
time) become a new version of pin ``name`` on ``board``. Each run is a version (``pin_versions``
lists them), the description names the model and the dataset (``pin_find`` finds them), and
``load_experiment`` rebuilds the model and loads the weights in one call. Only the public boards
API is used (``pin``, ``pin_get``, ``pin_find``, ``pin_versions``), so any writable board works.

A PyTorch run (``train_torch``, ``pinstorm train --framework torch --pin``) is pinned the same way with
``final.pt`` (a state dict) and ``"framework": "torch"`` in its lineage; ``load_experiment`` then
returns the ``torch.nn.Module``, its weights read with ``torch.load(weights_only=True)`` after the file
was checked against the model's tensors.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version as package_version
from pathlib import Path
from typing import Any

from pinstorm.boards.safety import secrets
from pinstorm.errors import PinstormError
from pinstorm import boards, pipeline
from pinstorm.boards.errors import InvalidPinName
from pinstorm.boards.safety.names import check_pin_name

from .errors import TrainingError
from .runs import EMA_WEIGHTS_FILES, FRAMEWORKS, WEIGHTS_FILES

log = secrets.logger("pinstorm.training")

TAG = "pinstorm experiment"
LINEAGE_FILE = "lineage.json"
METRICS_FILE = "metrics.csv"
CURVES_FILE = "curves.png"
TENSORBOARD_ZIP = "tensorboard.zip"
LINEAGE_FORMAT = 1
PACKAGES = ("pinstorm", "tensorflow", "tf-keras", "torch", "numpy", "pyarrow", "pandas", "fsspec", "petastorm")
_LAYER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")   # a Keras model name a lineage may set
_MAX_LINEAGE_BYTES = 4 << 20
_MAX_LINEAGE_DEPTH = 32
_MAX_CLASSES = 1_000_000
_MODEL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_PARAMETERS = 300_000_000      # 1.2 GB of float32: AlexNet on ImageNet-21k is 150 M, ResNet-50 26 M
_TOP_FEATURES = {"resnet50": 2048, "mobilenet_v2": 1792}   # classifier inputs (MobileNetV2 at alpha <= 1.4)
_APPLICATION_TRUNK = 30_000_000                            # parameters below the classifier, at most


class ExperimentError(TrainingError, ValueError):
    """A run cannot be pinned where asked, or a pinned run cannot be loaded back."""


# --------------------------------------------------------------------------- where to pin

def parse_target(target, board=None) -> tuple[Any, str]:
    """``"board/name"`` -> (board, name); ``(board, "name")`` -> itself (``board`` a ``Board`` or a
    registered name); a bare ``"name"`` uses ``board`` (None: the default board).

    The name is checked by the boards' own rule (``check_pin_name``) before a long fit, not after it.
    """

    if isinstance(target, tuple) and len(target) == 2:
        board, target = target
    if not isinstance(target, str) or not target.strip("/"):
        raise ExperimentError(f"pin must be 'board/name', (board, 'name') or 'name', got {target!r}")
    if board is None and "/" in target:
        board, _, name = target.strip("/").partition("/")
    else:
        name = target
    try:
        check_pin_name(name)
    except InvalidPinName as error:
        raise ExperimentError(f"cannot pin the experiment: {error}") from None
    return board, name


def check_target(target) -> tuple[Any, str]:
    """Fail before training, not after it: the board must exist (a Board, or a registered name) and be writable."""

    board, name = parse_target(target)
    instance = boards.resolve_board(board)
    if getattr(instance, "read_only", False):
        raise ExperimentError(f"cannot pin experiment {name!r}: board {instance.name!r} is read-only")
    return board, name


# --------------------------------------------------------------------------- lineage

def package_versions() -> dict[str, str | None]:
    """Versions of the packages a run depends on (None when not installed), Python and the platform."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = package_version(name)
        except PackageNotFoundError:
            out[name] = None
    out["python"] = sys.version.split()[0]
    out["platform"] = platform.platform()
    return out


def source_pins(names, board) -> list[dict]:
    """The latest version of each pin in ``names`` on ``board``: what a dataset was built from."""

    out = []
    for name in names:
        versions = boards.pin_versions(name, board=board)
        out.append({"board": board if isinstance(board, str) else getattr(board, "name", str(board)),
                    "pin": name, "version": str(versions["version"].iloc[-1]) if len(versions) else None})
    return out


def dataset_lineage(data, resolved_url: str | None = None, storage_options: dict | None = None) -> dict | None:
    """What a training input was: its URL, size and source, and the pin version it was read from
    (read with the `storage_options` the fit read it with)."""
    if data is None:
        return None
    data_map = pipeline.DataMap.from_source(data)
    if data_map is not None:
        record = {"kind": "data map", "images": len(data_map.image),
                  "categories": [str(c) for c in (data_map.categories or [])]}
    elif isinstance(data, (str, os.PathLike)):
        record = {"kind": "parquet", "url": os.fspath(data)}
    else:
        return {"kind": type(data).__name__, "element_spec": str(getattr(data, "element_spec", ""))}
    url = os.fspath(data) if isinstance(data, (str, os.PathLike)) else resolved_url
    if url is None:
        return record
    record["url"] = url if record["kind"] == "parquet" else record.get("url")
    if record["kind"] == "data map":
        record["converted_to"] = url
    try:
        info = pipeline.dataset_info(url, storage_options=storage_options)
        record.update({k: info.get(k) for k in ("rows", "num_classes", "split", "source", "created", "plan", "bytes")})
    except Exception as error:  # noqa: BLE001 - lineage must never fail a finished fit
        record["info_error"] = f"{type(error).__name__}: {error}"
    if url.startswith("board://"):
        board, _, pin = url[len("board://"):].strip("/").partition("/")
        try:
            record["pins"] = source_pins([pin], board)
        except Exception as error:  # noqa: BLE001
            record["pins_error"] = f"{type(error).__name__}: {error}"
    return record


def run_lineage(result, *, model_name: str, image_size: int, model_kwargs, data, validation_data, train_url,
                val_url, arguments: dict, strategy, started_at, wall_seconds: float, lineage: dict | None) -> dict:
    """The lineage record of a finished ``train`` run (what ``lineage.json`` holds; ``pin_run`` scrubs
    its secrets)."""
    from datetime import datetime, timezone

    model, framework = result.model, getattr(result, "framework", "tensorflow")
    storage_options = (arguments.get("input_options") or {}).get("storage_options")
    if framework == "torch":
        built = {"framework": "torch", "parameters": sum(int(p.numel()) for p in model.parameters())}
    else:
        built = {"keras_name": model.name, "parameters": model.count_params()}
    return {
        "model": {"name": model_name, "image_size": int(image_size), "num_classes": int(result.num_classes),
                  "kwargs": {k: _scalar(v) for k, v in (model_kwargs or {}).items()}, **built},
        "data": dataset_lineage(data, train_url, storage_options),
        "validation_data": dataset_lineage(validation_data, val_url, storage_options),
        "arguments": arguments,
        "strategy": result.strategy or {"class": type(strategy).__name__, "replicas": result.replicas},
        "global_batch_size": result.global_batch_size, "replicas": result.replicas, "epochs": result.epochs,
        "initial_epoch": result.initial_epoch, "steps_per_epoch": result.steps_per_epoch,
        "history": result.history, "val_metrics": result.val_metrics, "images_per_second": result.images_per_second,
        "packages": package_versions(), "started": started_at.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "fit_seconds": result.seconds,
        "wall_seconds": wall_seconds, "lineage": lineage or {},
    }


def _scalar(value):
    """A NumPy scalar as the plain number it is (``load_experiment`` accepts plain JSON values only)."""
    return value.item() if type(value).__module__ == "numpy" and hasattr(value, "item") else value


def _finite(value):
    """JSON has no NaN: metrics that are not numbers become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# --------------------------------------------------------------------------- pinning

def _zip_folder(folder: Path, target: Path) -> Path:
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, path.relative_to(folder).as_posix())
    return target


def describe(lineage: dict) -> str:
    """The pin's description: what ``pin_find`` searches (model, dataset, result)."""
    model = lineage["model"]["name"]
    data = lineage.get("data") or {}
    where = data.get("url") or data.get("converted_to") or data.get("kind", "?")
    accuracy = (lineage.get("val_metrics") or {}).get("accuracy")
    score = f", val accuracy {accuracy:.4f}" if isinstance(accuracy, (int, float)) else ""
    return f"{TAG}: {model} on {where}, {len(lineage.get('epochs') or [])} epoch(s){score}"


class ExperimentRecord(dict):
    """Where ``pin_run`` put a run and what it holds: ``board``, ``name``, ``version``, ``pin``, ``run``
    (the output folder), ``model``, ``val_metrics`` and ``files`` (name -> bytes).

    A plain dict underneath (JSON-able, as ``TrainResult.summary()`` needs), with a one-line
    ``repr`` and an HTML table so a notebook cell that ends in ``result.experiment`` is readable.
    """

    def fields(self) -> list[tuple[str, str]]:
        """(label, text) pairs shown by ``repr`` and ``_repr_html_``."""
        accuracy = (self.get("val_metrics") or {}).get("accuracy")
        files = self.get("files") or {}
        return [("run", str(self.get("run") or "")), ("model", str(self.get("model") or "?")),
                ("val accuracy", f"{accuracy:.4f}" if isinstance(accuracy, (int, float)) else "-"),
                ("board", str(self.get("board"))), ("pin", str(self.get("name"))),
                ("version", str(self.get("version"))),
                ("size", f"{len(files)} files, {_size(sum(files.values()))}")]

    def __repr__(self) -> str:
        shown = dict(self.fields())
        return (f"<ExperimentRecord {shown['board']}/{shown['pin']} version {shown['version']}: {shown['model']}, "
                f"val accuracy {shown['val accuracy']}, {shown['size']}>")

    def _repr_html_(self) -> str:
        from html import escape

        rows = "".join(f"<tr><th style='text-align:left'>{escape(label)}</th><td>{escape(text)}</td></tr>"
                       for label, text in self.fields())
        return f"<table><caption>pinstorm experiment</caption>{rows}</table>"


def _size(count: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def pin_run(result, target, lineage: dict) -> ExperimentRecord:
    """Pin a finished run's files and ``lineage`` as a new version of ``target``; returns where it went."""

    started = time.perf_counter()
    board, name = parse_target(target)
    output = Path(result.output_dir)
    lineage = secrets.scrub(_finite(dict(lineage, format=LINEAGE_FORMAT)))  # a board is no place for a credential
    with tempfile.TemporaryDirectory(prefix="pinstorm-experiment-") as tmp:
        staging = Path(tmp) / name
        staging.mkdir()
        framework = getattr(result, "framework", "tensorflow")
        for source, file in ((result.weights_path, WEIGHTS_FILES[framework]), (result.metrics_csv, METRICS_FILE),
                             (result.plot_png, CURVES_FILE), (result.ema_weights_path, EMA_WEIGHTS_FILES[framework])):
            if source and Path(source).is_file():
                shutil.copyfile(source, staging / file)
        tensorboard = Path(result.tensorboard_dir) if result.tensorboard_dir else output / "tensorboard"
        if tensorboard.is_dir():
            _zip_folder(tensorboard, staging / TENSORBOARD_ZIP)
        lineage["files"] = sorted(p.name for p in staging.iterdir()) + [LINEAGE_FILE]
        (staging / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2, default=str))
        sizes = {p.name: p.stat().st_size for p in sorted(staging.iterdir())}
        boards.pin(str(staging), name=name, board=board, description=describe(lineage),
                   title=f"{lineage['model']['name']} run", metadata={"pinstorm_experiment": {
                       "model": lineage["model"]["name"], "dataset": (lineage.get("data") or {}).get("url"),
                       "val_metrics": lineage.get("val_metrics"), "wall_seconds": lineage.get("wall_seconds")}})
    versions = boards.pin_versions(name, board=board)
    version = str(versions["version"].iloc[-1])
    board_name = board if isinstance(board, str) else getattr(board, "name", None) or "local"
    log.info("pinned the run as %s/%s version %s", board_name, name, version)
    return ExperimentRecord(board=board_name, name=name, version=version, pin=f"{board_name}/{name}",
                            seconds=time.perf_counter() - started, run=str(output),
                            model=lineage["model"]["name"], val_metrics=lineage.get("val_metrics") or {},
                            files=sizes)


def pin_fit(result, target, *, model_name: str, image_size, model_kwargs, data, validation_data, arguments: dict,
            started_at, wall_started: float, train_url=None, val_url=None, strategy=None,
            lineage: dict | None = None) -> ExperimentRecord:
    """What every fit does with ``pin=`` once it finished (``train``, ``train_torch``): its lineage record
    (`run_lineage`, ``wall_started`` a ``time.perf_counter()`` reading) pinned as a new version of ``target``."""
    record = run_lineage(result, model_name=model_name, image_size=image_size, model_kwargs=model_kwargs, data=data,
                         validation_data=validation_data, train_url=train_url, val_url=val_url, arguments=arguments,
                         strategy=strategy, started_at=started_at, wall_seconds=time.perf_counter() - wall_started,
                         lineage=lineage)
    return pin_finished_run(result, target, record)


def pin_finished_run(result, target, lineage: dict) -> ExperimentRecord:
    """`pin_run` at the end of a fit: a failure names where the fit's outputs are (the fit is not lost)."""
    try:
        return pin_run(result, target, lineage)
    except Exception as error:
        raise ExperimentError(f"training finished (outputs in {result.output_dir}) but pinning the run as {target!r} "
                              f"failed: {type(error).__name__}: {error}") from error


# --------------------------------------------------------------------------- finding and loading

def find_experiments(text: str = "", *, model: str | None = None, dataset: str | None = None, board=None):
    """Pinned runs (a ``pin_find`` DataFrame) whose description names ``model`` and/or ``dataset``.

    Args:
        text: Also found in the run's name or description (case-insensitive).
        model: The model's name, e.g. ``"alexnet"``.
        dataset: A word of the data's description, e.g. a pin name.
        board: As `pin_find`'s (None: every registered board).

    Returns:
        A `pin_find` DataFrame of the pinned runs.
    """

    found = boards.pin_find(text or model or dataset or TAG, board=board)
    keep = found["description"].fillna("").str.startswith(TAG)
    for needle in (model, dataset, text):
        if needle:
            keep &= (found["description"].fillna("") + " " + found["name"].fillna("")).str.lower() \
                .str.contains(str(needle).lower(), regex=False)
    return found[keep].reset_index(drop=True)


def _pinned_files(target: str, board, version) -> tuple[dict[str, Path], str, Any]:
    board, name = parse_target(target, board)
    paths = boards.pin_get(name, board=board, version=version, files=True)
    files = {Path(p).name: Path(p) for p in paths}
    if LINEAGE_FILE not in files:
        raise ExperimentError(f"pin {name!r}{' version ' + version if version else ''} is not a pinstorm "
                              f"experiment (no {LINEAGE_FILE})")
    return files, name, board


class _Refused(Exception):
    """Raised by the JSON hooks; becomes an ``ExperimentError`` naming the file."""


_JSON_TOKENS = re.compile(r'[\\"\[\]{}]')


def _json_depth(text: str, limit: int) -> int:
    """How deeply arrays and objects nest, up to ``limit + 1``: checked before ``json.loads`` recurses.

    One pass over quotes, backslashes and brackets (a regular expression for strings backtracks
    quadratically on unterminated ones).
    """
    if text.count("[") + text.count("{") <= limit:
        return 0
    depth = deepest = 0
    in_string, skip = False, -1
    for match in _JSON_TOKENS.finditer(text):
        at, char = match.start(), match.group()
        if at == skip:
            continue
        if in_string:
            if char == "\\":
                skip = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif char in "]}":
            depth -= 1
    return deepest


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > 19:
        raise _Refused(f"integer {text[:40]}... has more than 19 digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:40]} is not a finite float")
    return value


def _parse_constant(text: str):
    raise _Refused(f"{text} is not a number JSON allows")


def _plain_int(model: dict, key: str, low: int, high: int) -> int:
    value = model.get(key)
    if type(value) is not int or not low <= value <= high:
        raise _Refused(f"model {key} {value!r:.80} is out of range (an integer in [{low:,}, {high:,}])")
    return value


def _checked_kwargs(model_name: str, kwargs, table=None) -> dict:
    """Model keyword arguments: only those the model's builder takes (`table`: the framework's), each of its
    type and range."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise _Refused(f"model kwargs must be an object, got {type(kwargs).__name__}")
    key = model_name.lower().replace("-", "_").replace("resnet_50", "resnet50")
    allowed = (_KWARGS if table is None else table).get(key, {})
    for name, value in kwargs.items():
        if name not in allowed:
            raise _Refused(f"model kwarg {name!r:.80} is not one {model_name} takes from a lineage "
                           f"(allowed: {sorted(allowed) or 'none'})")
        if not allowed[name](value):
            raise _Refused(f"model kwarg {name}={value!r:.80} is out of type or range for {model_name}")
    return dict(kwargs)


def _number(low, high, *, open_low=True, integer=False):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            return False
        return (low < value if open_low else low <= value) and value <= high
    return check


# what a lineage may pass to each builder (training/models.py), bounded: a board writes these values
_KWARGS = {
    "alexnet": {"width": _number(0, 8), "dense_units": lambda v: v is None or _number(1, 65536, integer=True)(v),
                "dropout": _number(0, 0.99, open_low=False),
                "normalization": lambda v: v in (None, "lrn", "batch", "none"),
                "name": lambda v: isinstance(v, str) and bool(_LAYER_NAME.match(v))},
    "resnet50": {},
    "mobilenet_v2": {"alpha": _number(0, 1.4)},
}
# and to each torch builder (training/torch_models.py)
_TORCH_KWARGS = {
    "alexnet": {k: v for k, v in _KWARGS["alexnet"].items() if k != "name"},
    "resnet_small": {"width": _number(0, 8), "blocks": _number(0, 64, integer=True)},
    "resnet50": {},
}


def _checked_lineage(path: Path, name: str) -> dict:
    """lineage.json came from a board: bounded parsing, then every field the model is built from."""
    if path.stat().st_size > _MAX_LINEAGE_BYTES:
        raise ExperimentError(f"{path}: {LINEAGE_FILE} of {name!r} is larger than {_MAX_LINEAGE_BYTES} bytes")
    try:
        text = path.read_text(encoding="utf-8")
        if _json_depth(text, _MAX_LINEAGE_DEPTH) > _MAX_LINEAGE_DEPTH:
            raise _Refused(f"values nest more than {_MAX_LINEAGE_DEPTH} deep")
        lineage = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
        if not isinstance(lineage, dict) or not isinstance(lineage.get("model"), dict):
            raise _Refused("no 'model' object")
        model = lineage["model"]
        model_name = model.get("name")
        if not isinstance(model_name, str) or not _MODEL_NAME.match(model_name):
            raise _Refused(f"model name must be a short plain name, got {model_name!r:.80}")
        _plain_int(model, "image_size", 8, 8192)
        _plain_int(model, "num_classes", 2, _MAX_CLASSES)
        framework = model.get("framework", "tensorflow")
        if framework not in FRAMEWORKS:
            raise _Refused(f"model framework {framework!r:.80} is not one of {FRAMEWORKS}")
        _checked_kwargs(model_name, model.get("kwargs"), _TORCH_KWARGS if framework == "torch" else _KWARGS)
    except (_Refused, ValueError) as error:      # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ExperimentError(f"{path}: malformed {LINEAGE_FILE} in experiment {name!r}: {error}") from None
    return lineage


def parameter_count(model_name: str, image_size: int, num_classes: int, kwargs: dict) -> int:
    """The parameters a model would have, counted from its spec without allocating them.

    Checked before ``build_model``: a lineage asking for a million classes must not allocate
    gigabytes first. AlexNet is counted layer by layer as ``models.alexnet`` builds it (the tests
    compare the count with the built model's); the keras.applications models end in global
    pooling, so their trunk is bounded by a constant and only the classifier grows.
    """
    key = model_name.lower().replace("-", "_").replace("resnet_50", "resnet50")
    if key in _TOP_FEATURES:
        return _APPLICATION_TRUNK + (_TOP_FEATURES[key] + 1) * num_classes
    if key == "alexnet":
        return _alexnet_parameters(image_size, num_classes, **kwargs)
    from .keras_env import tensorflow

    tf = tensorflow()                              # any other model: built in a graph, shapes only

    from .models import build_model

    with tf.Graph().as_default():
        return int(build_model(model_name, (image_size, image_size, 3), num_classes, **kwargs).count_params())


def _alexnet_parameters(side: int, num_classes: int, *, width: float = 1.0, dense_units=None,
                        normalization="lrn", **_) -> int:
    from .models import _stem

    kernel, stride = _stem(side)
    f1, f2, f3, f4, f5 = (max(8, int(round(f * width))) for f in (96, 256, 384, 384, 256))
    units = dense_units or max(16, int(round(4096 * width)))
    side = (side + 4 - kernel) // stride + 1 if stride == 4 else -(-side // stride)
    for _ in range(3):                                   # pool1, pool2, pool5: 3x3, stride 2, valid
        side = (side - 3) // 2 + 1
    convs = (kernel * kernel * 3 * f1 + f1) + (25 * f1 * f2 + f2) + (9 * f2 * f3 + f3) + (9 * f3 * f4 + f4) \
        + (9 * f4 * f5 + f5)
    norms = 4 * (f1 + f2) if normalization == "batch" else 0
    dense = (side * side * f5 + 1) * units + (units + 1) * units + (units + 1) * num_classes
    return convs + norms + dense


def _build_checked(lineage: dict, name: str, max_parameters: int):
    from .models import build_model

    spec = lineage["model"]
    args = (str(spec["name"]), int(spec["image_size"]), int(spec["num_classes"]), dict(spec.get("kwargs") or {}))
    try:
        parameters = parameter_count(*args)
        if parameters > max_parameters:
            raise ExperimentError(f"experiment {name!r}: {args[0]} at {args[1]} px with {args[2]:,} classes and "
                                  f"kwargs {args[3]} has {parameters:,} parameters (limit max_parameters="
                                  f"{max_parameters:,})")
        return build_model(args[0], (args[1], args[1], 3), args[2], **args[3])
    except ExperimentError:
        raise
    except (PinstormError, ValueError, TypeError) as error:   # ModelError; a kwarg the builder refuses
        raise ExperimentError(f"experiment {name!r}: cannot build {args[0]} from its lineage: {error}") from error


def experiment_lineage(target: str, board=None, version: str | None = None) -> dict:
    """The ``lineage.json`` of a pinned run (latest version unless ``version``; a unique prefix works).

    Args:
        target: ``"board/name"``, or ``"name"`` on `board`.
        board: A registered board's name or a `Board` (None: the default board).
        version: A full version name or a unique prefix (None: the latest).

    Returns:
        The lineage record.
    """
    files, name, _ = _pinned_files(target, board, version)
    return _checked_lineage(files[LINEAGE_FILE], name)


def load_experiment(target: str, board=None, version: str | None = None, *, max_parameters: int = MAX_PARAMETERS,
                    ema: bool = False):
    """Rebuild a pinned run's model and load its final weights: ``load_experiment("board/name")``.

    Returns an uncompiled Keras model (compile it to evaluate or to train further), or for a PyTorch
    run the ``torch.nn.Module`` in eval mode. ``version``
    picks a run other than the latest; ``experiment_lineage`` gives its record. The pin may come
    from a board someone else writes: the lineage is bounded (a model over ``max_parameters`` is
    refused before it is built) and the weights file is inspected before Keras reads a byte of it
    (``weights_check``: no external files or links, nothing bigger than the model's variables).

    Args:
        target: ``"board/name"``, or ``"name"`` on `board`.
        board: A registered board's name or a `Board` (None: the default board).
        version: A full version name or a unique prefix (None: the latest).
        max_parameters: A model with more parameters is refused before it is built.
        ema: Load the moving average of the weights (``final-ema.weights.h5`` or ``final-ema.pt``, kept by a
            run with ``ema_decay``) instead of the final weights.

    Returns:
        The model with its final weights: a Keras model, or a ``torch.nn.Module`` in eval mode.
    """
    from .weights_check import UnsafeWeights, check_weights_file

    files, name, _ = _pinned_files(target, board, version)
    lineage = _checked_lineage(files[LINEAGE_FILE], name)
    if lineage["model"].get("framework") == "torch":
        return _load_torch(files, lineage, name, max_parameters, (EMA_WEIGHTS_FILES if ema else WEIGHTS_FILES)["torch"])
    weights = (EMA_WEIGHTS_FILES if ema else WEIGHTS_FILES)["tensorflow"]
    if weights not in files:
        raise ExperimentError(f"experiment {name!r} has no {weights}{_WITHOUT_AVERAGE if ema else ''}")
    model = _build_checked(lineage, name, max_parameters)
    try:
        check_weights_file(files[weights], [tuple(v.shape) for v in model.weights])
    except UnsafeWeights as error:
        raise ExperimentError(f"weights of experiment {name!r} refused: {error}") from error
    try:
        model.load_weights(str(files[weights]))
    except (ValueError, KeyError, OSError) as error:
        raise ExperimentError(f"weights of experiment {name!r} do not fit {lineage['model']['name']}: "
                              f"{error}") from error
    return model


_WITHOUT_AVERAGE = " (it was trained without ema_decay)"


def _load_torch(files: dict, lineage: dict, name: str, max_parameters: int, weights: str = WEIGHTS_FILES["torch"]):
    """A PyTorch run's module with its weights. Counted on torch's meta device before it is built, and the
    weights file (a zip of stored tensors) checked against the module's tensors before torch reads a byte
    of it, its pickle scanned within bounds set by their number (``torch_checkpoint``: a file-size check
    does not bound what unpickling allocates); read with ``weights_only=True``, nothing in it can run.
    `weights`: the file read (``final.pt``, or the moving average's ``final-ema.pt``)."""
    from pinstorm.extras import require

    torch = require("torch", "torch", "load_experiment of a PyTorch run")
    from .torch_models import build_torch_model

    if weights not in files:
        kept = _WITHOUT_AVERAGE if weights == EMA_WEIGHTS_FILES["torch"] else ""
        raise ExperimentError(f"experiment {name!r} has no {weights}{kept}")
    spec = lineage["model"]
    args, kwargs = (str(spec["name"]), int(spec["num_classes"]), int(spec["image_size"])), dict(spec.get("kwargs") or {})
    try:
        with torch.device("meta"):
            parameters = sum(int(t.numel()) for t in build_torch_model(*args, **kwargs).state_dict().values())
        if parameters > max_parameters:
            raise ExperimentError(f"experiment {name!r}: {args[0]} at {args[2]} px with {args[1]:,} classes and kwargs "
                                  f"{kwargs} has {parameters:,} parameters (limit max_parameters={max_parameters:,})")
        model = build_torch_model(*args, **kwargs)
    except ExperimentError:
        raise
    except (PinstormError, ValueError, TypeError) as error:   # TorchModelError; a kwarg the builder refuses
        raise ExperimentError(f"experiment {name!r}: cannot build {args[0]} from its lineage: {error}") from error
    expected = model.state_dict()
    path = files[weights]
    _check_torch_file(path, expected, name)
    from .torch_checkpoint import UnsafeCheckpoint, load_checked

    try:   # its pickle scanned first, bounded by the tensors expected (torch_checkpoint), then unpickled
        state = load_checked(path, tensors=len(expected))
    except UnsafeCheckpoint as error:
        raise ExperimentError(f"weights of experiment {name!r} refused: {error}") from None
    except Exception as error:   # noqa: BLE001 - an unpickling refusal, a broken zip: all one answer
        raise ExperimentError(f"weights of experiment {name!r} refused: {type(error).__name__}: {error}") from None
    wrong = (not isinstance(state, dict) or set(state) != set(expected)
             or any(not isinstance(state[k], torch.Tensor) or state[k].shape != v.shape or state[k].dtype != v.dtype
                    for k, v in expected.items()))
    if wrong:
        raise ExperimentError(f"weights of experiment {name!r} do not fit {args[0]}: {path.name} holds other tensors "
                              f"than the model's {len(expected)}")
    model.load_state_dict(state)
    return model.eval()


def _check_torch_file(path: Path, expected: dict, name: str) -> None:
    """``torch.save``'s zip holds the tensors' bytes stored, plus small records: refuse a file (or entries
    declared) larger than the model's tensors and that slack, or compressed entries (a zip bomb)."""
    limit = sum(t.numel() * t.element_size() for t in expected.values()) + 4096 * (len(expected) + 16)
    problem = None
    if path.stat().st_size > limit:
        problem = f"{path.stat().st_size:,} bytes, more than the model's tensors need ({limit:,})"
    else:
        try:
            with zipfile.ZipFile(path) as archive:
                entries = archive.infolist()
        except (zipfile.BadZipFile, OSError) as error:
            problem = f"not a torch.save zip ({error})"
        else:
            if sum(e.file_size for e in entries) > limit:
                problem = f"its entries declare more than the model's tensors need ({limit:,} bytes)"
            elif any(e.compress_type != zipfile.ZIP_STORED for e in entries):
                problem = "compressed entries (torch.save stores tensors uncompressed)"
    if problem:
        raise ExperimentError(f"weights of experiment {name!r} refused: {path.name}: {problem}")
