"""pins-python's environment variables (its `pins.config`), as pinstorm reads them.

* `PINS_ALLOW_PICKLE_READ=1`: boards built without `allow_pickle_read=` may unpickle (`type="joblib"`
  pins). Never the default: nothing from a board is unpickled unless its user says so.
* `PINS_CACHE_DIR`: the cache folder when neither `cache=` nor `$PINSTORM_CACHE` names one.
* `PINS_DATA_DIR`: `board_local()`'s folder when `$PINSTORM_BOARD` does not name one.
"""

from __future__ import annotations

import os

PINS_ENV_DATA_DIR = "PINS_DATA_DIR"
PINS_ENV_CACHE_DIR = "PINS_CACHE_DIR"
PINS_ENV_INSECURE_READ = "PINS_ALLOW_PICKLE_READ"


def _interpret_int(name: str) -> bool:
    value = os.environ.get(name, "0")
    try:
        return bool(int(value))
    except ValueError:
        raise ValueError(f"{name} must be '0' or '1', but was set to {value!r}.") from None


def get_allow_pickle_read(flag: bool | None) -> bool:
    """A board's `allow_pickle_read` (True/False), else `$PINS_ALLOW_PICKLE_READ` ("1" allows)."""
    if flag is None:
        return _interpret_int(PINS_ENV_INSECURE_READ)
    return bool(flag)


def get_cache_dir() -> str | None:
    return os.environ.get(PINS_ENV_CACHE_DIR) or None


def get_data_dir() -> str | None:
    return os.environ.get(PINS_ENV_DATA_DIR) or None
