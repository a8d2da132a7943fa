"""A ``torch.save`` file from outside is scanned, bounded, before ``torch.load`` unpickles it.

``torch.load(weights_only=True)`` runs nothing but allowed constructors, yet it still *executes* the
pickle: every opcode allocates (8 MiB of one repeated opcode is millions of objects, ~600 MB and
6 s here; a 72 MB file, ~2 GB). A file-size check does not bound that: the unpickler's allocations
grow with the number of opcodes, not with the bytes they take. So ``check_torch_pickle`` reads the
zip's ``<archive>/data.pkl`` and walks it with ``pickletools.genops``, which parses opcodes without
building any object, and refuses (``UnsafeCheckpoint``, naming the bound) a pickle with

* a ``data.pkl`` entry larger than ``max_pickle_bytes`` (checked from the zip's directory, before a
  byte is read), entries outside one archive folder, duplicate names (ignoring case, as torch does),
  or compressed entries (torch inflates a record whole; torch.save stores them);
* more than ``max_opcodes`` opcodes, a string or bytes argument longer than ``max_string``, more memo
  stores than (or a memo index past) ``max_memo``, a stack deeper than ``max_stack`` or marks nested
  deeper than ``max_marks`` (containers and their nesting), or one that is not well formed.

The default bounds are proportional to the tensors the caller expects (a state dict pickles each
tensor in 35-46 opcodes and ~130 bytes, measured on this project's models and checkpoints):
``OPCODES_PER_TENSOR`` per tensor plus ``OPCODE_SLACK``, and the same for bytes. What passes makes
the unpickler allocate O(opcodes + bytes), so a refusal costs milliseconds and a bounded read.

``load_checked`` is the one way in: the scan, then ``torch.load(weights_only=True)``. A file that is
not a zip (torch.save's pre-1.6 "legacy" format) has its first pickle scanned the same way; torch
unpickles only that one unless it is the legacy magic number, and a legacy file is refused (its
storages are allocated at sizes the pickle declares).
"""

from __future__ import annotations

import io
import os
import pickletools
import zipfile
from dataclasses import dataclass

from .errors import TrainingError


OPCODES_PER_TENSOR = 64         # a tensor in a state dict pickles to 35-46 (key, rebuild call, storage id)
BYTES_PER_TENSOR = 1024         # ~130 bytes each measured; long parameter names take more
OPCODE_SLACK = 4096             # the containers, globals and small records around the tensors
BYTE_SLACK = 64 << 10
MAX_STRING = 64 << 10           # a parameter name, a dtype, a location; raised for checkpoints' records
MAX_STACK = 4096                # pickle batches APPENDS / SETITEMS by 1000 items: 2000 + a little
MAX_MARKS = 64                  # nested containers being built at once
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C   # torch.serialization.MAGIC_NUMBER: the first pickle of a legacy file
_LEGACY_HEAD = 1 << 16          # bytes of a non-zip file read to find its first pickle


class UnsafeCheckpoint(TrainingError, ValueError):
    """A torch.save file whose pickle is larger or deeper than the tensors it should hold need."""


@dataclass(frozen=True)
class PickleSummary:
    """What a scanned pickle holds: its bytes, opcodes, memo stores, deepest stack and longest string."""

    bytes: int
    opcodes: int
    memo: int
    stack: int
    string: int


def bounds_for(tensors: int, *, extra_opcodes: int = 0, extra_bytes: int = 0, max_string: int = MAX_STRING) -> dict:
    """The default bounds for a pickle of `tensors` tensors (plus `extra_*` for other records it holds)."""
    tensors = max(0, int(tensors))
    max_opcodes = OPCODES_PER_TENSOR * tensors + OPCODE_SLACK + int(extra_opcodes)
    return {"max_opcodes": max_opcodes, "max_pickle_bytes": BYTES_PER_TENSOR * tensors + BYTE_SLACK + int(extra_bytes),
            "max_memo": max_opcodes, "max_string": int(max_string), "max_stack": MAX_STACK, "max_marks": MAX_MARKS}


def check_torch_pickle(path, *, tensors: int, extra_opcodes: int = 0, extra_bytes: int = 0, max_opcodes=None,
                       max_pickle_bytes=None, max_memo=None, max_string=MAX_STRING, max_stack=MAX_STACK,
                       max_marks=MAX_MARKS) -> PickleSummary:
    """Refuse `path` (``UnsafeCheckpoint``) unless its pickle fits bounds proportional to `tensors` (see the module).

    Scans ``<archive>/data.pkl`` of a torch.save zip (the only pickle torch.load unpickles in it); of a
    file that is not a zip, its first pickle (see the module). Never executes the pickle.
    """
    path = os.fspath(path)
    limits = bounds_for(tensors, extra_opcodes=extra_opcodes, extra_bytes=extra_bytes, max_string=max_string)
    given = {"max_opcodes": max_opcodes, "max_pickle_bytes": max_pickle_bytes, "max_memo": max_memo,
             "max_stack": max_stack, "max_marks": max_marks}
    limits.update({k: int(v) for k, v in given.items() if v is not None})
    try:
        is_zip = zipfile.is_zipfile(path)
    except OSError as error:
        raise UnsafeCheckpoint(f"{path}: cannot be read: {error}") from None
    if is_zip:
        data, where = _data_pkl(path, limits["max_pickle_bytes"])
    else:
        try:
            with open(path, "rb") as handle:
                data = handle.read(min(_LEGACY_HEAD, limits["max_pickle_bytes"]) + 1)
        except OSError as error:
            raise UnsafeCheckpoint(f"{path}: cannot be read: {error}") from None
        where = f"{path} (not a zip: its first pickle)"
    summary = scan_pickle(data, where, **{k: v for k, v in limits.items() if k != "max_pickle_bytes"},
                          whole=is_zip)
    if not is_zip and _first_value(data) == LEGACY_MAGIC:
        raise UnsafeCheckpoint(f"{path} is in torch.save's legacy (pre-1.6) format, whose storages are allocated "
                               f"at the sizes its pickle declares; save it again with a current torch")
    return summary


def _data_pkl(path: str, max_bytes: int) -> tuple[bytes, str]:
    """The bytes of ``<archive>/data.pkl``, after the zip's directory showed it within `max_bytes`."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            if not entries:
                raise UnsafeCheckpoint(f"{path}: an empty zip, not a torch.save file")
            # torch reads every record under the folder of the first entry (PyTorchStreamReader)
            folder = entries[0].filename.split("/", 1)[0]
            names = [e.filename for e in entries]
            if len({n.lower() for n in names}) != len(names):   # torch's zip reader finds names ignoring case
                raise UnsafeCheckpoint(f"{path}: a zip with duplicate entry names (torch.save writes each once)")
            stray = next((n for n in names if not n.startswith(folder + "/")), None)
            if stray is not None:
                raise UnsafeCheckpoint(f"{path}: entry {stray!r} is outside the archive folder {folder!r}")
            # torch inflates a compressed record whole (a zip bomb); torch.save stores every one as is
            packed = next((e for e in entries if e.compress_type != zipfile.ZIP_STORED
                           or e.file_size != e.compress_size), None)
            if packed is not None:
                raise UnsafeCheckpoint(f"{path}: entry {packed.filename!r} is compressed or declares "
                                       f"{packed.file_size:,} bytes for {packed.compress_size:,} stored "
                                       f"(torch.save stores its records as they are)")
            if sum(e.compress_size for e in entries) > os.path.getsize(path):
                raise UnsafeCheckpoint(f"{path}: its entries declare more bytes than the file holds")
            name = f"{folder}/data.pkl"
            if name not in names:
                raise UnsafeCheckpoint(f"{path}: no {name}, not a torch.save file")
            info = archive.getinfo(name)
            if info.file_size > max_bytes:
                raise UnsafeCheckpoint(f"{path}: {name} is {info.file_size:,} bytes, more than the expected tensors' "
                                       f"pickle needs (max_pickle_bytes={max_bytes:,})")
            with archive.open(info) as handle:
                data = handle.read(max_bytes + 1)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as error:
        raise UnsafeCheckpoint(f"{path}: not a readable torch.save zip ({error})") from None
    if len(data) > max_bytes:
        raise UnsafeCheckpoint(f"{path}: {name} holds more than max_pickle_bytes={max_bytes:,}")
    return data, f"{path}: {name}"


def scan_pickle(data: bytes, where: str, *, max_opcodes: int, max_memo: int, max_string: int, max_stack: int,
                max_marks: int, whole: bool = True) -> PickleSummary:
    """Walk one pickle's opcodes (``pickletools.genops``: parsed, never executed) within the bounds.

    The stack is simulated by count from each opcode's documented stack effect (as ``pickletools.dis``
    does), so container sizes (items since a mark) and nesting are bounded without building anything.
    `whole`: the pickle must end with STOP at the end of `data` (a zip entry); else `data` may go on.
    """
    opcodes = memo = depth = deepest = longest = 0
    marks: list[int] = []
    stop_at = None
    try:
        for opcode, arg, pos in pickletools.genops(io.BytesIO(data)):
            opcodes += 1
            if opcodes > max_opcodes:
                raise UnsafeCheckpoint(f"{where}: more pickle opcodes than max_opcodes={max_opcodes:,}, far more "
                                       f"than the expected tensors need; refused before unpickling")
            if isinstance(arg, (str, bytes, bytearray)) and len(arg) > max_string:
                raise UnsafeCheckpoint(f"{where}: a {len(arg):,}-byte {opcode.name} argument at byte {pos} "
                                       f"(max_string={max_string:,})")
            name = opcode.name
            if name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                memo += 1
                index = memo - 1 if name == "MEMOIZE" else int(arg)
                if memo > max_memo or not 0 <= index < max_memo:
                    raise UnsafeCheckpoint(f"{where}: memo entry {index:,} at byte {pos} (max_memo={max_memo:,})")
            before, after = opcode.stack_before, opcode.stack_after
            if pickletools.markobject in before or (name == "POP" and marks and depth == marks[-1] + 1):
                if not marks:
                    raise UnsafeCheckpoint(f"{where}: {name} at byte {pos} without a mark: not a well-formed pickle")
                depth = marks.pop()                       # the mark and the items above it
                below = before.index(pickletools.markobject) if pickletools.markobject in before else 0
            else:
                below = len(before)
            if depth < below:
                raise UnsafeCheckpoint(f"{where}: {name} at byte {pos} pops an empty stack: not a well-formed pickle")
            depth -= below
            if name == "MARK":
                marks.append(depth)
                if len(marks) > max_marks:
                    raise UnsafeCheckpoint(f"{where}: marks nested {len(marks)} deep at byte {pos} "
                                           f"(max_marks={max_marks})")
            depth += len(after)
            deepest = max(deepest, depth)
            if depth > max_stack:
                raise UnsafeCheckpoint(f"{where}: a pickle stack {depth:,} deep at byte {pos} "
                                       f"(max_stack={max_stack:,})")
            if isinstance(arg, (str, bytes, bytearray)):
                longest = max(longest, len(arg))
            if name == "STOP":
                stop_at = pos + 1
    except UnsafeCheckpoint:
        raise
    except (ValueError, TypeError, OverflowError, EOFError, IndexError) as error:   # genops: a malformed pickle
        raise UnsafeCheckpoint(f"{where}: not a well-formed pickle ({error})") from None
    if stop_at is None:
        raise UnsafeCheckpoint(f"{where}: a pickle without its STOP opcode")
    if whole and stop_at != len(data):
        raise UnsafeCheckpoint(f"{where}: {len(data) - stop_at:,} bytes after the pickle's STOP")
    return PickleSummary(bytes=stop_at, opcodes=opcodes, memo=memo, stack=deepest, string=longest)


def _first_value(data: bytes):
    """The first pickle's value when it is one plain integer (the legacy magic number), else None."""
    ops = []
    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(data)):
            ops.append((opcode.name, arg))
            if len(ops) > 3:
                return None
    except ValueError:
        return None
    values = [arg for name, arg in ops if name not in ("PROTO", "STOP", "FRAME")]
    return values[0] if len(values) == 1 and isinstance(values[0], int) else None


def load_checked(path, *, tensors: int, map_location="cpu", **bounds):
    """``torch.load(path, weights_only=True)`` after ``check_torch_pickle(path, tensors=..., **bounds)`` passed.

    Raises ``UnsafeCheckpoint`` for a refused pickle; what torch.load raises otherwise passes through.
    """
    from pinstorm.extras import require

    torch = require("torch", "torch", "a torch checkpoint")
    check_torch_pickle(path, tensors=tensors, **bounds)
    return torch.load(path, map_location=map_location, weights_only=True)
