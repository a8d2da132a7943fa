"""Drivers: how Python objects become pin files and back, by pin type (as pins-python's drivers.py).

`save` writes a DataFrame (parquet, csv, arrow) or a JSON-able object into a staging folder and says
which type it stored; `load` reads a single-file pin of a table or json type back into an object
(`NOT_LOADED` for types that come back as paths). Boards never look at formats themselves.

A pin's file may come from someone else's board, so `load` reads it only within a memory budget
(`parquet_limits.load_budget()`, env ``PINSTORM_MAX_LOAD_BYTES``, default 1 GiB), checked before
anything is decoded: Parquet by what its row groups decode to (dictionaries included), Arrow IPC
by its buffers' declared decompressed sizes, CSV and JSON by file size against the budget divided by
the worst expansion of their parsers (8 and 32). Past it, `LimitExceeded` names the file, the value
and the limit; ``pin_get(..., files=True)`` still returns the path.

Parquet and Arrow files reach pandas as Arrow's own file (`pa.OSFile`), never as a Python file object
(what `pd.read_parquet(path)` would hand Arrow): Arrow reads a Python file object on its IO threads,
and such a read still holding the GIL while the interpreter finalizes aborts the process after its
work is done (``terminate called without an active exception``; apache/arrow#34314, #39162).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import BoardError, LimitExceeded, NotSupported, PinsInsecureReadError

if TYPE_CHECKING:
    import pandas as pd

# pandas, pyarrow and the Parquet bounds load on first use: together they are three quarters of a
# `pinstorm` command's start (0.4 of 0.6 s), and most commands (pin, get, list) never read a table.

NOT_LOADED = object()
DATAFRAME_TYPES = ("parquet", "csv", "arrow")
CSV_EXPANSION = 8     # pandas: one-character cells become 8-byte pointers / offsets and more
JSON_EXPANSION = 32   # `[{},{},...]`: 3 bytes of text, a 64-byte dict and an 8-byte pointer
RDS_EXPANSION = 64    # gzip-compressed R data: bounded like JSON, with room for its compression


def is_dataframe(x: Any) -> bool:
    """A pandas DataFrame, asked without loading pandas (an object cannot be one before pandas is loaded)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(x, pandas.DataFrame)


def type_name(x: Any) -> str:
    return type(x).__name__


def feather_deprecated(type: str | None) -> str | None:
    """pins-python's: type="feather" warns (DeprecationWarning) and is stored as "arrow"."""
    if type == "feather":
        import warnings

        warnings.warn('Writing pin type "feather" is unsupported. Switching type to "arrow". This produces the '
                      'exact same behavior, and also works with R pins. Please switch to pin_write using '
                      'type="arrow".', DeprecationWarning, stacklevel=4)
        return "arrow"
    return type


def save_joblib(x: Any, name: str, staging: Path) -> tuple[Path, str, str]:
    """pins-python's `type="joblib"`: a pickle, written only on request; reading it back needs the
    board's `allow_pickle_read=True` (or PINS_ALLOW_PICKLE_READ=1)."""
    import joblib

    path = staging / f"{name}.joblib"
    joblib.dump(x, path)
    title = f"{name}: a pinned {df_shape(x)} DataFrame" if is_dataframe(x) \
        else f"{name}: a pinned {type_name(x)} object"
    return path, "joblib", title


def df_shape(df: pd.DataFrame) -> str:
    return f"{df.shape[0]} x {df.shape[1]}"


def save_dataframe(df: pd.DataFrame, name: str, staging: Path, type: str | None) -> tuple[Path, str, str]:
    """Write `df` as `type` (parquet by default); returns (file, pin type, default title)."""
    kind = (type or "parquet").lower()
    if kind == "feather":
        kind = "arrow"
    if kind == "joblib":
        return save_joblib(df, name, staging)
    path = staging / f"{name}.{kind}"
    if kind == "parquet":
        df.to_parquet(path)
    elif kind == "csv":
        df.to_csv(path, index=False)
    elif kind == "arrow":
        df.reset_index(drop=True).to_feather(path)
    else:
        raise NotSupported(f"cannot store a DataFrame as type {type!r}; use {', '.join(DATAFRAME_TYPES)} "
                           "or joblib")
    return path, kind, f"{name}: a pinned {df.shape[0]} x {df.shape[1]} DataFrame"


def save_json(x: Any, name: str, staging: Path, type: str | None) -> tuple[Path, str, str]:
    """Write a JSON-able object; returns (file, "json", default title)."""
    if type == "joblib":
        return save_joblib(x, name, staging)
    if type not in (None, "json"):
        raise NotSupported(f"cannot store a {type_name(x)} as type {type!r}")
    path = staging / f"{name}.json"
    try:
        path.write_text(json.dumps(x))
    except (TypeError, ValueError) as e:
        raise NotSupported(f"pin {name!r}: {type_name(x)} is not a DataFrame, path, URL or "
                         f"JSON-able object ({e})") from e
    return path, "json", f"{name}: a pinned {type_name(x)} object"  # pins-python's default title


def check_pickle(pin_type: str, allowed: bool) -> None:
    """pins-python's refusal to unpickle a pin its reader did not allow (PinsInsecureReadError)."""
    if pin_type == "joblib" and not allowed:
        raise PinsInsecureReadError(
            f"Reading pin type {pin_type} involves reading a pickle file, so is NOT secure."
            "Set the allow_pickle_read=True when creating the board, or the "
            "PINS_ALLOW_PICKLE_READ=1 environment variable.\n"
            "See:\n"
            "  * https://docs.python.org/3/library/pickle.html \n"
            "  * https://scikit-learn.org/stable/modules/model_persistence.html#security-maintainability-limitations")


def load_pin(pin_type: str, paths: list[Path], allow_pickle: bool = False) -> Any:
    """The object stored in a pin's files, else NOT_LOADED: one file of a table or json type, or an
    R legacy `table` pin (`data.csv` beside R's own `data.rds`), read from its csv. A `joblib` pin
    (a pickle) is unpickled only with `allow_pickle`; otherwise it is NOT_LOADED (its path)."""
    if len(paths) == 1:
        if pin_type == "joblib":
            if not allow_pickle:
                return NOT_LOADED
            import joblib

            return joblib.load(paths[0])
        return load(pin_type, paths[0])
    if pin_type == "table":
        csv = [p for p in paths if p.name == "data.csv"]
        if len(csv) == 1:
            import pandas as pd

            _check_text(csv[0], CSV_EXPANSION)
            return pd.read_csv(csv[0])
    return NOT_LOADED


def load(pin_type: str, path: Path) -> Any:
    """The object stored in a one-file pin of a table or json type, else NOT_LOADED."""
    suffix = path.suffix.lower()
    if pin_type in {"parquet", "csv", "arrow", "feather", "table"}:  # a table: pandas and pyarrow load now
        import pandas as pd
        import pyarrow as pa

        from .safety import parquet_limits
    if pin_type == "parquet" or (pin_type == "table" and suffix == ".parquet"):
        parquet_limits.check_file(path, str(path))
        with pa.OSFile(str(path)) as file:
            return pd.read_parquet(file, pre_buffer=False)
    if pin_type == "csv" or (pin_type == "table" and suffix == ".csv"):
        _check_text(path, CSV_EXPANSION)
        return pd.read_csv(path)
    if pin_type in {"arrow", "feather"}:
        parquet_limits.check_arrow_file(path, str(path))
        with pa.OSFile(str(path)) as file:
            return pd.read_feather(file)
    if pin_type == "json":
        _check_text(path, JSON_EXPANSION)
        return json.loads(path.read_text())
    if pin_type == "rds" and rds_reader() is not None:  # as pins-python: R's serialisation, through rdata
        _check_text(path, RDS_EXPANSION)
        return rds_reader()(str(path))
    return NOT_LOADED


def rds_reader() -> Any:
    """`rdata.read_rds` when the rdata package is installed (a parser of R's format: no code runs), else None."""
    try:
        import rdata
    except ImportError:
        return None
    return getattr(rdata, "read_rds", None)


def _check_text(path: Path, expansion: int) -> None:
    """A text file (CSV, JSON) is parsed only when `expansion` x its size fits the load budget."""
    from .safety import parquet_limits  # the one budget rule; its module loads pyarrow

    size, budget = path.stat().st_size, parquet_limits.load_budget()
    if size * expansion > budget:
        raise LimitExceeded(f"{path}: {size:,} bytes of {path.suffix.lstrip('.') or 'text'} may take up to "
                            f"{expansion}x that once parsed, over the budget of {budget:,} bytes "
                            f"({parquet_limits.LOAD_HINT})")
