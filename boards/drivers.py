"""Drivers: how Python objects become pin files and back, by pin type (as pins-python's drivers.py).

`save` writes a DataFrame (parquet, csv, arrow) or a JSON-able object into a staging folder and says
which type it stored; `load` reads a single-file pin of a table or json type back into an object
(`NOT_LOADED` for types that come back as paths). Boards never look at formats themselves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import BoardError

NOT_LOADED = object()
DATAFRAME_TYPES = ("parquet", "csv", "arrow")


def type_name(x: Any) -> str:
    return type(x).__name__


def save_dataframe(df: pd.DataFrame, name: str, staging: Path, type: str | None) -> tuple[Path, str, str]:
    """Write `df` as `type` (parquet by default); returns (file, pin type, default title)."""
    kind = (type or "parquet").lower()
    if kind == "feather":
        kind = "arrow"
    path = staging / f"{name}.{kind}"
    if kind == "parquet":
        df.to_parquet(path)
    elif kind == "csv":
        df.to_csv(path, index=False)
    elif kind == "arrow":
        df.reset_index(drop=True).to_feather(path)
    else:
        raise BoardError(f"cannot store a DataFrame as type {type!r}; use {', '.join(DATAFRAME_TYPES)}")
    return path, kind, f"{name}: a pinned {df.shape[0]} x {df.shape[1]} DataFrame"


def save_json(x: Any, name: str, staging: Path, type: str | None) -> tuple[Path, str, str]:
    """Write a JSON-able object; returns (file, "json", default title)."""
    if type not in (None, "json"):
        raise BoardError(f"cannot store a {type_name(x)} as type {type!r}")
    path = staging / f"{name}.json"
    try:
        path.write_text(json.dumps(x))
    except (TypeError, ValueError) as e:
        raise BoardError(f"pin {name!r}: {type_name(x)} is not a DataFrame, path, URL or "
                         f"JSON-able object ({e})") from e
    return path, "json", f"{name}: a pinned {type_name(x)}"


def load_pin(pin_type: str, paths: list[Path]) -> Any:
    """The object stored in a pin's files, else NOT_LOADED: one file of a table or json type, or an
    R legacy `table` pin (`data.csv` beside R's own `data.rds`), read from its csv."""
    if len(paths) == 1:
        return load(pin_type, paths[0])
    if pin_type == "table":
        csv = [p for p in paths if p.name == "data.csv"]
        if len(csv) == 1:
            return pd.read_csv(csv[0])
    return NOT_LOADED


def load(pin_type: str, path: Path) -> Any:
    """The object stored in a one-file pin of a table or json type, else NOT_LOADED."""
    suffix = path.suffix.lower()
    if pin_type == "parquet" or (pin_type == "table" and suffix == ".parquet"):
        return pd.read_parquet(path)
    if pin_type == "csv" or (pin_type == "table" and suffix == ".csv"):
        return pd.read_csv(path)
    if pin_type in {"arrow", "feather"}:
        return pd.read_feather(path)
    if pin_type == "json":
        return json.loads(path.read_text())
    return NOT_LOADED
