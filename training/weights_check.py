"""Weights are only weights: an HDF5 weights file from a board is inspected before Keras reads it.

HDF5 can make a "dataset" read another file (external storage, external links, virtual datasets),
alias paths (soft links) or declare far more data than the file holds (a few MB of gzip chunks
that inflate to 16 GiB). Keras' ``load_weights`` follows all of that and reads each dataset whole
before it compares shapes. ``check_weights_file`` walks the file's structure only (links, object
headers, chunk index; never a data block) and refuses, with ``UnsafeWeights`` naming the dataset
and the limit, anything a weights file written by Keras for *this* model cannot contain:

* a link that is not a plain hard link (soft, external, user-defined), an object that is neither
  a group nor a dataset, more links or datasets than the model's variables (and their optimizer
  slots) explain, groups nested deeper than Keras nests them;
* a dataset stored outside the file (external storage) or assembled from other files (virtual);
* a dataset whose shape is none of the model's variable shapes (scalars aside: optimizer steps
  and metrics), or whose type is not a plain number of at most 8 bytes;
* a chunk larger than ``max_chunk_bytes`` decompressed, a filter other than gzip, shuffle,
  fletcher32 or lzf, or stored bytes (a contiguous block, any compressed chunk) that lie past the
  end of the file.

What passes can make Keras read at most ``8 bytes x the largest variable's elements`` per dataset,
for a bounded number of datasets.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterable

from .errors import TrainingError


MAX_CHUNK_BYTES = 64 << 20      # one decompressed chunk (HDF5 allows up to 4 GiB)
MAX_DEPTH = 16                  # Keras nests layers/<name>/vars; sub-models add a few levels
MAX_ITEMSIZE = 8                # float64 / int64
SLOTS_PER_VARIABLE = 4          # the variable, optimizer slots (Adam: m, v), a spare
FILTERS = {1: "gzip", 2: "shuffle", 3: "fletcher32", 32000: "lzf"}
_CHUNK_OVERHEAD = 1.01          # a chunk that does not compress is stored slightly larger


class UnsafeWeights(TrainingError, ValueError):
    """A weights file holds something other than plain, in-file, model-sized numbers."""


@dataclass(frozen=True)
class WeightsSummary:
    """What a checked file declares: its datasets, their bytes once read, the links walked."""

    datasets: int
    declared_bytes: int
    links: int


def check_weights_file(path, shapes: Iterable[tuple[int, ...]], *,
                       max_chunk_bytes: int = MAX_CHUNK_BYTES) -> WeightsSummary:
    """Refuse ``path`` unless every dataset in it could be one of ``shapes`` (the model's variables)."""
    import h5py

    path = os.fspath(path)
    shapes = [tuple(int(d) for d in shape) for shape in shapes]
    allowed = set(shapes) | {()}
    max_datasets = SLOTS_PER_VARIABLE * len(shapes) + 64
    limits = _Limits(
        path=path, file_size=os.path.getsize(path), allowed=allowed, max_chunk_bytes=int(max_chunk_bytes),
        max_elements=max((math.prod(s) for s in allowed), default=1),
        max_datasets=max_datasets, max_links=4 * max_datasets + 1024)
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise UnsafeWeights(f"{path} is not a readable HDF5 file: {error}") from error
    with handle:
        try:
            return _walk(handle, limits)
        except UnsafeWeights:
            raise
        except (OSError, KeyError, RuntimeError, ValueError, TypeError) as error:   # a damaged structure
            raise UnsafeWeights(f"{path}: its HDF5 structure cannot be inspected: {error}") from error


@dataclass(frozen=True)
class _Limits:
    path: str
    file_size: int
    allowed: set
    max_chunk_bytes: int
    max_elements: int
    max_datasets: int
    max_links: int


def _walk(root, limits: _Limits) -> WeightsSummary:
    """Depth-first over hard links only, each group once (hard links can form cycles)."""
    import h5py

    links = datasets = declared = 0
    seen: set[tuple[int, int]] = set()
    stack = [(root, "", 0)]
    while stack:
        group, where, depth = stack.pop()
        info = h5py.h5o.get_info(group.id)
        if (info.fileno, info.addr) in seen:
            continue
        seen.add((info.fileno, info.addr))
        if depth > MAX_DEPTH:
            raise UnsafeWeights(f"{limits.path}: group {where or '/'} is nested {depth} deep (limit {MAX_DEPTH})")
        links += len(group)                                    # counted before a name is listed
        if links > limits.max_links:
            raise UnsafeWeights(f"{limits.path}: more than {limits.max_links} links (at {where or '/'}); "
                                f"the model's variables explain at most that many")
        for name in group:
            child = f"{where}/{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise UnsafeWeights(f"{limits.path}: {child} is an external link to {link.filename}:{link.path}; "
                                    f"weights must be stored in the file itself")
            if isinstance(link, h5py.SoftLink):
                raise UnsafeWeights(f"{limits.path}: {child} is a soft link to {link.path}; "
                                    f"weights files hold plain groups and datasets only")
            if not isinstance(link, h5py.HardLink):
                raise UnsafeWeights(f"{limits.path}: {child} is a {type(link).__name__}, not a plain (hard) link")
            item = group[name]
            if isinstance(item, h5py.Group):
                stack.append((item, child, depth + 1))
            elif isinstance(item, h5py.Dataset):
                datasets += 1
                if datasets > limits.max_datasets:
                    raise UnsafeWeights(f"{limits.path}: more than {limits.max_datasets} datasets (at {child}); "
                                        f"the model has {len(limits.allowed)} variable shapes")
                declared += _check_dataset(item, child, limits)
            else:
                raise UnsafeWeights(f"{limits.path}: {child} is a {type(item).__name__}, "
                                    f"not a group or a dataset")
    return WeightsSummary(datasets=datasets, declared_bytes=declared, links=links)


def _check_dataset(dataset, where: str, limits: _Limits) -> int:
    """The bytes ``dataset`` would take once read; refuses it unless it is a plain in-file array."""
    import h5py

    plist = dataset.id.get_create_plist()
    layout = plist.get_layout()
    if layout == h5py.h5d.VIRTUAL:
        sources = sorted({plist.get_virtual_filename(i) for i in range(min(plist.get_virtual_count(), 8))})
        raise UnsafeWeights(f"{limits.path}: dataset {where} is a virtual dataset (built from {sources}); "
                            f"weights must be stored in the file itself")
    if plist.get_external_count():
        external = plist.get_external(0)[0].decode(errors="replace")
        raise UnsafeWeights(f"{limits.path}: dataset {where} keeps its data in the external file {external}; "
                            f"weights must be stored in the file itself")
    dtype = dataset.dtype
    if dtype.kind not in "fiub" or dtype.itemsize > MAX_ITEMSIZE or dtype.fields or dtype.subdtype:
        raise UnsafeWeights(f"{limits.path}: dataset {where} has type {dtype}, not a plain number "
                            f"of at most {MAX_ITEMSIZE} bytes")
    shape = dataset.shape
    if shape is None:
        raise UnsafeWeights(f"{limits.path}: dataset {where} has no dataspace")
    nbytes = math.prod(shape) * dtype.itemsize
    if shape not in limits.allowed:
        raise UnsafeWeights(f"{limits.path}: dataset {where} declares shape {shape} ({nbytes:,} bytes); none of the "
                            f"model's variables has that shape (the largest holds {limits.max_elements:,} values)")
    if layout == h5py.h5d.CHUNKED:
        _check_chunks(dataset, plist, where, limits)
    elif layout == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        stored = dataset.id.get_storage_size()
        if offset is not None and offset + stored > limits.file_size:
            raise UnsafeWeights(f"{limits.path}: dataset {where} claims bytes {offset:,}-{offset + stored:,} of a "
                                f"{limits.file_size:,}-byte file")
    elif layout != h5py.h5d.COMPACT:
        raise UnsafeWeights(f"{limits.path}: dataset {where} has an unknown storage layout {layout}")
    return nbytes


def _check_chunks(dataset, plist, where: str, limits: _Limits) -> None:
    chunk = plist.get_chunk()
    chunk_bytes = math.prod(chunk) * dataset.dtype.itemsize
    if chunk_bytes > limits.max_chunk_bytes:
        raise UnsafeWeights(f"{limits.path}: dataset {where} has chunks of {chunk} = {chunk_bytes:,} bytes "
                            f"decompressed (limit {limits.max_chunk_bytes:,})")
    for index in range(plist.get_nfilters()):
        code = plist.get_filter(index)[0]
        if code not in FILTERS:
            raise UnsafeWeights(f"{limits.path}: dataset {where} uses HDF5 filter {code}; "
                                f"allowed: {', '.join(FILTERS.values())}")
    expected = math.prod(-(-s // c) for s, c in zip(dataset.shape, chunk)) if dataset.shape else 1
    count = dataset.id.get_num_chunks()
    if count > expected:
        raise UnsafeWeights(f"{limits.path}: dataset {where} indexes {count:,} chunks; its shape "
                            f"{dataset.shape} in chunks of {chunk} has {expected:,}")
    largest = int(chunk_bytes * _CHUNK_OVERHEAD) + 1024

    def check(info):
        if info.size > largest or info.byte_offset + info.size > limits.file_size:
            raise UnsafeWeights(f"{limits.path}: dataset {where} chunk at {info.chunk_offset} claims "
                                f"{info.size:,} bytes at offset {info.byte_offset:,} of a {limits.file_size:,}-byte "
                                f"file (a chunk holds at most {largest:,})")

    if count:
        dataset.id.chunk_iter(check)
