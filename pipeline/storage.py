"""Where a dataset lives: an fsspec filesystem and path for any URL, or a pin on a board.

Local paths, ``file://``, ``s3://``, ``gs://`` and every other fsspec protocol go through fsspec;
``board://<board>/<pin>`` names a folder pin on a registered board (see `boards`).
Petastorm wants a URL with a scheme, so local paths are handed to it as ``file://`` URLs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from pinstorm import boards
from .errors import InvalidPipelineInput

BOARD_SCHEME = boards.registry.BOARD_SCHEME   # "board://", as boards.resolve_board reads it


@dataclass(frozen=True)
class Location:
    """Where a dataset lives: what `locate` returns and the part readers take.

    Args:
        fs: An fsspec filesystem.
        path: The dataset folder on `fs`, no trailing slash.
        url: A URL petastorm understands (``file://...`` for a local folder).
        storage_options: The fsspec options `fs` was made with.
    """

    fs: object
    path: str
    url: str
    storage_options: dict

    def join(self, name: str) -> str:
        """The path of file `name` inside the dataset folder.

        Args:
            name: A file name (a part, ``_common_metadata``).
        """
        return f"{self.path}/{name}"

    @property
    def is_local(self) -> bool:
        return self.url.startswith("file://")

    def in_this_process(self) -> "Location":
        """This location with a filesystem that works in this process. An async fsspec filesystem (s3fs,
        gcsfs, adlfs) made before a fork refuses to run in the child ("This class is not fork-safe"): a
        forked DataLoader worker gets one made again, with the same options."""
        made_in = getattr(self.fs, "_pid", None)
        if made_in is None or made_in == os.getpid():
            return self
        return replace(self, fs=type(self.fs)(**self.fs.storage_options, skip_instance_cache=True))


def is_board_url(url) -> bool:
    return isinstance(url, str) and url.startswith(BOARD_SCHEME)


def parse_board_url(url: str) -> tuple[str, str]:
    """``board://<board>/<pin>`` -> (board, pin); the board name goes to `boards.resolve_board`.

    Args:
        url: A ``board://`` URL naming a registered board and a pin.

    Returns:
        The board's registered name and the pin's name.

    Raises:
        InvalidPipelineInput: `url` is not ``board://<board-name>/<pin-name>``.
    """
    rest = url[len(BOARD_SCHEME):].strip("/")
    board, _, pin = rest.partition("/")
    if not board or not pin or "/" in pin:
        raise InvalidPipelineInput(f"expected board://<board-name>/<pin-name>, got {url!r}")
    return board, pin


def resolve(url, storage_options: dict | None = None) -> Location:
    """An fsspec filesystem and path for a local path or URL (not a board URL)."""
    import fsspec

    if is_board_url(url):
        raise InvalidPipelineInput(f"{url}: a board URL must be fetched or pinned, not opened as a path")
    url = os.fspath(url)
    options = dict(storage_options or {})
    scheme = urlparse(url).scheme
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        local = url[len("file://"):] if url.startswith("file://") else url
        path = os.path.abspath(os.path.expanduser(local)).rstrip("/") or "/"
        return Location(fsspec.filesystem("file"), path, "file://" + path, options)
    fs, path = fsspec.core.url_to_fs(url, **options)
    return Location(fs, path.rstrip("/"), url.rstrip("/"), options)


def locate(url, storage_options: dict | None = None) -> Location:
    """Like `resolve`, but a ``board://<board>/<pin>`` URL is fetched (cached) and its local folder used.

    Args:
        url: A folder, an fsspec URL (``s3://``, ``gs://``, ``https://``) or ``board://<board>/<pin>``.
        storage_options: fsspec options for a remote URL (credentials, endpoint).

    Returns:
        The dataset's `Location`: its filesystem, folder and URL.

    Raises:
        InvalidPipelineInput: A board URL whose pin holds no pinstorm dataset.
    """
    if not is_board_url(url):
        return resolve(url, storage_options)

    board, pin = parse_board_url(url)
    files = boards.pin_get(pin, board=board)
    if not isinstance(files, (list, tuple)) or not files:
        raise InvalidPipelineInput(f"{url}: the pin is not a folder of files (got {type(files).__name__})")
    folder = os.path.commonpath([os.path.dirname(os.fspath(f)) for f in files])
    if not os.path.isfile(os.path.join(folder, "_common_metadata")):
        raise InvalidPipelineInput(f"{url}: the pin holds no pinstorm dataset (no _common_metadata in {folder})")
    return resolve(folder)


def locate_stream(url, storage_options: dict | None = None) -> Location:
    """Like `locate`, but a ``board://<board>/<pin>`` URL is not fetched: the Location of the pin's newest
    version folder on the board's own filesystem (object-store and folder boards), so its parts can be
    read one at a time (`part_cache`). Other board kinds (HTTP data.txt, Kaggle) are refused."""
    if not is_board_url(url):
        return resolve(url, storage_options)

    name, pin = parse_board_url(url)
    board = boards.resolve_board(name)        # the one resolver (boards.registry.resolve_board)
    storage = board.storage
    fs = getattr(storage, "fs", None)
    if fs is None or not callable(getattr(storage, "path", None)):
        raise InvalidPipelineInput(f"{url}: a {board.kind} board cannot stream parts; read it with stream=False "
                                   "(the pin is fetched whole) or use the dataset's s3:// / gs:// / https:// URL")
    version = str(board.pin_meta(pin)["version"])
    folder = storage.path(pin, version).rstrip("/")
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if "file" in protocols or "local" in protocols:   # a folder board: read in place
        return resolve(folder)
    if not fs.exists(f"{folder}/_common_metadata"):
        raise InvalidPipelineInput(f"{url}: the pin holds no pinstorm dataset (no _common_metadata in its "
                                   f"version {version})")
    return Location(fs, folder, fs.unstrip_protocol(folder), {})


def petastorm_filesystem(location: Location):
    """The filesystem to hand petastorm for `location`: None for local folders (petastorm's own),
    else the fsspec filesystem behind pyarrow's legacy API.

    petastorm 0.13.1 passes a bare fsspec filesystem to ``pq.ParquetDataset(validate_schema=...)``;
    pyarrow 14 then picks its new dataset API, which rejects that keyword, so petastorm cannot read
    s3:// or gs:// at all on its own. A legacy ``pyarrow.filesystem`` object keeps the legacy API.
    """
    if location.is_local:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from pyarrow.filesystem import DaskFileSystem

        class FsspecLegacyFileSystem(DaskFileSystem):
            """pyarrow's legacy filesystem API over any fsspec filesystem."""

            def isdir(self, path):
                return self.fs.isdir(str(path))

            def isfile(self, path):
                return self.fs.isfile(str(path))

            def walk(self, path):
                return self.fs.walk(str(path))

        return FsspecLegacyFileSystem(location.fs)
