"""Counted, verified epochs of a converted dataset's row groups, for any reader (TF-free, torch-free).

What every reader of pinstorm shares, whatever it decodes with (tf.data in `reader`, PyTorch in
`torch_loader`): which row groups a shard takes (petastorm's rule), the order an epoch reads them in
(seeded per epoch), and `EpochSource`, which reads them verified (`pipeline.verify`), refuses stored
values that are not JPEGs, and counts every epoch against the metadata (`IncompleteEpochError`).

`EpochSource(epoch, split=(i, n))` reads only the i-th of n disjoint slices of that epoch's row-group
order: what one PyTorch DataLoader worker process reads; the n slices together are the epoch.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Mapping

import numpy as np

from .contracts import DatasetInfo
from .errors import InvalidPipelineInput, PipelineError
from .images import UndecodableImage
from .metadata import check_petastorm_metadata, petastorm_guard, read_info
from .options import ReaderOptionError, ReaderOptions
from .storage import Location, locate, locate_stream, petastorm_filesystem
from .verify import (CHECKSUMMED, CorruptPartError, OpenParts, check_parts, open_part, read_row_group, rows_digest,
                     verified)
from pinstorm.boards.safety import secrets

# The reader's logger: its messages predate this module, and users filter on that name.
log = secrets.logger("pinstorm.pipeline.reader")


class IncompleteEpochError(PipelineError, RuntimeError):
    """An epoch that delivered a different number of rows than the dataset (or shard) holds."""


def shard_row_groups(info: DatasetInfo | Mapping, shard) -> list[int]:
    """Global row-group indexes of one shard: index % count == shard index (petastorm's rule).

    Every reader, and training's step count for each rank, cuts an epoch with this one rule.

    Args:
        info: The dataset's info (`read_info` or `dataset_info`).
        shard: ``(index, count)``, or None for every row group.

    Returns:
        The row-group indexes of the shard, in order.

    Raises:
        InvalidPipelineInput: A malformed shard, or more shards than row groups.
    """
    info = DatasetInfo.from_dict(info)   # a plain dict too (as returned before DatasetInfo)
    groups = info.row_groups
    if shard is None:
        return list(range(groups))
    try:
        index, count = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise InvalidPipelineInput(f"shard must be (index, count), got {shard!r}") from None
    if count < 1 or not 0 <= index < count:
        raise InvalidPipelineInput(f"shard index must be in [0, {count}), got {shard!r}")
    if count > groups:
        raise InvalidPipelineInput(f"{info.url or 'dataset'} has {groups} row groups, fewer than {count} "
                                   "shards: some workers would get no data; convert with more partitions or a "
                                   "smaller row_group_size_mb")
    return [g for g in range(groups) if g % count == index]


def epoch_seed(base: int, epoch: int) -> int:
    """The seed of one epoch (row-group order, augmentation), from the reader's base seed."""
    return (base * 1_000_003 + epoch * 7919 + 17) % (2**31 - 1)


def epoch_order(groups: list[int], seed: int | None, shuffle: bool, split=None) -> list[int]:
    """The row groups one epoch reads, in order: `groups` seeded-shuffled (or as stored), then the
    `split` = (i, n) slice of them (every n-th from the i-th), or all."""
    order = list(groups)
    if shuffle and seed is not None:
        random.Random(seed).shuffle(order)
    if split is not None:
        index, count = split
        order = order[index::count]
    return order


def check_arguments(batch_size, image_size, arguments) -> tuple[tuple[int, int], ReaderOptions]:
    """What every reader takes, checked: (image_size as (height, width), the `ReaderOptions` among a
    reader's `arguments`, its `locals()`)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ReaderOptionError(f"batch_size must be a positive integer, got {batch_size!r}")
    try:
        image_size = (int(image_size),) * 2 if isinstance(image_size, (int, np.integer)) \
            else tuple(map(int, image_size))
    except (TypeError, ValueError):
        image_size = ()
    if len(image_size) != 2 or min(image_size) < 1:
        raise ReaderOptionError(f"image_size must be a size or (height, width), got {image_size!r}")
    return image_size, ReaderOptions.pick(arguments)


def open_epochs(url, shard, *, shuffle: bool, seed: int | None, engine: str = "pyarrow", retries: int = 2,
                workers: int = 0, storage_options: dict | None = None, verify: bool = True, stream: bool = False,
                cache_limit: int | None = None) -> "EpochSource":
    """The `EpochSource` of one shard of the dataset at `url`, after every part of it was found with its
    recorded size (a missing part fails here, not mid-epoch). `verify=False` forgets the checksums.
    `stream`: a remote dataset's parts are read from the machine's bounded part cache (`part_cache`)."""
    if stream and engine != "pyarrow":
        raise ReaderOptionError("stream=True needs engine='pyarrow' (petastorm reads parts itself)")
    location = locate_stream(url, storage_options) if stream else locate(url, storage_options)
    info = read_info(location)
    if engine == "petastorm":
        check_petastorm_metadata(location, info)   # before petastorm could unpickle anything
    info = info.with_changes(url=location.url)
    groups = shard_row_groups(info, shard)
    if not verify:
        unchecked = ("footer_xxh3", "row_group_xxh3", "row_group_bytes_xxh3")
        info = info.with_changes(files={name: {k: v for k, v in entry.items() if k not in unchecked}
                                        for name, entry in info.files.items()})
    elif not verified(info):
        log.warning("%s: written by an older pinstorm, without checksums; convert it again to have its parts "
                    "verified", location.url)
    shard = None if shard is None else (int(shard[0]), int(shard[1]))
    base_seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    source = EpochSource(location, info, shard, groups, shuffle=shuffle, base_seed=base_seed, engine=engine,
                         retries=retries, workers=workers)
    if stream and not location.is_local:   # a local dataset is read in place: nothing to cache
        from .part_cache import PartCache
        source.parts = PartCache(location, info, limit=cache_limit, retries=retries)
    check_parts(location, info, source.part_names())
    return source


def default_shuffle_buffer(info: DatasetInfo, rows: int, groups: int, share: int = 1) -> int:
    """Rows in a shuffle buffer over `rows` rows in `groups` row groups: ~4 row groups, at least 1024
    rows, at most ~256 MB of JPEGs (divided by `share` when that many buffers are held at once)."""
    mean_rows = max(1, rows // max(1, groups))
    mean_bytes = max(1, info.bytes // max(1, info.rows))
    return max(1, min(rows, max(1024, 4 * mean_rows), max(256, 2**28 // mean_bytes // max(1, share))))


def quiet_petastorm() -> None:
    """petastorm 0.13 on pyarrow 14 warns on every row group about pyarrow's legacy dataset API, and
    asks for make_reader because the dataset carries a Unischema; neither is news to us."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")
    warnings.filterwarnings("ignore", message="Please use make_reader", module=r"petastorm(\.|$)")


class EpochSource:
    """Yields one epoch of (jpeg bytes, labels) batches, one row group at a time, and counts them."""

    def __init__(self, location, info, shard, groups, *, shuffle, base_seed, engine, retries, workers):
        self.location, self.info, self.shard, self.groups = location, info, shard, groups
        self.expected = sum(info.row_group_rows[g] for g in groups)
        self.shuffle, self.base_seed, self.engine = shuffle, base_seed, engine
        self.retries, self.workers = retries, workers
        self.where = self.location.url   # the part and row group whose rows were yielded last (pyarrow engine)
        self.parts = None   # a `part_cache.PartCache` when streaming: parts are read from local copies
        # Pixels an image may have by its frame header (None: unchecked): set by readers that decode whole or
        # windowed images without a bound of their own (`make_dataset`); `make_torch_loader` bounds its decodes.
        self.max_pixels: int | None = None

    def in_this_process(self) -> None:
        """After a fork (a DataLoader worker): the location's filesystem made again where it must be."""
        location = self.location.in_this_process()
        if location is not self.location:
            self.location = location
            if self.parts is not None:
                self.parts.location = location

    def part_names(self, groups=None) -> list[str]:
        names = sorted(self.info.files)
        where = [name for name in names for _ in range(self.info.files[name]["row_groups"])]
        return sorted({where[g] for g in (self.groups if groups is None else groups)})

    def __call__(self, epoch, split=None):
        epoch = int(epoch)
        if split is not None and self.engine != "pyarrow":
            raise InvalidPipelineInput("only the pyarrow engine reads an epoch in splits")
        seed = epoch_seed(self.base_seed, epoch)
        order = epoch_order(self.groups, seed, self.shuffle, split) if split is not None else None
        expected = self.expected if order is None else sum(self.info.row_group_rows[g] for g in order)
        check_parts(self.location, self.info, self.part_names(order))   # a missing part: before the first row
        for attempt in range(self.retries + 1):
            delivered = 0
            for images, labels in self._batches(seed, order):
                delivered += len(labels)
                yield images, labels
            if delivered == expected:
                return
            where = f"{self.location.url}" + (f" shard {self.shard[0]}/{self.shard[1]}" if self.shard else "")
            if split is not None:
                where += f" split {split[0]}/{split[1]}"
            if delivered == 0 and attempt < self.retries:
                log.warning("%s: epoch %d came back empty; reading it again", where, epoch)
                continue
            raise IncompleteEpochError(f"{where}: epoch {epoch} delivered {delivered} rows, expected "
                                       f"{expected}; the dataset changed after conversion or the reader failed")

    def row_groups(self, order):
        """(global row-group index, (images, labels)) for each row group of `order`, in that order, verified
        and checked as an epoch's are (pyarrow engine), not counted: for readers that plan their own rows
        (`torch_loader` resumes mid-epoch and counts what it planned)."""
        order = list(order)
        check_parts(self.location, self.info, self.part_names(order))
        yield from zip(order, self._arrow_batches(None, order))

    def _batches(self, seed, order=None):
        if self.engine == "pyarrow":
            yield from self._arrow_batches(seed, order)
        else:
            yield from self._petastorm_batches(seed)

    def _petastorm_batches(self, seed):
        from petastorm import make_batch_reader

        sharded = self.shard is not None and self.shard[1] > 1
        expected = None
        if verified(self.info):
            names = sorted(self.info.files)
            digests = [d for name in names for d in self.info.files[name]["row_group_xxh3"]]
            expected = {digests[g] for g in self.groups}
        check_petastorm_metadata(self.location, self.info)
        self._bound_row_groups()
        quiet_petastorm()
        with petastorm_guard(self.location.url):
            reader = make_batch_reader(
                self.location.url, schema_fields=["image", "label"], num_epochs=1,
                # reader_workers=0: the "dummy" pool reads in the generator's thread; stored order is kept and
                # the thread pool's short and empty epochs were never seen with it.
                reader_pool_type="dummy" if self.workers == 0 else "thread", workers_count=max(1, self.workers),
                shuffle_row_groups=self.shuffle, seed=seed,
                cur_shard=self.shard[0] if sharded else None, shard_count=self.shard[1] if sharded else None,
                filesystem=petastorm_filesystem(self.location))
        try:
            for batch in reader:
                images = np.asarray(batch.image, dtype=object)
                labels = np.asarray(batch.label, dtype=np.int32)
                if expected is not None and rows_digest(images, labels) not in expected:
                    self._name_corruption()
                check_jpegs(images, self.location, self.info, None, None, deep=expected is None,
                            max_pixels=self.max_pixels)
                yield images, labels
        finally:
            reader.stop()
            reader.join()

    def _bound_row_groups(self):
        """Every row group petastorm will read fits the memory budget (footer, page headers and
        dictionaries; nothing expanded), checked before petastorm decodes any of them."""
        names = sorted(self.info.files)
        where = [(name, rg) for name in names for rg in range(self.info.files[name]["row_groups"])]
        by_part = {}
        for g in self.groups:
            by_part.setdefault(where[g][0], []).append(where[g][1])
        for name, groups in by_part.items():
            handle = open_part(self.location, self.info, name)
            try:
                for rg in groups:
                    handle.check_row_group(rg, ["image", "label"])
            finally:
                handle.close()

    def _name_corruption(self):
        """A petastorm batch matched no recorded checksum: find the part and row group with pyarrow."""
        for _ in self._arrow_batches(None):
            pass
        raise CorruptPartError(f"{self.location.url}: a row group read by petastorm matches no recorded checksum "
                               "(but pyarrow reads every row group intact: did petastorm split a row group?)")

    def _arrow_batches(self, seed, order=None):
        names = sorted(self.info.files)
        where = [(name, rg) for name in names for rg in range(self.info.files[name]["row_groups"])]
        if order is None:
            order = epoch_order(self.groups, seed, self.shuffle)
        if self.parts is not None:
            yield from self._streamed_batches([where[g] for g in order])
            return
        opened = OpenParts(lambda name: open_part(self.location, self.info, name, CHECKSUMMED))
        try:
            for name, rg in (where[g] for g in order):
                yield from self._read_groups(opened.get(name), name, [rg])
        finally:
            opened.close()

    def _streamed_batches(self, planned):
        """`_arrow_batches` over the part cache: the plan's steps (`PartCache.pieces`: a run of row groups of a
        part cached whole, or one row group of a part cached by row group), each held from its fetch (ahead
        of this reader) until it is read, then let go (evictable)."""
        steps = self.parts.pieces(planned)
        opened = OpenParts(self.parts.open_pieces)   # parts cached by row group, kept open across their steps
        try:
            with self.parts.stream(step.name for step in steps) as stream:
                for step in steps:
                    local_path = stream.next()
                    assert local_path == self.parts.path(step.name)
                    if step.whole:
                        local = CachedLocation(local_path.parent, self.location.url)
                        handle = open_part(local, self.info, step.part, CHECKSUMMED)
                        try:
                            yield from self._read_groups(handle, step.part, step.row_groups)
                        finally:
                            handle.close()
                        continue
                    handle = opened.get(step.part)
                    handle.source.add_file(*self.parts.span(step.name), local_path)
                    try:
                        yield from self._read_groups(handle, step.part, step.row_groups)
                    finally:
                        handle.source.let_go()   # an evicted piece's bytes leave the disk when its file closes
        finally:
            opened.close()

    def _read_groups(self, handle, name, groups):
        """(JPEGs, labels) of row groups `groups` of the open part `name`, each checked before it is handed over."""
        for rg in groups:
            table = read_row_group(handle, self.location, self.info, name, rg)
            images = table.column("image").to_numpy(zero_copy_only=False)
            check_jpegs(images, self.location, self.info, name, rg, handle,
                        deep="row_group_xxh3" not in self.info.files[name], max_pixels=self.max_pixels)
            self.where = f"{self.location.url}/{name} row group {rg}"
            yield images, table.column("label").to_numpy().astype(np.int32)


class CachedLocation(Location):
    """A part cache's local folder, named in errors by the dataset's own URL."""

    def __init__(self, folder, url: str):
        import fsspec
        super().__init__(fsspec.filesystem("file"), str(folder), url, {})

    @property
    def is_local(self) -> bool:
        return True


def jpeg_problem(data) -> str | None:
    """Why `data` cannot be a whole JPEG (no SOI, a broken header, no EOI after the scan), or None.

    Walks the marker segments to the first scan (a few jumps), then looks for the end-of-image marker
    after it: what libjpeg, and so ``tf.io.decode_jpeg``, fails on ("Invalid JPEG data") is mostly a
    file cut short. ~15 us for an ImageNet-size JPEG.
    """
    data = bytes(data)
    if data[:3] != b"\xff\xd8\xff":
        return f"not a JPEG (first bytes: {data[:16]!r})"
    at, size = 2, len(data)
    while at + 4 <= size:
        if data[at] != 0xFF:
            return f"broken JPEG header at byte {at}"
        marker = data[at + 1]
        if marker == 0xFF:            # fill byte
            at += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:
            at += 2
        elif marker == 0xDA:          # start of scan: the entropy-coded data follows
            scan = at + 2 + int.from_bytes(data[at + 2:at + 4], "big")
            return None if data.rfind(b"\xff\xd9", scan) != -1 else "truncated JPEG (no end-of-image marker)"
        else:
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return "truncated JPEG header"


# Start-of-frame markers (SOF0-3, 5-7, 9-11, 13-15): the segment that records the image's height and width.
_FRAME_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_size(data) -> tuple[int, int] | None:
    """``(height, width)`` from a JPEG's frame header, or None where none comes before the scan: a few jumps
    over the marker segments, ~1-2 us an image, so a decoder's memory can be bounded before it runs. Bytes
    between segments are skipped to the next 0xFF, as libjpeg skips them (with a warning), so that they cannot
    hide a frame header libjpeg would read."""
    at, size = 2, len(data)
    while at + 9 <= size:
        if data[at] != 0xFF:
            at = data.find(b"\xff", at)
            if at < 0:
                return None
            continue
        marker = data[at + 1]
        if marker == 0xFF:            # fill byte
            at += 1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD8:
            at += 2
        elif marker in _FRAME_MARKERS:
            return int.from_bytes(data[at + 5:at + 7], "big"), int.from_bytes(data[at + 7:at + 9], "big")
        elif marker == 0xDA:
            return None
        else:
            at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return None


def too_large(data, max_pixels: int) -> str | None:
    """Why `data` must not be decoded under `max_pixels` (its frame header's pixels over it), or None."""
    dims = jpeg_size(data)
    if dims is None:   # libjpeg would fail on it too: named here rather than by its bare message
        return "a JPEG without a frame header before its scan"
    if dims[0] * dims[1] <= max_pixels:
        return None
    height, width = dims
    return (f"too large to decode: {width}x{height} = {width * height / 1e6:.1f} MP, over max_pixels "
            f"{max_pixels / 1e6:.1f} MP")


def check_jpegs(images, location, info, name, rg, handle=None, *, deep=False, max_pixels: int | None = None) -> None:
    """Every stored value starts like a JPEG (and, `deep`, is a whole one; `max_pixels`, is at most that many
    pixels by its frame header); else name part, row group and original file name.

    Row groups with checksums hold exactly the bytes `convert` decoded completely, so for them only
    the first bytes are looked at; row groups without (older datasets, foreign ones) get the `deep`
    check, so a cut-off JPEG is named here rather than by libjpeg's bare "Invalid JPEG data". A checksum
    says nothing of an image's size (a foreign writer chose the bytes): `max_pixels` is checked either way.
    """
    if deep:
        problems = [(i, p) for i, p in enumerate(map(jpeg_problem, images)) if p]
    else:
        problems = [(i, f"not a JPEG (first bytes: {bytes(image[:16])!r})") for i, image in enumerate(images)
                    if bytes(image[:3]) != b"\xff\xd8\xff"]
    error = CorruptPartError
    if not problems and max_pixels:
        problems = [(i, p) for i, p in enumerate(too_large(image, max_pixels) for image in images) if p]
        error = UndecodableImage
    if not problems:
        return
    row, problem = problems[0]
    filename = "?"
    if handle is not None:
        try:
            filename = handle.read_row_group(rg, columns=["filename"]).column("filename")[row].as_py()
        except Exception:
            pass
    where = f"{location.url}/{name} row group {rg}" if name else f"{location.url} (petastorm engine)"
    raise error(f"{where}: row {row} ({filename}) is {problem}; {len(problems)} such row(s) in this row group")
