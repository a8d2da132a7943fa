"""Where a dataset lives: an fsspec filesystem and path for any URL, or a pin on a board.

Local paths, ``file://``, ``s3://``, ``gs://`` and every other fsspec protocol go through fsspec;
``board://<board>/<pin>`` names a folder pin on a registered board (see `boards`); streamed from an HTTP
board, its version's files are a `PinVersionFiles` filesystem over the board's own HTTP client.
Petastorm wants a URL with a scheme, so local paths are handed to it as ``file://`` URLs.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from pinstorm import boards
from .errors import InvalidPipelineInput
from .metadata import COMMON_METADATA

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
    version folder, so its parts can be read one at a time (`part_cache`): on the board's own filesystem
    (object-store and folder boards), or through the board's HTTP client (data.txt and URL boards,
    `PinVersionFiles`). Other board kinds (Kaggle) are refused.

    Args:
        url: A folder, an fsspec URL or ``board://<board>/<pin>``.
        storage_options: fsspec options for a remote URL (credentials, endpoint).

    Returns:
        The dataset's `Location`.

    Raises:
        InvalidPipelineInput: A board that cannot stream, or a pin that holds no pinstorm dataset.
    """
    if not is_board_url(url):
        return resolve(url, storage_options)

    name, pin = parse_board_url(url)
    board = boards.resolve_board(name)        # the one resolver (boards.registry.resolve_board)
    storage = board.storage
    if callable(getattr(storage, "read_range", None)):   # an HTTP board: files known from the pin's metadata
        return _http_pin(url, board, pin)
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


def _http_pin(url: str, board, pin: str) -> Location:
    """The Location of pin `pin`'s newest version on an HTTP board (data.txt or URL board)."""
    meta = board.pin_meta(pin)
    version = str(meta["version"])
    files = meta["file"] if isinstance(meta["file"], list) else [meta["file"]]
    sizes = meta.get("file_size")
    sizes = sizes if isinstance(sizes, list) else [sizes]
    if COMMON_METADATA not in files:
        raise InvalidPipelineInput(f"{url}: the pin holds no pinstorm dataset (no {COMMON_METADATA} in its "
                                   f"version {version})")
    if len(sizes) != len(files) or not all(isinstance(n, int) and n >= 0 for n in sizes):
        raise InvalidPipelineInput(f"{url}: version {version}'s metadata records no file sizes, which streaming "
                                   "needs; read it with stream=False (the pin is fetched whole)")
    fs = PinVersionFiles(storage=board.storage, pin=pin, version=version, files=dict(zip(files, sizes)))
    return Location(fs, fs.root, fs.root, {})


class PinVersionFiles(AbstractFileSystem):
    """The files of one version of a pin on an HTTP board (data.txt or URL board) as a read-only fsspec
    filesystem, so that `part_cache` streams its parts as it streams any remote dataset's.

    Why not fsspec's HTTPFileSystem on the version's URL: a plain web server cannot list a folder, so the
    files and their sizes come from the version's metadata here (`ls`); and every byte goes through the
    board's own HTTP client (`read_range`), which sends the board's headers and credentials to its origin
    only, redirects included, and builds each file's URL by the boards' safety rules (no ``..``, no absolute
    URL, no other host). Paths are ``<version URL>/<file>``.

    Args:
        storage: The board's storage (`DatatxtStorage` or `UrlStorage`).
        pin: The pin's name.
        version: The version's name.
        files: Each file's name and size, as the version's metadata records them.
    """

    protocol = "pinstorm-pin"
    cachable = False   # one per Location; pickled to DataLoader workers with its storage

    def __init__(self, *, storage, pin: str, version: str, files: dict[str, int]):
        super().__init__()
        self.storage, self.pin, self.version, self.files = storage, pin, version, dict(files)
        self.root = storage.file_url(pin, version, COMMON_METADATA)[: -len(COMMON_METADATA) - 1]
        self._owner = os.getpid()

    @classmethod
    def _strip_protocol(cls, path):
        return str(path).rstrip("/")

    def _board(self):
        """The board's storage, with an HTTP session of this process's own (a forked worker gets a new one)."""
        if self._owner != os.getpid():
            self.storage, self._owner = copy.copy(self.storage), os.getpid()   # __setstate__: a fresh session
        return self.storage

    def _name(self, path) -> str:
        path = self._strip_protocol(path)
        name = path[len(self.root) + 1:] if path.startswith(self.root + "/") else None
        if name not in self.files:
            raise FileNotFoundError(path)
        return name

    def info(self, path, **kwargs) -> dict:
        path = self._strip_protocol(path)
        if path == self.root:
            return {"name": self.root, "size": 0, "type": "directory"}
        return {"name": path, "size": self.files[self._name(path)], "type": "file"}

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        if path != self.root:
            entries = [self.info(path)]
        else:
            entries = [{"name": f"{self.root}/{name}", "size": size, "type": "file"}
                       for name, size in sorted(self.files.items())]
        return entries if detail else [entry["name"] for entry in entries]

    def cat_file(self, path, start=None, end=None, **kwargs) -> bytes:
        name = self._name(path)
        size = self.files[name]
        start = 0 if start is None else max(0, start + size if start < 0 else start)
        end = size if end is None else min(size, end + size if end < 0 else end)
        try:
            return self._board().read_range(self.pin, self.version, name, start, end)
        except boards.DownloadError as error:
            if error.status == 404:
                raise FileNotFoundError(f"{self.root}/{name}") from None
            raise

    def read_into(self, path, start: int, end: int, take) -> None:
        """Bytes `start`..`end` of file `path`, handed to `take` block by block as they arrive (one ranged GET,
        nothing held in memory: `ranged_reads.BoardReads`); `boards.DownloadError` when cut off."""
        name = self._name(path)
        try:
            self._board().read_range_into(self.pin, self.version, name, start, min(end, self.files[name]), take)
        except boards.DownloadError as error:
            if error.status == 404:
                raise FileNotFoundError(f"{self.root}/{name}") from None
            raise

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise PermissionError(f"{path}: a board's pin is read-only here")
        return _RangedFile(self, self._strip_protocol(path), mode, block_size=block_size or "default",
                           cache_options=cache_options, size=self.info(path)["size"])


class _RangedFile(AbstractBufferedFile):
    """A file of `PinVersionFiles`, read by ranged GETs."""

    def _fetch_range(self, start, end):
        return self.fs.cat_file(self.path, start, end)


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
