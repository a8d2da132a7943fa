"""`Board`: every user operation, written once over a `Storage` (storage.py).

A board is a storage backend (a folder, a bucket, an HTTP data.txt or `_pins.yaml` site, Kaggle)
plus what users call on it: the legacy R names (`pin`, `pin_get`, `pin_find`, `pin_info`,
`pin_versions`, `pin_remove`), pins 1.x's (`pin_meta`, `pin_search`, `pin_versions_prune`, ...) and
pins-python's (`pin_write`, `pin_read`, `pin_upload`, `pin_download`, `pin_list`, `pin_exists`,
`pin_delete`). Every board therefore behaves alike: same versions, same verified cache, same errors,
same offline fallback. Make one with a constructor (`board_folder`, `board_s3`, ... in
constructors.py) or, for the legacy API, `board_register`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path
from stat import S_ISDIR
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator, Sequence

from .safety import archive, paths, secrets

from . import drivers, zip_writer
from .cache import (EXTRACTED, Cache, StaleCacheWarning, check_folder, extract_once, restore_archive,
                    stamp_path, verify)
from .safety.diskspace import require_room, storage_errors
from .errors import (BoardError, DownloadError, IntegrityError, InvalidPinName, LimitExceeded, NotSupported,
                     PinNotFound, PinsVersionError, ReadOnlyBoard, VersionNotFound)
from .meta import FILE_HASH_FIELD, TIME_FORMAT, PinMeta, format_created, hash_matches, parse_version, utc_now
from .metadata import PinMetadata, VersionInfo, as_list, created_timestamp
from .pruning import PRUNE_GRACE, check_prune_rules, version_age, versions_to_prune
from .storage import ZIPPED_FIELD, Maintenance, Storage
from .tempnames import tmp_name
from pinstorm.progress import progress_bar

if TYPE_CHECKING:  # pandas loads when a DataFrame is made (see drivers.py)
    import pandas as pd

FIND_COLUMNS = ["name", "description", "type", "board"]
SEARCH_COLUMNS = ["name", "type", "title", "created", "file_size", "meta"]  # pins-python's
VERSION_COLUMNS = ["version", "created", "hash"]
# the Board's own options; the rest go to storage
BOARD_OPTIONS = ("versions", "max_extract_bytes", "max_extract_ratio", "allow_pickle_read")


class Board:
    """A board: the user operations over one `Storage`.

    `versions=False` keeps only the newest version of each pin (R's `versions = FALSE`, pins-python's
    `versioned=False`). `max_extract_bytes` / `max_extract_ratio` bound archive extraction.
    Storage maintenance (`rebuild_index`, `sweep_temporaries`, `stored_versions`) is the explicit
    `storage.Maintenance` interface (`Board.maintenance`); other backend extras (`fs`, `root`, a bucket's
    `ensure_bucket`, ...) are on `Board.storage` and documented on the backend class.

    Boards are made by the constructors (`board_folder`, `board_s3`, ...), not directly.

    Args:
        storage: The backend (a `Storage`).
        versions: Keep every version of a pin (False: only the newest).
        max_extract_bytes: Bytes an archive may extract to (None: `ExtractLimits`' default).
        max_extract_ratio: Bytes extracted per byte of archive (None: `ExtractLimits`' default).
        spec: ``{"kind": ..., **options}``, what `board_from_spec` makes this board from (`Board.spec`).
        allow_pickle_read: Whether `pin_read` may unpickle ``joblib`` pins (None: ``PINS_ALLOW_PICKLE_READ``).
    """

    def __init__(self, storage: Storage, *, versions: bool = True, max_extract_bytes: int | None = None,
                 max_extract_ratio: float | None = None, spec: dict[str, Any] | None = None,
                 allow_pickle_read: bool | None = None):
        self.storage = storage
        self.versions = versions
        # pins-python's: whether `type="joblib"` pins may be unpickled (None: $PINS_ALLOW_PICKLE_READ, else no)
        self.allow_pickle_read = allow_pickle_read
        # bounds on archive extraction for this board (archive.ExtractLimits; None keeps the default)
        self.extract_limits = archive.ExtractLimits.of(max_bytes=max_extract_bytes, max_ratio=max_extract_ratio)
        self._spec = dict(spec) if spec is not None else {"kind": storage.kind}
        self._written: dict[tuple[str, str], PinMeta] = {}

    # ---- identity -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.storage.name

    @property
    def kind(self) -> str:
        return self.storage.kind

    @property
    def cache(self) -> Cache:
        return self.storage.cache

    @property
    def read_only(self) -> bool:
        return self.storage.read_only

    @property
    def spec(self) -> dict[str, Any]:
        """`{"kind": ..., **options}` that `board_from_spec` turns back into this board (secrets
        included: in-process only, never written to disk; `board_register(persist=True)` strips them)."""
        return dict(self._spec)

    def with_cache(self, cache: str | os.PathLike[str] | Cache) -> "Board":
        """The same board with another cache (a job that must not share the user's cache).

        Args:
            cache: A `Cache`, or the folder of one.
        """
        copy = Board(self.storage.with_cache(cache), versions=self.versions, spec={**self._spec, "cache": cache},
                     allow_pickle_read=self.allow_pickle_read)
        copy.extract_limits = self.extract_limits
        if "_given" in self.__dict__:
            copy.board = self.board
        return copy

    @property
    def board(self) -> str:
        """pins-python's `board.board`: where the board lives, as its constructor was given it."""
        given = self.__dict__.get("_given")
        if given is not None:
            return str(given)
        return str(getattr(self.storage, "root", None) or getattr(self.storage, "url", None) or self.describe())

    @board.setter
    def board(self, value: str) -> None:
        self.__dict__["_given"] = value

    @property
    def fs(self) -> Any:
        """pins-python's `board.fs`: the board's fsspec filesystem (folder and bucket boards; an HTTP or
        Kaggle board has none: AttributeError)."""
        try:
            return self.storage.fs  # type: ignore[attr-defined]
        except AttributeError:
            raise AttributeError(f"a {self.kind} board has no fsspec filesystem") from None

    # ---- storage maintenance: the explicit interface (`storage.Maintenance`) --------------------
    @property
    def maintenance(self) -> Maintenance | None:
        """The storage's maintenance operations (`storage.Maintenance`: `rebuild_index`,
        `sweep_temporaries`, `stored_versions`), or None on a board with no index of its own
        (HTTP, Kaggle). Backend-specific extras (`fs`, `root`, ...) are on `Board.storage`."""
        return self.storage if isinstance(self.storage, Maintenance) else None

    def _maintained(self, action: str) -> Maintenance:
        maintenance = self.maintenance
        if maintenance is None:
            raise ReadOnlyBoard(f"board {self.name!r} ({self.kind}) has no index of its own to {action}")
        return maintenance

    def rebuild_index(self, sweep: bool = True) -> int:
        """Rebuild the board's data.txt index from the pins it stores (`pinstorm board repair`).

        Args:
            sweep: Also remove what killed writers left (`sweep_temporaries`).

        Returns:
            The number of pins the index lists.

        Raises:
            ReadOnlyBoard: The board has no index of its own (HTTP, Kaggle).
        """
        return self._maintained("rebuild").rebuild_index(sweep=sweep)

    def sweep_temporaries(self, older_than: float | None = None) -> int:
        """Remove what killed writers left (staging folders; on buckets, versions with no data.txt).

        Args:
            older_than: Seconds; only what is at least this old (None: the storage's default).

        Returns:
            The number of items removed.

        Raises:
            ReadOnlyBoard: The board has no index of its own (HTTP, Kaggle).
        """
        storage = self._maintained("sweep")
        return storage.sweep_temporaries() if older_than is None else storage.sweep_temporaries(older_than=older_than)

    def stored_versions(self) -> dict[str, list[str]]:
        """Pin name -> version names, from what the board stores (not its index).

        Raises:
            ReadOnlyBoard: The board has no index of its own (HTTP, Kaggle).
        """
        return self._maintained("list").stored_versions()

    @property
    def versioned(self) -> bool:
        """pins-python's name for `versions`."""
        return self.versions

    @versioned.setter
    def versioned(self, value: bool) -> None:
        self.versions = value

    def _get_cache_path(self, name: str, version: str) -> str:
        """pins-python's: the cache folder of a version (on a local folder board: nothing is copied there)."""
        return str(self.cache.version_dir(self.name, self.check_name(name), version))

    def prepare_pin_version(self, pin_dir_path: str | os.PathLike[str], x: Any, name: str | None = None,
                            type: str | None = None, title: str | None = None, description: str | None = None,
                            metadata: dict[str, Any] | None = None, versioned: bool | None = None,
                            created: _dt.datetime | None = None, object_name: Any = None) -> PinMetadata:
        """pins-python's: write `x` and its data.txt into folder `pin_dir_path` (nothing on the board);
        returns the metadata that version would have.

        Args:
            pin_dir_path: The folder to write into.
            x: As `pin_write`'s.
            name: As `pin_write`'s.
            type: As `pin_write`'s.
            title: As `pin_write`'s.
            description: As `pin_write`'s.
            metadata: As `pin_write`'s.
            versioned: As `pin_write`'s.
            created: As `pin_write`'s.
            object_name: Accepted for pins-python's signature; not used.
        """
        name = self.check_name(name if name is not None else default_pin_name(x))
        staging = Path(pin_dir_path)
        files, pin_type, default_title, extra = self._stage(x, name, staging, type=drivers.feather_deprecated(type),
                                                            zip=False)
        meta = PinMeta.from_files(files, type=pin_type, title=title or default_title, description=description,
                                  user=metadata)
        meta.file = [f.relative_to(staging).as_posix() for f in files]
        meta.extra.update(extra)
        meta.created = format_created(_after(None, created))
        (staging / "data.txt").write_text(meta.to_yaml())
        out = PinMetadata(meta.to_dict())
        out["file"] = meta.file[0] if len(meta.file) == 1 else list(meta.file)
        out["file_size"] = meta.file_size[0] if len(meta.file_size) == 1 else list(meta.file_size)
        out.update(name=name, version=meta.version_name)
        return out

    def path_to_pin(self, name: str) -> str:
        """pins-python's: the pin's name after checking it (a ValueError says "Invalid pin name").

        Args:
            name: The pin's name.
        """
        return self.check_name(name)

    def __repr__(self) -> str:
        """Name, kind, location (secrets masked), access, cache and the first pins; never raises."""
        from .display import board_text

        return board_text(self)

    def _repr_html_(self) -> str:
        from .display import board_html

        return board_html(self)

    # ---- reads of the storage, as they are ------------------------------------------------
    def describe(self) -> str:
        """Where the board lives, in one line."""
        return self.storage.describe()

    def list_entries(self) -> list[dict[str, Any]]:
        """The board's index entries (name, description, type, title, ...)."""
        return self.storage.list_entries()

    def list_versions(self, name: str) -> list[str]:
        """Version names of a pin, oldest first (PinNotFound when there is no such pin).

        Args:
            name: The pin's name.
        """
        return self.storage.list_versions(name)

    def read_meta(self, name: str, version: str) -> PinMeta:
        """A version's data.txt, as stored.

        Args:
            name: The pin's name.
            version: The full version name.
        """
        return self.storage.read_meta(name, version)

    def check_name(self, name: str) -> str:
        """`name` if it is a valid pin name on this board, else `InvalidPinName`.

        Args:
            name: The pin's name.
        """
        return self.storage.check_name(name)

    def resolve_version(self, name: str, version: str | None, versions: list[str]) -> str:
        """The full version name `version` means among `versions`.

        Args:
            name: The pin's name (for messages).
            version: A full version name, a unique prefix, or None for the newest.
            versions: The pin's versions, oldest first.

        Raises:
            VersionNotFound: No version, or more than one, matches.
        """
        return self.storage.resolve_version(name, version, versions)

    def batch(self, hand_over: Callable[[dict[str, Any]], None] | None = None) -> ContextManager[Any]:
        """`with board.batch(): ...`: write many pins and publish the board's indexes (data.txt,
        `_pins.yaml`) once, when the outermost batch closes.

        Args:
            hand_over: For worker processes: given what the outermost batch wrote ({pin: metadata}) in
                place of indexing it, for the parent to `adopt` into its own batch.
        """
        return self.storage.batch(hand_over)

    def adopt(self, written: dict[str, Any]) -> None:
        """Index the pins a `batch(hand_over=)` of another process wrote to this board: now, or when this
        object's batch closes (one index update for every worker's pins, none re-read from disk).

        Args:
            written: What the other batch handed over: {pin name: its new version's metadata}.
        """
        publish = getattr(self.storage, "publish", None)  # a storage without indexes has nothing to update
        if publish is not None:
            for name, meta in written.items():
                publish(name, meta)

    # ---- writing --------------------------------------------------------------------------
    def pin(self, x: Any, name: str | None = None, description: str | None = None, zip: bool = False,
            metadata: dict[str, Any] | None = None, type: str | None = None, title: str | None = None,
            tags: list[str] | None = None) -> Any:
        """Store `x` as a new version of pin `name` and return what `pin_get` would.

        `x`: a pandas DataFrame (Parquet, or CSV with type="csv"), a file or folder path, a list of
        paths, an http(s) URL (downloaded through the cache), or a JSON-able object. Pinning the
        latest version's bytes with the same title, description and metadata stores nothing new (and
        repairs the stored bytes on a local board if they were damaged); the same bytes with a new
        title, description or metadata make a new version, so the change is never dropped.

        Args:
            x: A pandas DataFrame, a file or folder path, a list of paths, an http(s) URL or a JSON-able object.
            name: The pin's name (None: derived from `x`).
            description: The pin's description.
            zip: Store the files as one zip archive.
            metadata: A JSON-able dict stored with the version.
            type: How a DataFrame or object is stored (``"parquet"``, ``"csv"``, ``"json"``, ...).
            title: The pin's title (None: one made from `x`).
            tags: Tags stored with the version.
        """
        name, version = self._store(x, name, description=description, zip=zip, metadata=metadata, type=type,
                                    title=title, tags=tags)
        try:
            return self.pin_get(name, version=version)
        except LimitExceeded:  # stored, but larger than the load budget: hand back its files, not an error
            return self.pin_get(name, version=version, files=True)

    def store(self, x: Any, name: str | None = None, description: str | None = None, zip: bool = False,
              metadata: dict[str, Any] | None = None, type: str | None = None, title: str | None = None,
              tags: list[str] | None = None) -> str:
        """`pin` without reading the version back: store `x` by `pin`'s rules and return the version's name.

        For writers that do not use what `pin` returns: reading a zipped pin back unpacks every file
        of it into the cache (on a bucket board, downloads it first), which was most of
        `repartition`'s time.

        Args:
            x: As `pin`'s.
            name: The pin's name (None: derived from `x`).
            description: The pin's description.
            zip: Store the files as one zip archive.
            metadata: A JSON-able dict stored with the version.
            type: As `pin`'s.
            title: The pin's title (None: one made from `x`).
            tags: Tags stored with the version.

        Returns:
            The stored version's name (the newest one's when it already held the same).
        """
        return self._store(x, name, description=description, zip=zip, metadata=metadata, type=type,
                           title=title, tags=tags)[1]

    def _store(self, x: Any, name: str | None, *, description: str | None = None, zip: bool = False,
               metadata: dict[str, Any] | None = None, type: str | None = None, title: str | None = None,
               tags: Iterable[str] | None = None, created: _dt.datetime | None = None,
               force_identical_write: bool = False, versioned: bool | None = None,
               inform: bool = False) -> tuple[str, str]:
        """Store one version; returns (pin name, version). The rules of `pin` live here."""
        if self.read_only:
            raise self.storage.refusal("pin", name)
        name = self.check_name(name if name is not None else default_pin_name(x))
        version: str | None = None
        with storage_errors(f"pin {name!r} on board {self.name!r}", self.describe()), \
                self.storage.staging(name) as (staging, in_place):
            files, pin_type, default_title, extra = self._stage(x, name, staging, type=type, zip=zip,
                                                                link=not in_place)
            meta = PinMeta.from_files(files, type=pin_type, title=title or default_title,
                                      description=description, user=metadata)
            meta.file = [f.relative_to(staging).as_posix() for f in files]
            meta.extra.update(extra)
            if tags is not None:  # pins 1.x's `tags` field
                meta.extra["tags"] = [str(t) for t in tags]
            latest = self._latest_or_none(name)
            try:
                old = self.read_meta(name, latest) if latest is not None else None
            except PinNotFound:  # pruned or removed since the listing: there is nothing to compare with
                old = None
            if old is not None and not force_identical_write \
                    and _same_content(old, meta, staging) and _same_metadata(old, meta):
                # identical content and metadata: keep the version (repairing its bytes if they rotted)
                version = str(latest)
                if inform:  # pins-python's message, on stderr
                    print(f'The hash of pin "{name}" has not changed. Your pin will not be stored.',
                          file=sys.stderr)
                self.storage.repair_version(name, version, old, staging)
            else:  # new bytes, or the same bytes with a new title, description or metadata
                meta.created = format_created(_after(latest, created))
                version = self.storage.write_version(name, staging, meta)
                meta.name, meta.version = name, version
                self._written[(name, version)] = meta  # pin_get next needs no listing or data.txt read
        assert version is not None  # stored, or the identical latest kept
        if not (self.versions if versioned is None else versioned):
            self._keep_only(name, version)
        return name, version

    def _keep_only(self, name: str, version: str) -> None:
        """Delete every version of `name` but `version` (an unversioned board or write)."""
        older = [v for v in self.list_versions(name) if v != version]
        if older:
            self.storage.delete(name, older)

    def _stage(self, x: Any, name: str, staging: Path, *, type: str | None, zip: bool,
               link: bool = False) -> tuple[list[Path], str, str, dict[str, Any]]:
        """Write `x` into `staging`; return (files, type, default title, extra data.txt fields).
        `link`: user files are symlinked, not copied (`staging` is a TMPDIR folder; see `Storage.staging`)."""
        extra: dict[str, Any] = {}
        if drivers.is_dataframe(x):
            path, kind, title = drivers.save_dataframe(x, name, staging, type)
            return [path], kind, title, extra
        staged: list[Path] = []  # files staged in place (a URL's download), dropped once zipped
        if isinstance(x, str) and x.startswith(("http://", "https://")):
            downloaded = self.cache.fetch_url(x, self.cache.url_path(self.name, x))
            target = staging / paths.url_file_name(x)  # one safe segment, whatever the URL says
            shutil.copyfile(downloaded, target)
            extra["source_url"] = secrets.strip_url(x)  # data.txt is public: no user:password@, no ?token=
            sources = [(os.fspath(target), target.name)]
            staged.append(target)
        elif isinstance(x, (str, Path)) or (isinstance(x, (list, tuple)) and x and
                                           all(isinstance(p, (str, Path)) for p in x)):
            sources = _collect_paths([x] if isinstance(x, (str, Path)) else list(x))
        else:
            path, kind, title = drivers.save_json(x, name, staging, type)
            return [path], kind, title, extra
        if zip:
            out = staging / f"{name}.zip"
            zip_writer.make_zip(sources, out)
            for download in staged:
                download.unlink()
            extra[ZIPPED_FIELD] = True
            return [out], type or "file", f"{name}: {len(sources)} zipped file(s)", extra
        if not link:  # copied onto the board's own disk: say so now if it cannot fit
            require_room(staging, sum(Path(src).stat().st_size for src, _ in sources), what=f"pin {name!r}")
        files = []
        for src, rel in sources:
            target = staging / rel
            if target != Path(src):
                target.parent.mkdir(parents=True, exist_ok=True)
                if link:  # staged by reference: the board stores a copy of the bytes, never the link
                    target.symlink_to(Path(src).resolve())
                else:
                    shutil.copyfile(src, target)  # a copy, never a link: later edits must not reach the pin
            files.append(target)
        return files, type or "file", f"{name}: {len(files)} file(s)", extra

    # ---- reading --------------------------------------------------------------------------
    def _latest_or_none(self, name: str) -> str | None:
        try:
            versions = self.list_versions(name)
        except PinNotFound:
            return None
        return versions[-1] if versions else None

    def fetch(self, name: str, version: str | None = None, *, download: bool = True,
              trust_cache: bool = True) -> tuple[PinMeta, Path]:
        """(metadata, local folder holding the files) of a version, from the cache when possible.

        With `download=False` nothing touches the network: a board on local disk serves its own
        folder, others the newest cached version. With `trust_cache=False` cached files are verified
        against their data.txt and re-downloaded if they were damaged. When the board cannot be
        reached, the newest cached version is served with a warning.

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: the latest).
            download: False: never touch the network.
            trust_cache: False: verify cached files again.
        """
        direct = self.storage.direct_fetch(name, version, download=download)
        if direct is not None:
            return direct
        cached = self.cache.cached_versions(self.name, name)
        if not download and not self._on_local_disk(name):
            if not cached:
                raise PinNotFound(f"pin {name!r} of board {self.name!r} is not in the cache "
                                  f"({self.cache.root}) and download=False")
            return self._offline(name, self.resolve_version(name, version, cached), full=not trust_cache)
        known = self._written.pop((name, version), None) if version else None
        try:
            versions = [str(version)] if known is not None else self.list_versions(name)
        except (DownloadError, OSError) as e:
            if not cached or isinstance(e, PinNotFound):
                raise
            v = self.resolve_version(name, version, cached)
            warnings.warn(f"board {self.name!r} unreachable ({e}); serving cached version {v} of {name!r}",
                          StaleCacheWarning, stacklevel=3)
            return self._offline(name, v, full=not trust_cache)
        v = self.resolve_version(name, version, versions)
        with self._reading(name, v):  # pruned under us: VersionNotFound, never a bare FileNotFoundError
            local = self.storage.local_folder(name, v)
            if local is not None:
                meta = known or self.read_meta(name, v)
                self._check(meta, local, self.cache.board_stamp(self.name, name, v), full=not trust_cache,
                            source=f"pin {name!r} version {v} on board {self.name!r} ({local})")
                return meta, local
            folder = self.cache.version_dir(self.name, name, v)
            if (folder / "data.txt").is_file():
                meta = self._cached_meta(name, v, folder)
                try:
                    self._check(meta, folder, stamp_path(folder), full=not trust_cache,
                                source=f"cached pin {name!r} version {v} of board {self.name!r} ({folder})")
                    return meta, folder
                except IntegrityError:
                    if not _discard(folder):  # damaged: fetched again below, unless it cannot be moved away
                        raise
            meta = known or self.read_meta(name, v)
            meta.version = v
            sizes = dict(zip(meta.file, meta.file_size)) if meta.file_size else {}
            with progress_bar(f"{self.name}/{name}", sum(sizes.values()) or None) as advance:
                def download_one(f: str, dest: Path, offset: int) -> None:
                    self.storage.download_file(name, v, f, dest, offset=offset)
                    advance(sizes.get(f, 0) - offset)

                folder = self.cache.fetch_version(self.name, name, meta, download_one)
            return meta, folder

    def _on_local_disk(self, name: str) -> bool:
        """Whether the board keeps its files on this machine (nothing to download: `download=False`
        and `--offline` read them in place)."""
        with contextlib.suppress(BoardError, OSError):
            versions = self.list_versions(name)
            return bool(versions) and self.storage.local_folder(name, versions[-1]) is not None
        return False

    def _offline(self, name: str, version: str, *, full: bool) -> tuple[PinMeta, Path]:
        """A cached version served without the board: checked, and an error if damaged."""
        folder = self.cache.version_dir(self.name, name, version)
        meta = self._cached_meta(name, version, folder)
        self._check(meta, folder, stamp_path(folder), full=full,
                    source=f"cached pin {name!r} version {version} of board {self.name!r} ({folder}; "
                           "the board cannot be reached to fetch it again)")
        return meta, folder

    @staticmethod
    def _check(meta: PinMeta, folder: Path, stamp: Path, *, full: bool, source: str) -> None:
        try:
            check_folder(meta, folder, stamp, full=full, source=source)
        except PermissionError:
            verify(meta, folder, source=source)  # an unwritable cache only costs the stamp: check in full

    def _cached_meta(self, name: str, version: str, folder: Path) -> PinMeta:
        meta = PinMeta.from_yaml((folder / "data.txt").read_text(), source=str(folder / "data.txt"))
        meta.name, meta.version = name, version
        return meta

    @contextlib.contextmanager
    def _reading(self, name: str, version: str | None) -> Iterator[None]:
        """Around the reading of one version: when it fails because the version's files or data.txt
        vanished and a fresh listing confirms the version is gone (pruned or removed by another
        process), raise `VersionNotFound` naming pin, version and board instead of a bare
        FileNotFoundError / PinNotFound / missing-file IntegrityError / 404. Failures of a version
        that still exists (damaged bytes, a network fault) stay what they are."""
        try:
            yield
        except VersionNotFound:
            raise
        except (FileNotFoundError, PinNotFound, IntegrityError, DownloadError) as e:
            if version is None or self._still_listed(name, version):
                raise
            raise VersionNotFound(f"pin {name!r} version {version} on board {self.name!r} is gone: it was "
                                  f"deleted (pruned or removed) while being read ({type(e).__name__}: {e})") from e

    def _still_listed(self, name: str, version: str) -> bool:
        try:
            return version in self.list_versions(name)
        except PinNotFound:
            return False
        except (BoardError, OSError):
            return True  # cannot tell (board unreachable): the original error stands

    def pin_get(self, name: str, cache: bool = True, extract: bool | None = None, version: str | None = None,
                files: bool = False, download: bool = True,
                extract_limits: "archive.ExtractLimits | dict[str, Any] | None" = None) -> Any:
        """A DataFrame or JSON value for table/json pins; for file pins, absolute local paths.

        `extract=True` unpacks archives (zip, tar, tar.gz, gz) and returns the extracted files;
        `extract=None` unpacks only pins that pinstorm zipped itself. `files=True` always returns
        paths. `version` takes a full version or a unique prefix. `cache=False` re-verifies cached
        files (and re-downloads damaged ones) instead of trusting them. `download=False` never touches
        the network. `extract_limits` (a dict such as `{"max_bytes": 2**40, "max_ratio": 1000}`) raises
        or lowers this board's extraction bounds.

        Args:
            name: The pin's name.
            cache: False: verify cached files again (re-downloading damaged ones).
            extract: True: unpack archives; None: only what pinstorm zipped; False: never.
            version: A full version name or a unique prefix (None: the latest).
            files: Always return local paths.
            download: False: never touch the network.
            extract_limits: This call's extraction bounds (an `ExtractLimits` or a dict of its fields).
        """
        name = self.check_name(name)
        meta, folder = self.fetch(name, version, download=download, trust_cache=cache)
        found = [folder / f for f in meta.file]
        if not files:
            with self._reading(name, meta.version):
                loaded = drivers.load_pin(meta.type, found, allow_pickle=self._pickle_allowed())
            if loaded is not drivers.NOT_LOADED:
                return loaded
        if extract is None:
            extract = self.storage.default_extract(meta)
        # A version fetched into the cache keeps an archive's extraction instead of the archive
        # (`cache.extract_once`): asked for the archive itself, download it again (then kept too).
        owned = folder == self.cache.version_dir(self.name, name, meta.version or "")
        if owned and not extract and any(not p.exists() for p in found):
            if not download:
                raise IntegrityError(f"pin {name!r} version {meta.version} of board {self.name!r}: the cache holds "
                                     f"its extracted files ({folder / EXTRACTED}), not its archive, and "
                                     "download=False; use extract=True, or fetch it online")
            version = meta.version or ""
            for f, p in zip(meta.file, found):
                if not p.exists():
                    with self._reading(name, version):
                        restore_archive(meta, folder, f, lambda file, dest: self.storage.download_file(
                            name, version, file, dest), source=f"pin {name!r} version {version} of board {self.name!r}")
        if not extract:
            return [str(p) for p in found]
        limits = self.extract_limits
        if extract_limits is not None:  # a dict adjusts the board's limits; ExtractLimits replaces them
            limits = archive.ExtractLimits.of(limits, **extract_limits) if isinstance(extract_limits, dict) \
                else extract_limits
        for attempt in range(2):
            out_root = self.cache.version_dir(self.name, name, meta.version or "") / EXTRACTED
            source = f"pin {name!r} version {meta.version} of board {self.name!r} ({folder})"
            result: list[str] = []
            try:
                for f, p in zip(meta.file, found):
                    if archive.is_archive(f):
                        with self._reading(name, meta.version):
                            result += [str(q) for q in extract_once(meta, folder, f, out_root, limits=limits,
                                                                    drop=owned, source=source)]
                    else:
                        result.append(str(p))
                return result
            except IntegrityError:  # an extraction changed and its archive is gone: fetch the version again
                if attempt or not (owned and download) or not _discard(folder):
                    raise
                meta, folder = self.fetch(name, meta.version, download=True, trust_cache=cache)
                found = [folder / f for f in meta.file]
        raise AssertionError("unreachable")

    def pin_versions(self, name: str, as_df: bool = True) -> pd.DataFrame | list[VersionInfo]:
        """Versions of a pin, oldest first: a DataFrame (version, created, hash), or with
        `as_df=False` the versions themselves (`v.version`, `v.created`, `v.hash`).

        Args:
            name: The pin's name.
            as_df: A DataFrame; False: the `VersionInfo` objects.
        """
        versions = [VersionInfo(v) for v in self.list_versions(self.check_name(name))]
        if not as_df:
            return versions
        import pandas as pd

        rows = [{"version": str(v), "created": pd.Timestamp(v.created) if v.created else pd.NaT, "hash": v.hash}
                for v in versions]
        return pd.DataFrame(rows, columns=VERSION_COLUMNS)

    def pin_info(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Everything known about a version (latest by default): its data.txt plus where it lives.

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: the latest).
        """
        name = self.check_name(name)
        versions = self.list_versions(name)
        v = self.resolve_version(name, version, versions)
        meta = self.read_meta(name, v)
        info = meta.to_dict()
        info.update(name=name, version=v, board=self.name, versions=len(versions))
        return info

    def pin_find(self, text: str = "", name: str | None = None, extended: bool = False) -> pd.DataFrame:
        """Pins whose name, title or description contains `text` (case-insensitive; Kaggle searches
        on its server).

        Args:
            text: Found in a pin's name, title or description; empty: every pin.
            name: Only pins of exactly this name.
            extended: Every field the index holds.
        """
        rows = []
        for e in self.storage.search(text or ""):
            if name is not None and e.get("name") != name:
                continue
            row = {"name": e.get("name"), "description": e.get("description") or "",
                   "type": e.get("type") or "files", "board": self.name}
            if extended:
                row.update({k: v for k, v in e.items() if k not in row})
            rows.append(row)
        import pandas as pd

        df = pd.DataFrame(rows)
        return df if extended and rows else df.reindex(columns=FIND_COLUMNS)

    def pin_remove(self, name: str, version: str | None = None) -> None:
        """Remove a pin with all its versions, or just one version.

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: every version).
        """
        if self.read_only:
            raise self.storage.refusal("remove", name)
        name = self.check_name(name)
        versions = self.list_versions(name)
        self.storage.delete(name, None if version is None else [self.resolve_version(name, version, versions)])

    # ---- pins 1.x: metadata, search, versions ---------------------------------------------
    def pin_meta(self, name: str, version: str | None = None) -> PinMetadata:
        """All of a version's metadata (latest by default), incl. user metadata, tags and urls.

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: the latest).
        """
        name = self.check_name(name)
        v = self.resolve_version(name, version, self.list_versions(name))
        meta = self.read_meta(name, v)
        out = PinMetadata(meta.to_dict())
        # pins-python's shapes: a string and an int for a one-file pin, lists otherwise
        out["file"], out["file_size"] = list(meta.file), list(meta.file_size)
        if len(meta.file) == 1:
            out["file"] = meta.file[0]
        if len(meta.file_size) == 1:
            out["file_size"] = meta.file_size[0]
        out["user"] = dict(meta.user or {})
        out["tags"] = as_list(out.get("tags")) or None
        out["urls"] = as_list(out.get("urls")) or None
        local = self.storage.local_folder(name, v)
        cached = self.cache.version_dir(self.name, name, v)
        folder = local if local is not None else cached if (cached / "data.txt").is_file() else None
        if folder is cached:  # a use of the cached copy: cache_prune keeps what was used lately (as pins-python)
            with contextlib.suppress(OSError):
                stat = (cached / "data.txt").stat()
                os.utime(cached / "data.txt", (max(time.time(), stat.st_atime + 1e-3), stat.st_mtime))
        out.update(name=name, version=v, board=self.name,
                   local={"dir": str(folder) if folder is not None else None, "version": v, "board": self.name})
        return out

    def pin_list(self) -> list[str]:
        """Names of the pins on this board."""
        return sorted(str(e["name"]) for e in self.list_entries())

    def pin_exists(self, name: str) -> bool:
        """Whether the board holds a pin of this name.

        Args:
            name: The pin's name.
        """
        name = self.check_name(name)
        try:
            return bool(self.list_versions(name))
        except PinNotFound:
            return False

    def pin_search(self, search: str | None = None, as_df: bool = True) -> pd.DataFrame | list[PinMetadata]:
        """Pins whose name, title, description or tags match `search`, a regular expression
        (case-insensitive; as pins-python, which searches names and titles), with their latest
        metadata: a DataFrame of pins-python's columns (name, type, title, created, file_size, meta),
        or with `as_df=False` the `PinMetadata` objects.

        Args:
            search: A regular expression (None: every pin).
            as_df: A DataFrame; False: the `PinMetadata` objects.
        """
        needle = (search or "").lower()
        try:  # pins-python's: a regular expression (a string that is not one is searched as text)
            pattern: re.Pattern[str] | None = re.compile(search or "", re.IGNORECASE)
        except re.error:
            pattern = None
        found: list[PinMetadata] = []
        for name in self.pin_list():
            try:
                meta = self.pin_meta(name)
            except BoardError:
                continue  # a pin without readable metadata is not searchable, and must not hide the others
            haystack = " ".join([name, str(meta.get("title") or ""), str(meta.get("description") or ""),
                                 *map(str, meta.get("tags") or [])]).lower()
            if (pattern.search(haystack) if pattern is not None else needle in haystack):
                found.append(meta)
        if not as_df:
            return found
        rows = [{"name": m["name"], "type": m.get("type"), "title": m.get("title"),
                 "created": created_timestamp(m.get("created")), "file_size": m.get("file_size"), "meta": m}
                for m in found]
        import pandas as pd

        return pd.DataFrame(rows, columns=SEARCH_COLUMNS)

    def pin_version_delete(self, name: str, version: str) -> None:
        """Delete one version of a pin (a full version name or a unique prefix).

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix.
        """
        self.pin_remove(name, version=version)

    def pin_versions_prune(self, name: str, n: int | None = None, days: float | None = None, *,
                           grace: float = PRUNE_GRACE) -> list[str]:
        """Delete old versions, keeping the newest `n` and/or those created in the last `days`
        (a version is kept if either rule keeps it), as pins-python does. Returns the versions deleted.

        Whatever the rules say, the newest version is never deleted. A reader in the middle of a
        version being deleted gets its complete, verified bytes or a `VersionNotFound` naming it,
        never a torn read. `grace=` (seconds, default 0) also keeps versions younger than that, e.g.
        a writer's version it is still checking: a version's age counts from the later of the time in
        its name and the time its data.txt was stored (when the board can tell), so a slow upload is
        young when it appears; with a grace period, a version of unknown age is kept.

        Args:
            name: The pin's name.
            n: Keep the newest `n` versions.
            days: Keep the versions created in the last `days` days.
            grace: Seconds: also keep versions younger than this.
        """
        check_prune_rules(n, days, grace)
        name = self.check_name(name)
        doomed = versions_to_prune(self.list_versions(name), n, days)
        if grace > 0:
            doomed = [v for v in doomed if version_age(v, self.storage.stored_time(name, v)) >= grace]
        if doomed:
            self.storage.delete(name, doomed)
        return doomed

    # ---- pins-python ----------------------------------------------------------------------
    def pin_write(self, x: Any, name: str | None = None, type: str | None = None, title: str | None = None,
                  description: str | None = None, metadata: dict[str, Any] | None = None, versioned: bool | None = None,
                  created: _dt.datetime | None = None, *, force_identical_write: bool = False,
                  tags: Iterable[str] | None = None) -> PinMetadata:
        """pins-python's `pin_write`: store `x` and return the stored version's metadata.

        `type`: parquet (default for DataFrames), csv, arrow, json, or file (paths). `versioned=False`
        keeps only the new version (default: the board's setting). `created` sets the creation time
        (and so the version name). Writing what the newest version already holds stores nothing and
        returns that version, unless `force_identical_write=True`; unlike pins-python, a changed
        title, description or metadata is a change, so it makes a new version.

        Args:
            x: A DataFrame, a JSON-able object, or file path(s) with ``type="file"``.
            name: The pin's name.
            type: ``"parquet"``, ``"csv"``, ``"arrow"``, ``"json"``, ``"joblib"`` or ``"file"``.
            title: The pin's title.
            description: The pin's description.
            metadata: A JSON-able dict stored with the version.
            versioned: False: keep only the new version (None: the board's setting).
            created: The creation time (and so the version name; None: now).
            force_identical_write: Store a new version even when the newest holds the same.
            tags: Tags stored with the version.
        """
        if isinstance(x, Board) or (isinstance(name, Board)):
            raise TypeError("pin_write(x, name): the board comes first as the object you call, "
                            "board.pin_write(x, 'name'), or as board= in boards.pin_write(x, 'name', board=...)")
        if type == "file":
            raise NotSupported(".pin_write() does not support type='file'. Use .pin_upload() to save a file as a pin.")
        return self._write(x, name, type=type, title=title, description=description, metadata=metadata,
                           versioned=versioned, created=created, force_identical_write=force_identical_write, tags=tags)

    def _write(self, x: Any, name: str | None, *, type: str | None, versioned: bool | None,
               **options: Any) -> PinMetadata:
        """pin_write and pin_upload: pins-python's rules for `versioned` and `type`, then `_store`.

        `versioned=None` means the board's setting, except that a pin which already has several
        versions stays versioned; `versioned=False` on such a pin raises PinsVersionError (delete
        the pin first), and on a pin with one version replaces it."""
        type = drivers.feather_deprecated(type)
        if name is not None and not self.read_only:
            try:
                n_before = len(self.list_versions(self.check_name(name)))
            except PinNotFound:
                n_before = 0
            if versioned is None:
                versioned = True if n_before > 1 else self.versions
            if versioned is False and n_before > 1:
                raise PinsVersionError("Pin is versioned, but you have requested a write without versions."
                                       "To un-version a pin, you must delete it")
        name, version = self._store(x, name, type=type, versioned=versioned, inform=True, **options)
        out = self.pin_meta(name, version)
        out._fresh = True
        return out

    def pin_upload(self, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], name: str | None = None,
                   title: str | None = None, description: str | None = None, metadata: dict[str, Any] | None = None,
                   tags: Iterable[str] | None = None) -> PinMetadata:
        """Store files (a path or a list of paths) as a `file` pin; returns its metadata.

        Args:
            paths: A path or a list of paths.
            name: The pin's name.
            title: The pin's title.
            description: The pin's description.
            metadata: A JSON-able dict stored with the version.
            tags: Tags stored with the version.
        """
        return self._write(paths, name, type=None, versioned=None, title=title, description=description,
                           metadata=metadata, tags=tags)

    def _pickle_allowed(self) -> bool:
        from .config import get_allow_pickle_read

        return get_allow_pickle_read(self.allow_pickle_read)

    def pin_read(self, name: str, version: str | None = None, hash: str | None = None) -> Any:
        """The object stored in a pin (DataFrame, JSON value); `hash` must equal its `pin_hash`.
        A `joblib` pin (a pickle) is read only from a board built with `allow_pickle_read=True` (or
        with PINS_ALLOW_PICKLE_READ=1): otherwise PinsInsecureReadError, before anything is read.

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: the latest).
            hash: When given, must equal the version's `pin_hash`.
        """
        meta = self._check_hash(name, version, hash)
        drivers.check_pickle(str(meta["type"]), self._pickle_allowed())
        if meta["type"] == "rds" and drivers.rds_reader() is None:  # pins-python's answer
            raise ModuleNotFoundError("Install the 'rdata' package to attempt to convert 'rds' files into Python "
                                      "objects.")
        if meta["type"] in ("file", "files"):
            raise NotSupported(f"pin {name!r} holds files, not an object: use pin_download()")
        return self.pin_get(name, version=meta["version"])

    def pin_download(self, name: str, version: str | None = None, hash: str | None = None) -> list[str]:
        """Local paths of a pin's files (cached; verified against its data.txt).

        Args:
            name: The pin's name.
            version: A full version name or a unique prefix (None: the latest).
            hash: When given, must equal the version's `pin_hash`.
        """
        meta = self._check_hash(name, version, hash)
        paths: list[str] = self.pin_get(name, version=meta["version"], files=True, extract=False)
        return paths

    def pin_delete(self, names: str | Sequence[str]) -> None:
        """Delete one or more pins with all their versions (pins-python's name for `pin_remove`).
        Every name is checked first: a missing pin deletes nothing.

        Args:
            names: A pin name or a list of them.
        """
        names = [names] if isinstance(names, str) else list(names)
        for name in names:
            if not self.pin_exists(name):
                raise PinNotFound(f"cannot delete pin {name!r}: it is not on board {self.name!r}")
        for name in names:
            self.pin_remove(name)

    def _check_hash(self, name: str, version: str | None, expected: str | None) -> PinMetadata:
        """The version's metadata, after checking its pin_hash against `expected` (when given)."""
        meta = self.pin_meta(name, version)
        actual = str(meta.get("pin_hash") or "")
        if expected is not None and actual != expected:
            raise IntegrityError(f"pin {name!r} version {meta['version']}: pin_hash is {actual!r}, "
                                 f"not the expected {expected!r}")
        return meta


# ---- helpers ------------------------------------------------------------------------------
def _after(latest: str | None, created: _dt.datetime | None = None) -> _dt.datetime:
    """Now (or `created`, when the writer gives one), or the first second after `latest` was
    created: version names have one-second resolution, and two versions in one second would sort by
    hash rather than by time. A given `created` is used as it is."""
    if created is not None:
        return created if created.tzinfo else created.replace(tzinfo=_dt.timezone.utc)
    now = utc_now()
    parsed = parse_version(latest) if latest else None
    if parsed:
        last = _dt.datetime.strptime(parsed[0], TIME_FORMAT).replace(tzinfo=_dt.timezone.utc)
        if now <= last:
            time.sleep((last - now).total_seconds() + 1.0 - (time.time() % 1.0) + 0.001)
            now = utc_now()
    return now


def _same_content(old: PinMeta, new: PinMeta, staging: Path) -> bool:
    """Whether the staged files are the stored version's files: same names and sizes, and the
    staged bytes hash to the stored pin_hash under the scheme its writer used."""
    if old.file != new.file or (old.file_size and old.file_size != new.file_size):
        return False
    if old.pin_hash == new.pin_hash:
        return True
    return hash_matches(old.pin_hash, [staging / f for f in new.file], new.file_hashes()) is True


def _same_metadata(old: PinMeta, new: PinMeta) -> bool:
    """Whether re-pinning would record nothing new: same title, description, type and metadata."""
    def extra(m: PinMeta) -> dict[str, Any]:
        return {k: v for k, v in m.extra.items() if k != FILE_HASH_FIELD}

    return (old.title, old.description, old.type, dict(old.user or {}), extra(old)) == \
        (new.title, new.description, new.type, dict(new.user or {}), extra(new))


def _discard(folder: Path) -> bool:
    """Remove a damaged cached folder: renamed away first, so no reader finds it half-deleted.
    False when it is still there (no right to move it)."""
    gone = Path(tmp_name(folder.with_name("." + folder.name)))
    try:
        os.replace(folder, gone)
    except FileNotFoundError:
        return True  # another process discarded it first
    except OSError:
        return not folder.exists()
    shutil.rmtree(gone, ignore_errors=True)
    return True


def default_pin_name(x: Any) -> str:
    """The pin name `pin(x)` uses when none is given: a path's or URL's file stem."""
    if isinstance(x, (str, Path)):
        text = secrets.strip_url(x) if isinstance(x, str) and "://" in x else str(x)
        base = Path(text.split("?", 1)[0].rstrip("/")).name
        stem = base.split(".")[0] if "." in base else base
        if stem:
            return stem
    raise InvalidPinName("pin(): give a name= for this object")


def _collect_paths(items: Iterable[str | Path]) -> list[tuple[str, str]]:
    """(source file, relative name in the pin) for files and folders, refusing duplicates.
    Plain strings, not `Path`s: a category of 1,300 files is 1,300 items, and a `Path` costs more
    than the stat each file needs."""
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for item in items:
        p = os.fspath(item)
        p = os.path.expanduser(p) if p[:1] == "~" else p
        try:
            is_dir = S_ISDIR(os.stat(p).st_mode)
        except OSError as e:  # what Path.exists() reads as "not there"; others (permissions) are raised
            if e.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
                raise
            raise FileNotFoundError(f"cannot pin {str(item)!r}: no such file or folder") from None
        found = [(os.fspath(f), f.relative_to(p).as_posix()) for f in sorted(Path(p).rglob("*")) if f.is_file()] \
            if is_dir else [(p, os.path.basename(p))]
        if is_dir and not found:
            raise BoardError(f"cannot pin folder {str(item)!r}: it holds no files")
        for src, rel in found:
            if rel in seen:
                raise BoardError(f"two files would be stored as {rel!r} in one pin; rename one")
            if paths.reserved(rel):   # DATA.TXT too: on a case-insensitive disk it is the same file
                raise BoardError(f"{src}: a pin cannot contain a file named {rel!r}: it would be the version's "
                                 "data.txt, which holds the metadata")
            seen.add(rel)
            out.append((src, rel))
    return out
