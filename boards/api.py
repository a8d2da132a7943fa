"""The module-level pins API (`pin`, `pin_get`, ...), resolving `board=` through the registry.

Names mirror legacy R pins so scripts port directly; each takes `board=` as a registered name or a
Board object. With `board=None`, writes go to the default "local" board and reads look there first,
then in the other registered boards, as R's `pin_get` did.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .board import FIND_COLUMNS, Board
from .errors import BoardError, PinNotFound
from .registry import DEFAULT_BOARD, board_get, board_names


def _board_holding(name: str, board: str | Board | None) -> Board:
    if board is not None:
        return board_get(board)
    default = board_get(DEFAULT_BOARD)
    try:
        default.list_versions(name)
        return default
    except PinNotFound:
        pass
    for other in board_names():
        if other == DEFAULT_BOARD:
            continue
        try:
            candidate = board_get(other)
            if name in {e.get("name") for e in candidate.list_entries()}:
                return candidate
        except (BoardError, OSError):
            continue  # an unreachable or misconfigured board must not hide the others
    raise PinNotFound(f"no pin named {name!r} on any registered board ({', '.join(board_names())})")


def pin(x: Any, name: str | None = None, board: str | Board | None = None, description: str | None = None,
        zip: bool = False, metadata: dict | None = None, type: str | None = None, title: str | None = None,
        tags: list[str] | None = None) -> Any:
    """Pin `x` (DataFrame, path(s), URL or JSON-able object) to `board`; returns what pin_get would.
    The same bytes with a new description, title, metadata or tags make a new version."""
    return board_get(board).pin(x, name=name, description=description, zip=zip, metadata=metadata,
                                type=type, title=title, tags=tags)


def batch(board: str | Board | None = None):
    """`with boards.batch("team"): boards.pin(...)`: the board's indexes (data.txt, `_pins.yaml`) are
    published once when the block ends, not after every pin, so many pins cost what each costs alone."""
    return board_get(board).batch()


def pin_get(name: str | list[str], board: str | Board | None = None, cache: bool = True,
            extract: bool | None = None, version: str | None = None, files: bool = False,
            download: bool = True, extract_limits: dict | None = None) -> Any:
    """Retrieve a pin: DataFrame / JSON value, or absolute local paths. A list of names fetches in parallel.

    `extract_limits` (e.g. `{"max_bytes": 2**40}`) adjusts the board's archive extraction bounds for this call."""
    if isinstance(name, (list, tuple)):
        from .parallel import pin_get_many

        return pin_get_many(list(name), board=board, extract=extract)
    options = {} if extract_limits is None else {"extract_limits": extract_limits}
    return _board_holding(name, board).pin_get(name, cache=cache, extract=extract, version=version,
                                               files=files, download=download, **options)


def pin_find(text: str = "", board: str | Board | list | None = None, name: str | None = None,
             extended: bool = False) -> pd.DataFrame:
    """Search pins by name, title and description on one board, several, or every registered one."""
    if board is None:
        targets = board_names()
    elif isinstance(board, (list, tuple)):
        targets = list(board)
    else:
        targets = [board]
    frames = []
    for b in targets:
        try:
            frames.append(board_get(b).pin_find(text, name=name, extended=extended))
        except (BoardError, OSError) as e:
            if board is not None:
                raise
            import warnings

            warnings.warn(f"pin_find: skipped board {b!r}: {e}", stacklevel=2)
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=FIND_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def pin_info(name: str, board: str | Board | None = None, version: str | None = None) -> dict:
    return _board_holding(name, board).pin_info(name, version=version)


def pin_versions(name: str, board: str | Board | None = None) -> pd.DataFrame:
    return _board_holding(name, board).pin_versions(name)


def pin_remove(name: str, board: str | Board | None = None, version: str | None = None) -> None:
    board_get(board).pin_remove(name, version=version)
