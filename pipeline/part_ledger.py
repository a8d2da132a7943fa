"""What the part cache holds, kept in an append-only journal so that its accounting costs the same at 10
files as at 100,000.

Why: the cache decides every download's room from the bytes it holds and its least recently used files.
Scanning the folder for them costs ~6 us a file under the machine-wide lock: 130 ms a download at 21,841
cached row groups, and eight ranks fetching a few a second each would queue on the lock. Instead every
process keeps the cache's state in memory ({(dataset folder, file): size} in least-recently-used order)
and, under the cache's lock, reads only the journal lines written since it last looked (`sync`), then
appends its own changes: a download's cost no longer grows with the cache.

The journal (``<root>/.ledger``): a header line, then ``+ FOLDER/FILE SIZE`` (a file entered), ``- FOLDER/FILE``
(left), ``u FOLDER/FILE`` (used). A file is entered before it is renamed into place and removed after it is
deleted, so a crash between the two leaves the journal counting a file that is not there (the cache runs a
little under its limit) rather than a file it does not count. Once the journal holds several times more
lines than files, or when it is missing or does not start with its header, it is written again from a scan
of the folders
(oldest first by modification time, which `PartCache` sets on every use): this also forgets entries whose
files someone deleted. Lines that do not parse are ignored; keys are checked against the cache's names.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections import OrderedDict
from pathlib import Path

from pinstorm.boards.tempnames import sweep, tmp_name

HEADER = "# pinstorm part cache ledger"
COMPACT_AFTER = 4096   # journal lines beyond 4 per file before it is written again from a scan


class Ledger:
    """The cache's files and their sizes, least recently used first (`entries`), and the bytes they hold
    (`used`). Call every method under the cache's lock; `sync` first."""

    def __init__(self, root: Path, key_pattern: re.Pattern):
        self.path, self.root, self.key_pattern = root / ".ledger", root, key_pattern
        self.entries: OrderedDict[str, int] = OrderedDict()
        self.used = 0
        self._file: tuple[int, int] | None = None   # (inode, device) of the journal read
        self._offset = 0
        self._lines = 0

    # -- reading ---------------------------------------------------------------------------------
    def sync(self) -> None:
        """Catch up with the journal: the lines since the last look, or all of it if it was written again."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            self.rebuild()
            return
        fresh = self._file != (stat.st_ino, stat.st_dev) or stat.st_size < self._offset
        if fresh:
            self.entries.clear()
            self.used, self._offset, self._lines = 0, 0, 0
            self._file = (stat.st_ino, stat.st_dev)
        if fresh or stat.st_size > self._offset:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read(stat.st_size - self._offset)
            if fresh and not data.startswith(HEADER.encode()):   # cut short or not ours: start again
                self.rebuild()
                return
            end = data.rfind(b"\n") + 1   # only whole lines: a writer may be mid-line (it is not, under the lock)
            for line in data[:end].decode("utf-8", "replace").splitlines():
                self._apply(line)
            self._offset += end
        if self._lines > 4 * len(self.entries) + COMPACT_AFTER:
            self.rebuild()

    def _apply(self, line: str) -> None:
        self._lines += 1
        parts = line.split(" ")
        if len(parts) < 2 or not self.key_pattern.fullmatch(parts[1]):
            return
        kind, key = parts[0], parts[1]
        if kind == "+" and len(parts) == 3 and parts[2].isdigit():
            self.used -= self.entries.pop(key, 0)
            self.entries[key] = int(parts[2])
            self.used += int(parts[2])
        elif kind == "-":
            self.used -= self.entries.pop(key, 0)
        elif kind == "u" and key in self.entries:
            self.entries.move_to_end(key)

    # -- writing ---------------------------------------------------------------------------------
    def _append(self, line: str) -> None:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, (line + "\n").encode())
        finally:
            os.close(descriptor)
        self._apply(line)
        self._offset += len(line) + 1

    def add(self, key: str, size: int) -> None:
        self._append(f"+ {key} {int(size)}")

    def remove(self, key: str) -> None:
        self._append(f"- {key}")

    def use(self, key: str) -> None:
        if key in self.entries:
            self._append(f"u {key}")

    def oldest(self):
        """Keys and sizes, least recently used first (a live view: do not change the ledger while iterating)."""
        return iter(self.entries.items())

    # -- starting again from the folders -----------------------------------------------------------
    def rebuild(self) -> None:
        """Write the journal again from a scan of the cache's folders (oldest first), and read it."""
        found = []
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            if not folder.is_dir() or folder.name.startswith("."):
                continue
            for entry in folder.iterdir():
                key = f"{folder.name}/{entry.name}"
                if self.key_pattern.fullmatch(key):
                    with contextlib.suppress(FileNotFoundError):
                        stat = entry.stat()
                        found.append((stat.st_mtime, key, stat.st_size))
        found.sort()
        sweep(self.root)   # a journal a killed process was writing
        tmp = Path(tmp_name(self.path))
        tmp.write_text("".join([f"{HEADER} {uuid.uuid4().hex}\n"] + [f"+ {key} {size}\n" for _, key, size in found]))
        os.replace(tmp, self.path)
        self._file = None
        self._offset = 0
        self.sync()
