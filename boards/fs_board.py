"""A writable board on any fsspec filesystem: a local folder, an S3 bucket, a GCS bucket.

Layout (pins 1.x): `<root>/<pin>/<version>/{data.txt, files}` plus the legacy `<root>/data.txt`
index. A version exists exactly when its `data.txt` does, and `data.txt` is written last, so a reader
never sees half a version: on local disks the version folder is built under a temporary name and
renamed; on object stores the files go first and `data.txt` after them. Local writers serialise
index updates with a file lock; listings are never served from fsspec's cache.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import uuid
from pathlib import Path

import fsspec
from filelock import FileLock

from . import index as board_index
from .board import Board
from .errors import PinNotFound
from .meta import PinMeta, parse_version

TMP_MARK = ".tmp-"


class FsBoard(Board):
    """A board stored in folder `root` of fsspec filesystem `fs`."""

    kind = "folder"

    def __init__(self, name: str, fs: fsspec.AbstractFileSystem, root: str, *, kind: str | None = None,
                 **kwargs):
        super().__init__(name, **kwargs)
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        if kind:
            self.kind = kind
        self.is_local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
        if self.is_local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        proto = self.fs.protocol[0] if isinstance(self.fs.protocol, tuple) else self.fs.protocol
        return self.root if self.is_local else f"{proto}://{self.root}"

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def _fresh(self, path: str | None = None) -> None:
        """Drop fsspec's cached listings: another process may have written since."""
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(path)

    # ---- index ----------------------------------------------------------------------------
    def _index_lock(self):
        if self.is_local:
            return FileLock(os.path.join(self.root, ".data.txt.lock"))
        return contextlib.nullcontext()

    def read_index(self) -> list[dict] | None:
        path = self._path(board_index.INDEX_FILE)
        try:
            text = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return board_index.parse_index(text, source=f"{self.describe()}/data.txt")

    def _write_text(self, path: str, text: str) -> None:
        if self.is_local:
            tmp = f"{path}{TMP_MARK}{uuid.uuid4().hex[:8]}"
            Path(tmp).write_text(text)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, text.encode())  # single-object PUTs are atomic on object stores

    def _update_index(self, name: str) -> None:
        with self._index_lock():
            self._fresh()
            entries = self.read_index() or []
            entry = self._index_entry(name)
            self._write_text(self._path(board_index.INDEX_FILE),
                             board_index.dump_index(board_index.merge_entry(entries, entry, name=name)))

    def _index_entry(self, name: str) -> dict | None:
        try:
            versions = self.list_versions(name)
        except PinNotFound:
            return None
        latest = versions[-1]
        meta = self.read_meta(name, latest)
        return {"path": f"{name}/{latest}/", "name": name, "description": meta.description or "",
                "type": meta.type, "title": meta.title, "version": latest, "versions": versions,
                "file": meta.file, "created": meta.created}

    def rebuild_index(self) -> int:
        """Rewrite the root data.txt from the pins actually stored; returns the number of pins."""
        with self._index_lock():
            self._fresh()
            entries = [e for n in self._pin_names() if (e := self._index_entry(n)) is not None]
            self._write_text(self._path(board_index.INDEX_FILE), board_index.dump_index(entries))
        return len(entries)

    def _pin_names(self) -> list[str]:
        try:
            listing = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in listing
                      if e["type"] == "directory" and not posixpath.basename(e["name"].rstrip("/")).startswith("."))

    # ---- primitives -----------------------------------------------------------------------
    def list_entries(self) -> list[dict]:
        """The index, reconciled with the folders really there (other tools may not keep the index)."""
        self._fresh()
        indexed = {e["name"]: e for e in (self.read_index() or [])}
        names = self._pin_names()
        entries = [indexed[n] for n in names if n in indexed]
        entries += [e for n in names if n not in indexed and (e := self._index_entry(n)) is not None]
        return sorted(entries, key=lambda e: e["name"])

    def list_versions(self, name: str) -> list[str]:
        folder = self._path(name)
        self._fresh(folder)
        try:
            if self.is_local:
                found = self.fs.glob(posixpath.join(folder, "*", "data.txt"))
            else:  # one recursive listing is one request on object stores; glob costs several
                depth = folder.rstrip("/").count("/") + 2
                found = [p for p in self.fs.find(folder) if p.endswith("/data.txt") and p.count("/") == depth]
        except FileNotFoundError:
            found = []
        versions = [posixpath.basename(posixpath.dirname(p)) for p in found]
        versions = [v for v in versions if TMP_MARK not in v and not v.startswith(".")]
        if not versions:
            raise PinNotFound(f"no pin named {name!r} on board {self.name!r} ({self.describe()})")
        # pins 1.x names sort by time; others (hand-made folders) after them, by name
        return sorted(versions, key=lambda v: (parse_version(v) is None, v))

    def read_meta(self, name: str, version: str) -> PinMeta:
        path = self._path(name, version, "data.txt")
        try:
            text = self.fs.cat_file(path)
        except FileNotFoundError as e:
            raise PinNotFound(f"pin {name!r} version {version!r} has no data.txt on board {self.name!r}") from e
        meta = PinMeta.from_yaml(text, source=f"{self.describe()}/{name}/{version}/data.txt")
        meta.name, meta.version = name, version
        return meta

    def local_folder(self, name: str, version: str) -> Path | None:
        return Path(self._path(name, version)) if self.is_local else None

    def download_file(self, name: str, version: str, file: str, dest: Path) -> None:
        self.fs.get_file(self._path(name, version, file), str(dest))

    def write_version(self, name: str, staging: Path, meta: PinMeta) -> str:
        version = meta.version_name
        final = self._path(name, version)
        files = [f for f in meta.file]
        if self.is_local:
            tmp = Path(f"{final}{TMP_MARK}{uuid.uuid4().hex[:8]}")
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copytree(staging, tmp)
                (tmp / "data.txt").write_text(meta.to_yaml())
                try:
                    os.replace(tmp, final)
                except OSError:
                    if not (Path(final) / "data.txt").exists():
                        raise  # else: an identical version (same second, same hash) is already there
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            for f in files:
                self.fs.put_file(str(staging / f), posixpath.join(final, f))
            self.fs.pipe_file(posixpath.join(final, "data.txt"), meta.to_yaml().encode())
        self._fresh()
        self._update_index(name)
        return version

    def delete(self, name: str, versions: list[str] | None = None) -> None:
        if versions is None:
            self.fs.rm(self._path(name), recursive=True)
        else:
            for v in versions:
                # data.txt first: the version stops existing before its files go
                with contextlib.suppress(FileNotFoundError):
                    self.fs.rm_file(self._path(name, v, "data.txt"))
                self.fs.rm(self._path(name, v), recursive=True)
        self._fresh()
        self._update_index(name)


def local_board(name: str = "local", path: str | os.PathLike | None = None, **kwargs) -> FsBoard:
    """A board in a local folder (default: `$PINSTORM_BOARD` or the user data folder)."""
    from .registry import default_local_path

    root = Path(path).expanduser().resolve() if path else default_local_path()
    return FsBoard(name, fsspec.filesystem("file"), str(root), kind="local", **kwargs)

