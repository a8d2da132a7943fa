"""The module-level pins API (`pin`, `pin_get`, `pin_write`, ...), resolving `board=` through the registry.

Names mirror legacy R pins so scripts port directly; each takes `board=` in any form
`registry.resolve_board` takes (a registered name, a Board, `board://NAME`, an http(s) URL, a spec
dict) and resolves it there. With `board=None`, writes go to the default "local" board and reads look
there first, then in the other registered boards, as R's `pin_get` did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ContextManager

from .board import FIND_COLUMNS, Board
from .errors import PinNotFound
from .metadata import PinMetadata
from .pruning import PRUNE_GRACE
from .registry import DEFAULT_BOARD, board_names, resolve_board

if TYPE_CHECKING:  # pandas loads when a DataFrame is made (see drivers.py)
    import pandas as pd


def _board_holding(name: str, board: str | Board | None) -> Board:
    """The board to read `name` from: `board`, else the default board when it has the pin, else the
    first other registered board whose index lists it. A board that cannot be read (unreachable,
    refused, a malformed or hostile index: any error) is skipped with a warning naming it and why:
    it never hides the pins of the others."""
    if board is not None:
        return resolve_board(board)
    default = resolve_board(DEFAULT_BOARD)
    try:
        default.list_versions(name)
        return default
    except PinNotFound:
        pass
    skipped: list[str] = []
    for other in board_names():
        if other == DEFAULT_BOARD:
            continue
        try:
            candidate = resolve_board(other)
            if name in {e.get("name") for e in candidate.list_entries()}:
                break
        except Exception as e:  # noqa: BLE001 - whatever one board's index does, the others still answer
            skipped.append(f"{other!r} ({_reason(e)})")
    else:
        unread = f"; could not read board(s) {', '.join(skipped)}" if skipped else ""
        raise PinNotFound(f"no pin named {name!r} on any registered board ({', '.join(board_names())}){unread}")
    if skipped:
        _warn(f"looking for pin {name!r}: skipped board(s) {', '.join(skipped)}; using board {candidate.name!r}")
    return candidate


def _reason(error: BaseException) -> str:
    """An error as one line naming its type (its message names the board's file or URL)."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _warn(message: str) -> None:
    import warnings

    warnings.warn(message, stacklevel=3)


def pin(x: Any, name: str | None = None, board: str | Board | None = None, description: str | None = None,
        zip: bool = False, metadata: dict[str, Any] | None = None, type: str | None = None, title: str | None = None,
        tags: list[str] | None = None) -> Any:
    """Pin `x` (DataFrame, path(s), URL or JSON-able object) to `board`; returns what pin_get would.
    The same bytes with a new description, title, metadata or tags make a new version.

    Args:
        x: A pandas DataFrame, a file or folder path, a list of paths, an http(s) URL (downloaded through
            the cache) or a JSON-able object.
        name: The pin's name (None: derived from `x`, e.g. a file's name).
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).
        description: The pin's description, searched by `pin_find`.
        zip: Store the files as one zip archive (`pin_get` unpacks it again).
        metadata: A JSON-able dict stored with the version (``pin_meta(...).user``).
        type: How a DataFrame or object is stored: ``"parquet"`` (a DataFrame's default), ``"csv"``,
            ``"arrow"``, ``"json"``, ...; for files, the pin's declared type (default ``"file"``).
        title: The pin's title (None: one made from `x`).
        tags: Tags stored with the version.

    Returns:
        What `pin_get` returns for the new version.

    Raises:
        ReadOnlyBoard: `board` cannot be written.
        InvalidPinName: `name` is not a safe pin name.
    """
    return resolve_board(board).pin(x, name=name, description=description, zip=zip, metadata=metadata,
                                type=type, title=title, tags=tags)


def batch(board: str | Board | None = None) -> ContextManager[Any]:
    """`with boards.batch("team"): boards.pin(...)`: the board's indexes (data.txt, `_pins.yaml`) are
    published once when the block ends, not after every pin, so many pins cost what each costs alone.

    Args:
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Returns:
        A context manager; batches nest, and the outermost one publishes.
    """
    return resolve_board(board).batch()


def pin_get(name: str | list[str], board: str | Board | None = None, cache: bool = True,
            extract: bool | None = None, version: str | None = None, files: bool = False,
            download: bool = True, extract_limits: dict[str, Any] | None = None) -> Any:
    """Retrieve a pin: DataFrame / JSON value, or absolute local paths. A list of names fetches in parallel.

    `extract_limits` (e.g. `{"max_bytes": 2**40}`) adjusts the board's archive extraction bounds for this call.

    Args:
        name: The pin's name, or a list of names (fetched in parallel; then `version` and `extract_limits`
            must be None).
        board: A registered board's name, a `Board`, or None: the default board first, then the other
            registered boards holding the pin.
        cache: True trusts verified cached files; False re-verifies them (re-downloading damaged ones).
        extract: True unpacks archives (zip, tar, tar.gz, gz) and returns the extracted files; None unpacks
            only what pinstorm zipped itself; False never.
        version: A full version name or a unique prefix (None: the latest).
        files: Always return the local paths, even for a table or JSON pin.
        download: False never touches the network (the cached copy or an error).
        extract_limits: This call's archive extraction bounds, e.g. ``{"max_bytes": 2**40, "max_ratio": 1000}``.

    Returns:
        A DataFrame or JSON value for table and JSON pins, else a list of absolute local paths in the cache;
        for a list of names, a dict of those by name.

    Raises:
        PinNotFound: No such pin.
        VersionNotFound: No such version.
        DownloadError: The files could not be fetched (and no verified copy is cached).
    """
    if isinstance(name, (list, tuple)):
        return _pin_get_list(list(name), board, cache=cache, extract=extract, version=version, files=files,
                             download=download, extract_limits=extract_limits)
    options = {} if extract_limits is None else {"extract_limits": extract_limits}
    return _board_holding(name, board).pin_get(name, cache=cache, extract=extract, version=version,
                                               files=files, download=download, **options)


def _pin_get_list(names: list[str], board: str | Board | None, *, version: str | None,
                  extract_limits: dict[str, Any] | None, **options: Any) -> dict[str, Any]:
    """`pin_get([...])`: every name from the board holding it (the default board first, as for one
    name), fetched in parallel, with the same options as one `pin_get`."""
    from .parallel import pin_get_many

    if version is not None:
        raise ValueError("pin_get: version= names a version of one pin; give one name, or call pin_get per pin")
    if extract_limits is not None:
        raise ValueError("pin_get: extract_limits= applies to one pin; set max_extract_bytes on the board instead")
    holders: dict[str, tuple[Board, list[str]]] = {}
    for n in names:
        holder = _board_holding(n, board)
        holders.setdefault(holder.name, (holder, []))[1].append(n)
    found: dict[str, Any] = {}
    for holder, group in holders.values():
        found.update(pin_get_many(group, board=holder, **options))
    return {n: found[n] for n in names if n in found}


def pin_find(text: str = "", board: str | Board | list[Any] | None = None, name: str | None = None,
             extended: bool = False) -> pd.DataFrame:
    """Search pins by name, title and description on one board, several, or every registered one.

    Args:
        text: Found in a pin's name, title or description (case-insensitive); empty: every pin.
        board: A board's name or a `Board`, a list of them, or None for every registered board.
        name: Only pins of exactly this name.
        extended: Every field the index holds, not only name, description, type and board.

    Returns:
        A DataFrame with one row per pin: ``name``, ``description``, ``type``, ``board`` (and, extended,
        the rest).
    """
    targets: list[str | Board]
    if board is None:
        targets = list(board_names())
    elif isinstance(board, (list, tuple)):
        targets = list(board)
    else:
        targets = [board]
    frames = []
    for b in targets:
        try:
            frames.append(resolve_board(b).pin_find(text, name=name, extended=extended))
        except Exception as e:  # noqa: BLE001 - one unreadable board (any error) must not hide the others
            if board is not None:
                raise
            _warn(f"pin_find: skipped board {b!r}: {_reason(e)}")
    frames = [f for f in frames if not f.empty]
    import pandas as pd

    if not frames:
        return pd.DataFrame(columns=FIND_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def pin_info(name: str, board: str | Board | None = None, version: str | None = None) -> dict[str, Any]:
    """Everything known about a version of a pin: its data.txt plus where it lives.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None: the default board, else the first registered
            board holding the pin.
        version: A full version name or a unique prefix (None: the latest).

    Returns:
        A dict of the version's data.txt fields, its version and location.

    Raises:
        PinNotFound: No such pin.
        VersionNotFound: No such version.
    """
    return _board_holding(name, board).pin_info(name, version=version)


def pin_versions(name: str, board: str | Board | None = None, as_df: bool = True) -> Any:
    """The versions of a pin, oldest first.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None: the default board, else the first registered
            board holding the pin.
        as_df: A DataFrame (version, created, hash); False: the `VersionInfo` objects.

    Returns:
        A DataFrame, or a list of `VersionInfo`.

    Raises:
        PinNotFound: No such pin.
    """
    return _board_holding(name, board).pin_versions(name, as_df=as_df)


def pin_remove(name: str, board: str | Board | None = None, version: str | None = None) -> None:
    """Remove a pin with all its versions, or just one version.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).
        version: A full version name or a unique prefix (None: every version).

    Raises:
        ReadOnlyBoard: `board` cannot be written.
        PinNotFound: No such pin.
    """
    resolve_board(board).pin_remove(name, version=version)


# ---- pins 1.x / pins-python names, with board= ---------------------------------------------------
def pin_meta(name: str, board: str | Board | None = None, version: str | None = None) -> PinMetadata:
    """All of a version's metadata (R's `pin_meta()`, pins-python's `Meta`), user metadata, tags and urls included.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None: the default board, else the first registered
            board holding the pin.
        version: A full version name or a unique prefix (None: the latest).

    Returns:
        A `PinMetadata`.

    Raises:
        PinNotFound: No such pin.
        VersionNotFound: No such version.
    """
    return _board_holding(name, board).pin_meta(name, version=version)


def pin_search(search: str | None = None, board: str | Board | None = None) -> pd.DataFrame:
    """Pins whose name, title, description or tags match a regular expression (pins-python's `pin_search`).

    Args:
        search: A regular expression, matched case-insensitively (None: every pin).
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Returns:
        A DataFrame of pins-python's columns (name, type, title, created, file_size, meta), one row per pin.
    """
    return resolve_board(board).pin_search(search)


def pin_versions_prune(name: str, board: str | Board | None = None, n: int | None = None,
                       days: float | None = None, *, grace: float = PRUNE_GRACE) -> list[str]:
    """Delete old versions of a pin, keeping the newest `n` and/or those of the last `days`.

    The rules, and what a reader sees meanwhile, are `Board.pin_versions_prune`'s.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).
        n: Keep the newest `n` versions.
        days: Keep the versions created in the last `days` days.
        grace: Seconds: also keep versions younger than this (default 0).

    Returns:
        The versions deleted (the newest version never is).

    Raises:
        ReadOnlyBoard: `board` cannot be written.
    """
    return resolve_board(board).pin_versions_prune(name, n=n, days=days, grace=grace)


def pin_version_delete(name: str, version: str, board: str | Board | None = None) -> None:
    """Delete one version of a pin.

    Args:
        name: The pin's name.
        version: A full version name or a unique prefix.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Raises:
        ReadOnlyBoard: `board` cannot be written.
        VersionNotFound: No such version.
    """
    resolve_board(board).pin_version_delete(name, version)


def pin_write(x: Any, name: str | None = None, board: str | Board | None = None, **kwargs: Any) -> PinMetadata:
    """pins-python's `pin_write`: store `x` as a new version of pin `name` (see `Board.pin_write`).

    Args:
        x: A DataFrame, a JSON-able object, or file path(s) with ``type="file"``.
        name: The pin's name.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).
        **kwargs: ``type``, ``title``, ``description``, ``metadata``, ``versioned``, ``created``,
            ``force_identical_write``, ``tags``: as `Board.pin_write` takes them.

    Returns:
        The stored version's `PinMetadata`.
    """
    _check_order("pin_write", x, name)
    return resolve_board(board).pin_write(x, name=name, **kwargs)


def pin_upload(paths: Any, name: str | None = None, board: str | Board | None = None,
               **kwargs: Any) -> PinMetadata:
    """Store files as a `file` pin (pins-python's `pin_upload`).

    Args:
        paths: A path or a list of paths.
        name: The pin's name.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).
        **kwargs: ``title``, ``description``, ``metadata``, ``tags``.

    Returns:
        The stored version's `PinMetadata`.
    """
    _check_order("pin_upload", paths, name)
    return resolve_board(board).pin_upload(paths, name=name, **kwargs)


def pin_read(name: str, board: str | Board | None = None, version: str | None = None,
             hash: str | None = None) -> Any:
    """The object stored in a pin (pins-python's `pin_read`): a DataFrame or a JSON value.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None: the default board, else the first registered
            board holding the pin.
        version: A full version name or a unique prefix (None: the latest).
        hash: When given, must equal the version's `pin_hash`.

    Returns:
        The stored object.

    Raises:
        PinsInsecureReadError: A ``joblib`` (pickle) pin on a board that does not allow pickles.
    """
    _check_order("pin_read", name, board)
    return _board_holding(name, board).pin_read(name, version=version, hash=hash)


def pin_download(name: str, board: str | Board | None = None, version: str | None = None,
                 hash: str | None = None) -> list[str]:
    """Local paths of a pin's files, cached and verified against its data.txt (pins-python's `pin_download`).

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None: the default board, else the first registered
            board holding the pin.
        version: A full version name or a unique prefix (None: the latest).
        hash: When given, must equal the version's `pin_hash`.

    Returns:
        Absolute local paths in the cache.
    """
    _check_order("pin_download", name, board)
    return _board_holding(name, board).pin_download(name, version=version, hash=hash)


def pin_list(board: str | Board | None = None) -> list[str]:
    """The names of the pins on a board.

    Args:
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Returns:
        The pin names.
    """
    return resolve_board(board).pin_list()


def pin_exists(name: str, board: str | Board | None = None) -> bool:
    """Whether a board holds a pin of this name.

    Args:
        name: The pin's name.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Returns:
        True when it does.
    """
    return resolve_board(board).pin_exists(name)


def pin_delete(names: str | list[str], board: str | Board | None = None) -> None:
    """Delete one or more pins with all their versions (pins-python's name for `pin_remove`).

    Args:
        names: A pin name or a list of them; every name is checked first, so a missing pin deletes nothing.
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Raises:
        PinNotFound: A name the board does not hold.
    """
    resolve_board(board).pin_delete(names)


def write_board_manifest(board: str | Board | None = None) -> dict[str, list[str]]:
    """Write `_pins.yaml` at the root of a writable board (pinstorm keeps it current on every pin
    and remove; this is for boards other tools wrote). Returns the manifest.

    Args:
        board: A registered board's name, a `Board`, or None for the default board (``"local"``).

    Returns:
        The manifest: ``{pin name: [version folders]}``.
    """
    from .manifest import write_board_manifest as _write

    return _write(resolve_board(board))


def _check_order(function: str, first: Any, second: Any) -> None:
    """R's order, `pin_write(board, x, "name")`, put the board first: say so, rather than fail later
    with "board 'name' is not registered"."""
    if isinstance(first, Board) or (isinstance(second, Board) and function in ("pin_write", "pin_upload")):
        raise TypeError(f"{function}: the board goes last here, as board=: boards.{function}(x, 'name', "
                        f"board=board), or call it on the board: board.{function}(x, 'name') "
                        "(R's pins puts the board first; pins-python and pinstorm do not)")
