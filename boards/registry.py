"""Which boards exist: `board_register`, `board_deregister`, `board_list`, `board_get`, and
`resolve_board`, the one place a board argument (a name, None, `board://NAME`, an http(s) URL, a spec
dict or a `Board`) becomes a `Board`.

A board named "local" always exists. Registrations made in Python last for the process unless
`persist=True`; the CLI persists them in a YAML file (`$PINSTORM_CONFIG`, else `boards.yaml` in
the user config folder) so later commands and processes see them. Secrets are never written there
(`secrets.public`: secret-named options at any depth, header values but a few harmless ones, in a
dict or a list of pairs, and the userinfo and token query parameters of any URL, the board's own
included); they stay in the process. The file is created with mode 0600 and read, modified and
rewritten under a file lock, so two processes registering at once both keep their boards; a full
or read-only disk is one `BoardError` naming the file and the free space.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator

import platformdirs
import yaml
from filelock import FileLock

from .safety import secrets
from .board import Board
from .constructors import board_from_spec, default_board_name, default_local_path  # noqa: F401 (cli shows the path)
from .constructors import KINDS, is_http_url, kinds_text
from .errors import BoardError, BoardNotRegistered

_public = secrets.public  # the one rule for what may be saved (boards/safety/secrets.py)

ENV_CONFIG = "PINSTORM_CONFIG"
DEFAULT_BOARD = "local"

BOARD_SCHEME = "board://"
_lock = threading.RLock()
_boards: dict[str, Board] = {}
_specs: dict[str, dict[str, Any]] = {}
_loaded_from: str | None = None


def config_path() -> Path:
    return Path(os.environ.get(ENV_CONFIG) or Path(platformdirs.user_config_dir("pinstorm")) / "boards.yaml")


def _read_config() -> dict[str, dict[str, Any]]:
    path = config_path()
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise BoardError(f"board config {path} is not valid YAML ({e}); fix or delete it") from e
    boards = data.get("boards", {}) if isinstance(data, dict) else None
    if not isinstance(boards, dict):
        raise BoardError(f"board config {path} must be a mapping with a 'boards' mapping")
    return boards


def _write_config(boards: dict[str, dict[str, Any]]) -> None:
    """Replace the config file atomically with a file only its owner can read (mode 0600)."""
    from .tempnames import tmp_name

    path = config_path()
    with _config_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = tmp_name(path.with_name("." + path.name))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(yaml.safe_dump({"boards": boards}, sort_keys=True))
            os.chmod(tmp, 0o600)  # whatever the umask
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@contextlib.contextmanager
def _config_errors(path: Path) -> Iterator[None]:
    """A full, read-only or unwritable config disk: one BoardError naming the file and the free space
    (the config is left as it was: it is replaced atomically or not at all)."""
    try:
        yield
    except OSError as e:
        if isinstance(e, BoardError):
            raise
        free = _free_bytes(path)
        why = "no space left on its disk" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
        raise BoardError(f"cannot save the board config {path}: {why} ({free} free); free some space, or set "
                         f"${ENV_CONFIG} to a file on another disk") from e


def _free_bytes(path: Path) -> str:
    for folder in (path.parent, *path.parents):
        try:
            return f"{shutil.disk_usage(folder).free:,} bytes"
        except OSError:
            continue
    return "unknown bytes"


@contextlib.contextmanager
def _config_locked() -> Iterator[None]:
    """Serialise read-modify-write of the config file between processes."""
    path = config_path()
    with _config_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path.with_name(f".{path.name}.lock")), timeout=60)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _ensure_loaded() -> None:
    """Load persisted registrations once per config file (tests and users may switch files)."""
    global _loaded_from
    key = str(config_path())
    if _loaded_from == key:
        return
    with _lock:
        if _loaded_from == key:
            return
        for name in [n for n, s in _specs.items() if s.get("_persisted")]:
            _boards.pop(name, None)
            _specs.pop(name, None)
        for name, spec in _read_config().items():
            _specs[name] = {**spec, "_persisted": True}
        _loaded_from = key


def _make(kind: str, name: str, options: dict[str, Any]) -> Board:
    return board_from_spec({"kind": kind, **options}, name=name)


def board_register(board: str = "local", name: str | None = None, *, persist: bool = False,
                   **options: Any) -> Board:
    """Register a board and return it.

    `board` is a kind of the kind table `KINDS` (``local``, ``folder``, ``url``, ``datatxt``, ``s3``,
    ``gcs``, ``gcloud``, ``azure``, ``kaggle``) or an http(s) URL (a ``url`` board). Options go to the
    board: `path=`, `url=`, `cache=`, `versions=`, `bucket=`
    (`container=` for azure), ...

    Args:
        board: The board's kind (a key of `KINDS`), or an http(s) URL (a ``url`` board: data.txt, else
            ``_pins.yaml``).
        name: The name to register it under (None: the kind, ``"gcs"`` for ``"gcloud"``, or a name made
            from the URL such as ``host-8000-team``). Registering a name again replaces the board.
        persist: Also save it to the config file (``$PINSTORM_CONFIG``, else ``boards.yaml`` in the user's
            config folder), so other processes and the CLI see it; secret options are never saved.
        **options: The board's options, as its constructor (`board_folder`, `board_s3`, ...) takes them.

    Returns:
        The registered `Board`.

    Raises:
        BoardError: `board` is neither a kind of `KINDS` nor an http(s) URL, or a required option is missing.
    """
    if not is_http_url(board) and board not in KINDS:
        raise BoardError(f"unknown board kind {board!r}; use one of {kinds_text()}")
    name = name or default_board_name(board)
    with _lock:
        _ensure_loaded()
        kept, dropped = _public(options)  # before the board exists: storage libraries mutate nested options
        if secrets.has_secret(board):  # a board URL with user:password@ or ?token=
            dropped.append("kind (URL credentials)")
        instance = _make(board, name, dict(options))
        _boards[name] = instance
        _specs[name] = {"kind": board, **options}
        if persist:
            if dropped:
                warnings.warn(f"board {name!r}: secret options {sorted(dropped)} were not saved to the "
                              "config file; pass them again or use the storage library's own "
                              "credential chain", stacklevel=2)
            with _config_locked():
                config = _read_config()
                config[name] = {"kind": secrets.strip_url(board), **kept}
                _write_config(config)
            _specs[name]["_persisted"] = True
        return instance


def board_deregister(name: str, *, persist: bool | None = None) -> None:
    """Forget a board (its data stays where it is). Removes it from the config file too.

    Args:
        name: The registered name.
        persist: True: also remove it from the config file; False: this process only; None: from the
            config file when it was saved there.

    Raises:
        BoardNotRegistered: No board is registered under `name`.
    """
    with _lock:
        _ensure_loaded()
        if name not in _specs and name not in _boards:
            raise BoardNotRegistered(f"board {name!r} is not registered (registered: {', '.join(board_names())})")
        _boards.pop(name, None)
        spec = _specs.pop(name, {})
        if persist or (persist is None and spec.get("_persisted")):
            with _config_locked():
                config = _read_config()
                if config.pop(name, None) is not None:
                    _write_config(config)


def board_names() -> list[str]:
    with _lock:
        _ensure_loaded()
        names = set(_specs) | set(_boards) | {DEFAULT_BOARD}
    return [DEFAULT_BOARD] + sorted(names - {DEFAULT_BOARD})


def resolve_board(board: str | dict[str, Any] | Board | None = None) -> Board:
    """The one place that turns a board argument into a `Board`; every ``board=`` goes through it.

    The rules: a `Board` is returned as it is; None is the default board ``"local"``; a registered
    name is that board (made from its registration on first use); ``board://NAME`` is the board
    registered as NAME (pipeline URLs ``board://NAME/PIN`` name it the same way); an http(s) URL is
    a ``url`` board (the server's ``data.txt``, else its ``_pins.yaml``), made for this call and not
    registered; a dict is a spec ``{"kind": ..., **options}`` (`board_from_spec`, kinds from `KINDS`).
    The module-level read functions (`pin_get`, `pin_info`, ...) given None also look in the other
    registered boards when ``local`` lacks the pin; that is a search, and it too starts here.

    Args:
        board: A `Board`, None, a registered name, ``board://NAME``, an http(s) URL or a spec dict.

    Returns:
        The `Board`.

    Raises:
        BoardNotRegistered: A name (or ``board://NAME``) that is not registered.
        BoardError: A spec whose kind is not in `KINDS`, or an argument of another type.
    """
    if isinstance(board, Board):
        return board
    if isinstance(board, dict):
        return board_from_spec(board)
    if board is not None and not isinstance(board, str):
        raise BoardError(f"a board must be a Board, a registered name, board://NAME, an http(s) URL or a spec "
                         f"dict, not {type(board).__name__}")
    if is_http_url(board):
        return board_from_spec({"kind": "url", "url": board})
    name = board or DEFAULT_BOARD
    if name.startswith(BOARD_SCHEME):
        name = name[len(BOARD_SCHEME):].strip("/")
        if not name or "/" in name:
            raise BoardError(f"expected board://<board-name>, got {board!r}")
    with _lock:
        _ensure_loaded()
        if name in _boards:
            return _boards[name]
        if name in _specs:
            spec = {k: v for k, v in _specs[name].items() if k != "_persisted"}
            _boards[name] = _make(spec.pop("kind"), name, spec)
            return _boards[name]
        if name == DEFAULT_BOARD:
            _boards[name] = _make("local", name, {})
            return _boards[name]
    raise BoardNotRegistered(f"board {name!r} is not registered; register it with board_register() or "
                             f"`pinstorm board register` (registered: {', '.join(board_names())})")


def board_get(name: str | Board | None = None) -> Board:
    """The Board registered under `name` (the default "local" board for None); `resolve_board`'s rules.

    Args:
        name: A registered name, a `Board` (returned as it is), None for ``"local"``, or any other
            form `resolve_board` takes.

    Returns:
        The `Board`, made from its registration on first use.

    Raises:
        BoardNotRegistered: No board is registered under `name`.
    """
    return resolve_board(name)


def board_list() -> list[str]:
    """Names of the registered boards, "local" first."""
    return board_names()


def board_specs() -> dict[str, dict[str, Any]]:
    """name -> {kind, options...} of every registered board (secrets included only in-process)."""
    with _lock:
        _ensure_loaded()
        out = {DEFAULT_BOARD: {"kind": "local"}}
        out.update({n: {k: v for k, v in s.items() if k != "_persisted"} for n, s in _specs.items()})
        return out
