"""Pinned experiments: a finished run stored as one version of a pin, found again, loaded back.

``train(..., pin="board/name")`` ends with ``pin_run``: the final weights, ``metrics.csv``,
``curves.png``, the TensorBoard folder zipped and a ``lineage.json`` (datasets and the pin versions
they came from, model, arguments, strategy record with any NCCL fallback, package versions, wall
time) become a new version of pin ``name`` on ``board``. Each run is a version (``pin_versions``
lists them), the description names the model and the dataset (``pin_find`` finds them), and
``load_experiment`` rebuilds the model and loads the weights in one call. Only the public boards
API is used (``pin``, ``pin_get``, ``pin_find``, ``pin_versions``), so any writable board works.
"""

from __future__ import annotations

import json
import logging
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

from pinstorm.errors import PinstormError

log = logging.getLogger("pinstorm.training")

TAG = "pinstorm experiment"
LINEAGE_FILE = "lineage.json"
WEIGHTS_FILE = "final.weights.h5"
METRICS_FILE = "metrics.csv"
CURVES_FILE = "curves.png"
TENSORBOARD_ZIP = "tensorboard.zip"
LINEAGE_FORMAT = 1
PACKAGES = ("pinstorm", "tensorflow", "tf-keras", "numpy", "pyarrow", "pandas", "fsspec", "petastorm")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")   # what boards accept; checked before a long fit
_MAX_LINEAGE_BYTES = 4 << 20


class ExperimentError(PinstormError, ValueError):
    """A run cannot be pinned where asked, or a pinned run cannot be loaded back."""


# --------------------------------------------------------------------------- where to pin

def parse_target(target: str, board=None) -> tuple[Any, str]:
    """``"board/name"`` -> (board, name); a bare ``"name"`` uses ``board`` (None: the default board)."""
    if not isinstance(target, str) or not target.strip("/"):
        raise ExperimentError(f"pin must be 'board/name' or 'name', got {target!r}")
    if board is None and "/" in target:
        board, _, name = target.strip("/").partition("/")
    else:
        name = target
    if not _NAME.match(name) or ".." in name or len(name) > 200:
        raise ExperimentError(f"experiment pin name {name!r} is not a safe pin name (letters, digits, '.', '_', '-')")
    return board, name


def check_target(target: str) -> tuple[Any, str]:
    """Fail before training, not after it: the board must be registered and writable."""
    from pinstorm import boards

    board, name = parse_target(target)
    instance = boards.board_get(board)
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
    from pinstorm import boards

    out = []
    for name in names:
        versions = boards.pin_versions(name, board=board)
        out.append({"board": board if isinstance(board, str) else getattr(board, "name", str(board)),
                    "pin": name, "version": str(versions["version"].iloc[-1]) if len(versions) else None})
    return out


def dataset_lineage(data, resolved_url: str | None = None) -> dict | None:
    """What a training input was: its URL, size and source, and the pin version it was read from."""
    if data is None:
        return None
    if isinstance(data, dict) and "image" in data:
        record = {"kind": "data map", "images": len(data["image"]),
                  "categories": [str(c) for c in (data.get("categories") or [])]}
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
        from pinstorm import pipeline

        info = pipeline.dataset_info(url)
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
    """The lineage record of a finished ``train`` run (what ``lineage.json`` holds)."""
    from datetime import datetime, timezone

    model = result.model
    return {
        "model": {"name": model_name, "image_size": image_size, "num_classes": result.num_classes,
                  "kwargs": dict(model_kwargs or {}), "keras_name": model.name, "parameters": model.count_params()},
        "data": dataset_lineage(data, train_url),
        "validation_data": dataset_lineage(validation_data, val_url),
        "arguments": arguments,
        "strategy": result.strategy or {"class": type(strategy).__name__, "replicas": result.replicas},
        "global_batch_size": result.global_batch_size, "replicas": result.replicas, "epochs": result.epochs,
        "initial_epoch": result.initial_epoch, "steps_per_epoch": result.steps_per_epoch,
        "history": result.history, "val_metrics": result.val_metrics, "images_per_second": result.images_per_second,
        "packages": package_versions(), "started": started_at.isoformat(timespec="seconds"),
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "fit_seconds": result.seconds,
        "wall_seconds": wall_seconds, "lineage": lineage or {},
    }


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


def pin_run(result, target: str, lineage: dict) -> dict:
    """Pin a finished run's files and ``lineage`` as a new version of ``target``; returns where it went."""
    from pinstorm import boards

    started = time.perf_counter()
    board, name = parse_target(target)
    output = Path(result.output_dir)
    lineage = _finite(dict(lineage, format=LINEAGE_FORMAT))
    with tempfile.TemporaryDirectory(prefix="pinstorm-experiment-") as tmp:
        staging = Path(tmp) / name
        staging.mkdir()
        for source, file in ((result.weights_path, WEIGHTS_FILE), (result.metrics_csv, METRICS_FILE),
                             (result.plot_png, CURVES_FILE)):
            if source and Path(source).is_file():
                shutil.copyfile(source, staging / file)
        tensorboard = Path(result.tensorboard_dir) if result.tensorboard_dir else output / "tensorboard"
        if tensorboard.is_dir():
            _zip_folder(tensorboard, staging / TENSORBOARD_ZIP)
        lineage["files"] = sorted(p.name for p in staging.iterdir()) + [LINEAGE_FILE]
        (staging / LINEAGE_FILE).write_text(json.dumps(lineage, indent=2, default=str))
        boards.pin(str(staging), name=name, board=board, description=describe(lineage),
                   title=f"{lineage['model']['name']} run", metadata={"pinstorm_experiment": {
                       "model": lineage["model"]["name"], "dataset": (lineage.get("data") or {}).get("url"),
                       "val_metrics": lineage.get("val_metrics"), "wall_seconds": lineage.get("wall_seconds")}})
    versions = boards.pin_versions(name, board=board)
    version = str(versions["version"].iloc[-1])
    board_name = board if isinstance(board, str) else getattr(board, "name", None) or "local"
    log.info("pinned the run as %s/%s version %s", board_name, name, version)
    return {"board": board_name, "name": name, "version": version, "pin": f"{board_name}/{name}",
            "seconds": time.perf_counter() - started}


# --------------------------------------------------------------------------- finding and loading

def find_experiments(text: str = "", *, model: str | None = None, dataset: str | None = None, board=None):
    """Pinned runs (a ``pin_find`` DataFrame) whose description names ``model`` and/or ``dataset``."""
    from pinstorm import boards

    found = boards.pin_find(text or model or dataset or TAG, board=board)
    keep = found["description"].fillna("").str.startswith(TAG)
    for needle in (model, dataset, text):
        if needle:
            keep &= (found["description"].fillna("") + " " + found["name"].fillna("")).str.lower() \
                .str.contains(str(needle).lower(), regex=False)
    return found[keep].reset_index(drop=True)


def _pinned_files(target: str, board, version) -> tuple[dict[str, Path], str, Any]:
    from pinstorm import boards

    board, name = parse_target(target, board)
    paths = boards.pin_get(name, board=board, version=version, files=True)
    files = {Path(p).name: Path(p) for p in paths}
    if LINEAGE_FILE not in files:
        raise ExperimentError(f"pin {name!r}{' version ' + version if version else ''} is not a pinstorm "
                              f"experiment (no {LINEAGE_FILE})")
    return files, name, board


def _checked_lineage(path: Path, name: str) -> dict:
    """lineage.json came from a board: check every field the model is built from."""
    if path.stat().st_size > _MAX_LINEAGE_BYTES:
        raise ExperimentError(f"{path}: {LINEAGE_FILE} of {name!r} is larger than {_MAX_LINEAGE_BYTES} bytes")
    try:
        lineage = json.loads(path.read_text())
        model = lineage["model"]
        spec = (str(model["name"]), int(model["image_size"]), int(model["num_classes"]), dict(model.get("kwargs") or {}))
    except (ValueError, KeyError, TypeError) as error:
        raise ExperimentError(f"{path}: malformed {LINEAGE_FILE} in experiment {name!r}: {error}") from error
    _, image_size, num_classes, kwargs = spec
    if not (8 <= image_size <= 8192 and 2 <= num_classes <= 10_000_000):
        raise ExperimentError(f"{path}: image_size {image_size} / num_classes {num_classes} out of range")
    if not all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))) for k, v in kwargs.items()):
        raise ExperimentError(f"{path}: model kwargs must be plain values, got {kwargs!r}")
    return lineage


def experiment_lineage(target: str, board=None, version: str | None = None) -> dict:
    """The ``lineage.json`` of a pinned run (latest version unless ``version``; a unique prefix works)."""
    files, name, _ = _pinned_files(target, board, version)
    return _checked_lineage(files[LINEAGE_FILE], name)


def load_experiment(target: str, board=None, version: str | None = None):
    """Rebuild a pinned run's model and load its final weights: ``load_experiment("board/name")``.

    Returns an uncompiled Keras model (compile it to evaluate or to train further). ``version``
    picks a run other than the latest; ``experiment_lineage`` gives its record.
    """
    files, name, _ = _pinned_files(target, board, version)
    lineage = _checked_lineage(files[LINEAGE_FILE], name)
    if WEIGHTS_FILE not in files:
        raise ExperimentError(f"experiment {name!r} has no {WEIGHTS_FILE}")
    from .models import build_model

    model_spec = lineage["model"]
    size = int(model_spec["image_size"])
    model = build_model(str(model_spec["name"]), (size, size, 3), int(model_spec["num_classes"]),
                        **dict(model_spec.get("kwargs") or {}))
    try:
        model.load_weights(str(files[WEIGHTS_FILE]))
    except (ValueError, KeyError, OSError) as error:
        raise ExperimentError(f"weights of experiment {name!r} do not fit {model_spec['name']}: {error}") from error
    return model
