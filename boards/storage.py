"""The storage protocol: the few primitives a backend implements, and nothing users call directly.

`Board` (board.py) implements every user operation once, over a `Storage`. A backend — a folder
(`fs_board.FolderStorage`), a bucket (`cloud.BucketStorage`), an HTTP data.txt or `_pins.yaml` site
(`datatxt_board.DatatxtStorage`, `url_board.UrlStorage`), Kaggle (`kaggle_board.KaggleStorage`) —
subclasses `StorageBase`, which gives the read-only and no-index defaults, and overrides what it can
do. A new backend goes here: implement the primitives, add a constructor in `constructors.py`, a row
in the kind table `constructors.KINDS` (the registry, the CLI and error messages read it), and run
the board tests against a real server for it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Protocol, runtime_checkable

from .cache import Cache
from .errors import PinNotFound, ReadOnlyBoard, VersionNotFound
from .meta import PinMeta
from .safety.names import check_pin_name
from .tempnames import staging_dir

# Field in data.txt marking a pin that pinstorm zipped for transport: pin_get unzips it by default.
ZIPPED_FIELD = "pinstorm_zipped"


@runtime_checkable
class Storage(Protocol):
    """What a backend does. Names are board-level (pin, version, file), never storage paths."""

    name: str          # the board's name, for messages and cache folders
    kind: str          # "local", "s3", "gcs", "url", "datatxt", "kaggle", ...
    cache: Cache       # where fetched versions (and remote indexes) are kept
    read_only: bool

    def describe(self) -> str:
        """Where the board lives, in one line (a folder, a bucket URL, an index URL)."""
    def check_name(self, name: str) -> str:
        """`name` if it is a valid pin name here, else InvalidPinName.

        Args:
            name: The pin's name.
        """
    def list_entries(self) -> list[dict[str, Any]]:
        """Index entries: dicts with at least name, description, type (and title when known)."""
    def search(self, text: str) -> list[dict[str, Any]]:
        """Entries matching `text` (the backend may search server-side).

        Args:
            text: Found in a pin's name, title or description (case-insensitive); empty: every pin.
        """
    def list_versions(self, name: str) -> list[str]:
        """Version names of a pin, oldest first; PinNotFound if there is no such pin.

        Args:
            name: The pin's name.
        """
    def resolve_version(self, name: str, version: Any, versions: list[str]) -> str:
        """The full version name `version` (a name, a unique prefix, None for the newest) means.

        Args:
            name: The pin's name.
            version: A full version name, a unique prefix, or None for the newest.
            versions: The pin's versions, oldest first.
        """
    def read_meta(self, name: str, version: str) -> PinMeta:
        """A version's data.txt.

        Args:
            name: The pin's name.
            version: The full version name.
        """
    def stored_time(self, name: str, version: str) -> float | None:
        """When the version's data.txt was stored (epoch seconds), None when the storage cannot say.

        Args:
            name: The pin's name.
            version: The full version name.
        """
    def local_folder(self, name: str, version: str) -> Path | None:
        """A local folder already holding the version's files (local boards), else None.

        Args:
            name: The pin's name.
            version: The full version name.
        """
    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        """Copy `file` of a version to `dest`; with `offset`, append its bytes from `offset` on.

        Args:
            name: The pin's name.
            version: The full version name.
            file: The file's name in the version.
            dest: The local file to write.
            offset: Append the file's bytes from this offset on (0: the whole file).
        """
    def direct_fetch(self, name: str, version: str | None, *, download: bool) -> tuple[PinMeta, Path] | None:
        """(meta, folder) for a pin this backend serves outside the versioned cache; None otherwise.

        Args:
            name: The pin's name.
            version: A version, or None for the newest.
            download: False: never touch the network.
        """
    def default_extract(self, meta: PinMeta) -> bool:
        """What `pin_get(extract=None)` means for this version.

        Args:
            meta: The version's data.txt.
        """
    def staging(self, name: str) -> ContextManager[tuple[Path, bool]]:
        """(an empty private folder to assemble a version in, whether it is on the board itself).

        Args:
            name: The pin's name.
        """
    def write_version(self, name: str, staging: Path, meta: PinMeta) -> str:
        """Store the staged files and `meta` as a new version; returns its name.

        Args:
            name: The pin's name.
            staging: The folder the version was assembled in (`staging`).
            meta: The version's data.txt.
        """
    def repair_version(self, name: str, version: str, meta: PinMeta, staging: Path) -> bool:
        """Make a stored version hold the staged bytes if its own no longer hash to `meta`.

        Args:
            name: The pin's name.
            version: The full version name.
            meta: The version's data.txt.
            staging: The folder holding the same bytes, staged again.

        Returns:
            Whether the version was repaired.
        """
    def delete(self, name: str, versions: list[str] | None = None) -> None:
        """Delete some versions of a pin, or the whole pin.

        Args:
            name: The pin's name.
            versions: The full version names to delete (None: the whole pin).
        """
    def batch(self, hand_over: Callable[[dict[str, Any]], None] | None = None) -> ContextManager[Any]:
        """Defer the upkeep of derived indexes until the outermost batch closes.

        Args:
            hand_over: Given what the outermost batch wrote ({pin: metadata}) in place of indexing it,
                for another batch to `publish`.
        """
    def with_cache(self, cache: str | os.PathLike[str] | Cache) -> "Storage":
        """The same storage, keeping fetched versions in `cache`.

        Args:
            cache: A `Cache`, or the folder of one.
        """
    def refusal(self, action: str, name: str | None) -> ReadOnlyBoard:
        """The error a read-only backend raises for `action` ("pin", "remove") on pin `name`.

        Args:
            action: What was refused: ``"pin"``, ``"remove"``, ...
            name: The pin's name (None: the board as a whole).
        """


@runtime_checkable
class Maintenance(Protocol):
    """Storage maintenance: what a backend with an index of its own (folders, buckets) also does.

    `Board.maintenance` is the storage when it implements these, else None; `Board.rebuild_index`,
    `Board.sweep_temporaries` and `Board.stored_versions` call them (`pinstorm board repair`).
    """

    def rebuild_index(self, sweep: bool = True) -> int:
        """Rebuild data.txt from the stored versions; returns the number of pins listed.

        Args:
            sweep: Also remove abandoned temporaries first.
        """
    def sweep_temporaries(self, older_than: float = ...) -> int:
        """Remove abandoned staging folders (and, on buckets, unfinished versions); returns how many.

        Args:
            older_than: Seconds; only what is at least this old.
        """
    def stored_versions(self) -> dict[str, list[str]]:
        """Pin name -> version names, from the stored files (not the index)."""


class StorageBase:
    """Defaults for the `Storage` primitives: a read-only board without derived indexes.
    Subclasses set `kind` and implement listing, metadata and downloads.

    Its methods are the `Storage` primitives, documented there.

    Args:
        name: The board's name.
        cache: A `Cache`, or the folder of one (None: the user cache folder).
    """

    kind = "board"
    read_only = False

    def __init__(self, name: str, *, cache: str | Path | Cache | None = None):
        self.name = name
        self.cache = cache if isinstance(cache, Cache) else Cache(cache)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.describe()}>"

    def describe(self) -> str:
        return self.kind

    def check_name(self, name: str) -> str:
        return check_pin_name(name)

    def list_entries(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def search(self, text: str) -> list[dict[str, Any]]:
        needle = (text or "").lower()
        return [e for e in self.list_entries()
                if needle in " ".join(str(e.get(k) or "") for k in ("name", "title", "description")).lower()]

    def list_versions(self, name: str) -> list[str]:
        raise NotImplementedError

    def resolve_version(self, name: str, version: Any, versions: list[str]) -> str:
        if not versions:
            raise PinNotFound(f"pin {name!r} has no versions on board {self.name!r}")
        if version is None:
            return versions[-1]
        wanted = str(version)
        if wanted in versions:
            return wanted
        matches = [v for v in versions if v.startswith(wanted)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise VersionNotFound(f"version prefix {wanted!r} of pin {name!r} is ambiguous: {', '.join(matches)}")
        raise VersionNotFound(f"pin {name!r} on board {self.name!r} has no version {wanted!r} "
                              f"(it has {', '.join(versions[-5:])}{' ...' if len(versions) > 5 else ''})")

    def read_meta(self, name: str, version: str) -> PinMeta:
        raise NotImplementedError

    def stored_time(self, name: str, version: str) -> float | None:
        return None

    def local_folder(self, name: str, version: str) -> Path | None:
        return None

    def download_file(self, name: str, version: str, file: str, dest: Path, offset: int = 0) -> None:
        raise NotImplementedError

    def direct_fetch(self, name: str, version: str | None, *, download: bool) -> tuple[PinMeta, Path] | None:
        return None

    def default_extract(self, meta: PinMeta) -> bool:
        """Unzip what pinstorm zipped itself, leave other archives be."""
        return bool(meta.extra.get(ZIPPED_FIELD))

    @contextlib.contextmanager
    def staging(self, name: str) -> Iterator[tuple[Path, bool]]:
        """A fresh TMPDIR folder, into which `pin` links the user's files rather than copying them
        (a 155 GB archive must not need 155 GB of TMPDIR); `write_version` then reads them once."""
        root = staging_dir()
        try:
            staging = root / "stage"
            staging.mkdir()
            yield staging, False
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def write_version(self, name: str, staging: Path, meta: PinMeta) -> str:
        raise self.refusal("pin", name)

    def repair_version(self, name: str, version: str, meta: PinMeta, staging: Path) -> bool:
        """Boards that cannot read their bytes cheaply (object stores, read-only boards) keep the
        version as it is."""
        return False

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        raise self.refusal("remove", name)

    @contextlib.contextmanager
    def batch(self, hand_over: Callable[[dict[str, Any]], None] | None = None) -> Iterator[Any]:
        yield self  # no derived index to defer: nothing is ever handed over

    def with_cache(self, cache: str | os.PathLike[str] | Cache) -> "StorageBase":
        clone = copy.copy(self)
        clone.cache = cache if isinstance(cache, Cache) else Cache(cache)
        return clone

    def refusal(self, action: str, name: str | None) -> ReadOnlyBoard:
        return ReadOnlyBoard(f"board {self.name!r} ({self.kind}) is read-only; cannot {action} {name!r}")
