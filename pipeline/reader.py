"""`make_dataset`: a converted dataset as a ``tf.data.Dataset`` of (images, labels), sharded, exact epochs.

Row groups are read as batches of JPEG bytes; decoding, cropping, resizing and flipping happen inside
tf.data with parallel calls, where the GIL does not serialise them. petastorm's row-wise
``make_reader`` -> ``make_petastorm_dataset`` path decodes with OpenCV per row and ran at 0.33x of
this on the same 2 cores (bench/results/pipeline.json).

Two engines read the row groups; both take the same row groups for a shard (petastorm's rule:
global row-group index % shard count) and both are counted the same way:

* ``"pyarrow"`` (default): pyarrow reads the shard's row groups itself, in a seeded order.
  0.95x of the decode-only limit in the benchmark, against 0.84x for petastorm.
* ``"petastorm"``: petastorm's ``make_batch_reader``. Its thread pool was seen to end epochs early
  (after one ventilation window of 4 row groups, 10 of 25 runs under TensorFlow), so it runs with
  the "dummy" pool (no such failure in 40 runs), which idles 100 ms at each epoch start; and
  petastorm 0.13.1 cannot open s3:// or gs:// on pyarrow 14 without the adapter in `storage`.

Epochs are counted, not trusted: each epoch is read by a fresh reader and its rows are counted
against the dataset's metadata (or the shard's share of it). A reader that yields nothing is
retried; one that stops short or runs over raises `IncompleteEpochError`.

Parts are verified (`pipeline.verify`): `make_dataset` and then every epoch, before its first row,
check that the shard's parts all exist with their recorded sizes (`MissingPartError`); each part's
footer checksum is checked when it is opened and each row group's content checksum before its rows
are handed on (`CorruptPartError`, naming part and row group). The petastorm engine reads row groups
itself, so each batch it returns must match one of the shard's row-group checksums; on a mismatch
the shard is re-read with pyarrow to name the part and row group. A stored value that is not a JPEG
at all is refused naming its part, row group and original file name.

No code from the dataset runs, and no row group is decoded past the memory budget
(`PINSTORM_MAX_ROW_GROUP_BYTES`): the pyarrow engine reads parts through
`boards.parquet_limits.BoundedParquetFile`; the petastorm engine is used only when
``_common_metadata``'s pickled Unischema is byte-for-byte pinstorm's own (`UntrustedSchemaError`
otherwise, at `make_dataset`), petastorm's unpickler is guarded while it opens the dataset, and
every row group of the shard is bounded the same way before petastorm is handed the dataset.
TensorFlow is imported inside the functions, so ``import pipeline`` stays light.
"""

from __future__ import annotations

import logging
import random
import warnings

import numpy as np

from .metadata import check_petastorm_metadata, petastorm_guard, read_info
from .storage import locate, petastorm_filesystem
from .verify import (CorruptPartError, check_parts, open_part, read_row_group, rows_digest, verified)
from pinstorm.errors import PinstormError

log = logging.getLogger(__name__)

ENGINES = ("petastorm", "pyarrow")
_AHEAD = 512   # encoded rows queued ahead of the decoders (~55 MB of ImageNet JPEGs)


class IncompleteEpochError(PinstormError, RuntimeError):
    """An epoch that delivered a different number of rows than the dataset (or shard) holds."""


def shard_row_groups(info: dict, shard) -> list[int]:
    """Global row-group indexes of one shard: index % count == shard index (petastorm's rule)."""
    groups = info["row_groups"]
    if shard is None:
        return list(range(groups))
    try:
        index, count = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ValueError(f"shard must be (index, count), got {shard!r}") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard index must be in [0, {count}), got {shard!r}")
    if count > groups:
        raise ValueError(f"{info.get('url', 'dataset')} has {groups} row groups, fewer than {count} shards: some "
                         f"workers would get no data; convert with more partitions or a smaller row_group_size_mb")
    return [g for g in range(groups) if g % count == index]


def _quiet_petastorm() -> None:
    """petastorm 0.13 on pyarrow 14 warns on every row group about pyarrow's legacy dataset API, and
    asks for make_reader because the dataset carries a Unischema; neither is news to us."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"petastorm(\.|$)")
    warnings.filterwarnings("ignore", message="Please use make_reader", module=r"petastorm(\.|$)")


def _epoch_seed(base: int, epoch: int) -> int:
    return (base * 1_000_003 + epoch * 7919 + 17) % (2**31 - 1)


class _EpochSource:
    """Yields one epoch of (jpeg bytes, labels) batches, one row group at a time, and counts them."""

    def __init__(self, location, info, shard, groups, *, shuffle, base_seed, engine, retries, workers):
        self.location, self.info, self.shard, self.groups = location, info, shard, groups
        self.expected = sum(info["row_group_rows"][g] for g in groups)
        self.shuffle, self.base_seed, self.engine = shuffle, base_seed, engine
        self.retries, self.workers = retries, workers

    def part_names(self) -> list[str]:
        names = sorted(self.info["files"])
        where = [name for name in names for _ in range(self.info["files"][name]["row_groups"])]
        return sorted({where[g] for g in self.groups})

    def __call__(self, epoch):
        epoch = int(epoch)
        check_parts(self.location, self.info, self.part_names())   # a missing part: before the first row
        for attempt in range(self.retries + 1):
            delivered = 0
            for images, labels in self._batches(epoch):
                delivered += len(labels)
                yield images, labels
            if delivered == self.expected:
                return
            where = f"{self.location.url}" + (f" shard {self.shard[0]}/{self.shard[1]}" if self.shard else "")
            if delivered == 0 and attempt < self.retries:
                log.warning("%s: epoch %d came back empty; reading it again", where, epoch)
                continue
            raise IncompleteEpochError(f"{where}: epoch {epoch} delivered {delivered} rows, expected "
                                       f"{self.expected}; the dataset changed after conversion or the reader failed")

    def _batches(self, epoch):
        seed = _epoch_seed(self.base_seed, epoch)
        if self.engine == "pyarrow":
            yield from self._arrow_batches(seed)
        else:
            yield from self._petastorm_batches(seed)

    def _petastorm_batches(self, seed):
        from petastorm import make_batch_reader

        sharded = self.shard is not None and self.shard[1] > 1
        expected = None
        if verified(self.info):
            names = sorted(self.info["files"])
            digests = [d for name in names for d in self.info["files"][name]["row_group_xxh3"]]
            expected = {digests[g] for g in self.groups}
        check_petastorm_metadata(self.location, self.info)
        self._bound_row_groups()
        _quiet_petastorm()
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
                _check_jpegs(images, self.location, self.info, None, None, deep=expected is None)
                yield images, labels
        finally:
            reader.stop()
            reader.join()

    def _bound_row_groups(self):
        """Every row group petastorm will read fits the memory budget (footer, page headers and
        dictionaries; nothing expanded), checked before petastorm decodes any of them."""
        names = sorted(self.info["files"])
        where = [(name, rg) for name in names for rg in range(self.info["files"][name]["row_groups"])]
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

    def _arrow_batches(self, seed):
        names = sorted(self.info["files"])
        where = [(name, rg) for name in names for rg in range(self.info["files"][name]["row_groups"])]
        order = [where[g] for g in self.groups]
        if self.shuffle and seed is not None:
            random.Random(seed).shuffle(order)
        files = {}
        try:
            for name, rg in order:
                if name not in files:
                    files[name] = open_part(self.location, self.info, name)
                table = read_row_group(files[name], self.location, self.info, name, rg)
                images = table.column("image").to_numpy(zero_copy_only=False)
                _check_jpegs(images, self.location, self.info, name, rg, files[name],
                             deep="row_group_xxh3" not in self.info["files"][name])
                yield images, table.column("label").to_numpy().astype(np.int32)
        finally:
            for handle in files.values():
                handle.close()


def _jpeg_problem(data) -> str | None:
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


def _check_jpegs(images, location, info, name, rg, handle=None, *, deep=False) -> None:
    """Every stored value starts like a JPEG (and, `deep`, is a whole one); else name part, row group
    and original file name.

    Row groups with checksums hold exactly the bytes `convert` decoded completely, so for them only
    the first bytes are looked at; row groups without (older datasets, foreign ones) get the `deep`
    check, so a cut-off JPEG is named here rather than by libjpeg's bare "Invalid JPEG data".
    """
    if deep:
        problems = [(i, p) for i, p in enumerate(map(_jpeg_problem, images)) if p]
    else:
        problems = [(i, f"not a JPEG (first bytes: {bytes(image[:16])!r})") for i, image in enumerate(images)
                    if bytes(image[:3]) != b"\xff\xd8\xff"]
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
    raise CorruptPartError(f"{where}: row {row} ({filename}) is {problem}; {len(problems)} such row(s) in this "
                           "row group")


DCT_RATIOS = (1, 2, 4, 8)


def _decode_crop(tf, jpeg, shape, window, target, dct_scale):
    """Decode only `window` (y, x, h, w) of `jpeg`, at the smallest DCT scale (1/2, 1/4, 1/8) that still
    leaves the window at least `target` (height, width) pixels: libjpeg then skips most of the IDCT
    and colour work. The crop window of a scaled decode is in scaled pixels (jpeg_mem.cc), so it is
    scaled down too, and clipped to the scaled image (ceil(side / ratio))."""
    if not dct_scale:
        return tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
    fit = tf.minimum(window[2] // target[0], window[3] // target[1])
    index = tf.reduce_sum(tf.cast(fit >= tf.constant(DCT_RATIOS[1:], tf.int32), tf.int32))

    def branch(ratio):
        def decode():
            if ratio == 1:
                return tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
            y, x = window[0] // ratio, window[1] // ratio
            h = tf.minimum(tf.maximum(1, window[2] // ratio), (shape[0] + ratio - 1) // ratio - y)
            w = tf.minimum(tf.maximum(1, window[3] // ratio), (shape[1] + ratio - 1) // ratio - x)
            return tf.image.decode_and_crop_jpeg(jpeg, tf.stack([y, x, h, w]), channels=3, ratio=ratio)
        return decode

    return tf.switch_case(index, [branch(r) for r in DCT_RATIOS])


def _preprocess_fns(tf, image_size, training, crop_area, flip, eval_crop, dct_scale=True):
    height, width = image_size
    full_box = tf.constant([[[0.0, 0.0, 1.0, 1.0]]])

    def train_fn(jpeg, label, seed):
        shape = tf.io.extract_jpeg_shape(jpeg)
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=full_box, seed=seed, min_object_covered=crop_area[0],
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=crop_area, max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = _decode_crop(tf, jpeg, shape, window, (height, width), dct_scale)
        image = tf.image.resize(image, (height, width))
        if flip:
            image = tf.image.stateless_random_flip_left_right(image, seed=tf.reverse(seed, [0]))
        return tf.clip_by_value(image / 255.0, 0.0, 1.0), label

    def eval_fn(jpeg, label, seed=None):
        shape = tf.io.extract_jpeg_shape(jpeg)
        h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
        aspect = width / height
        crop_h = tf.minimum(h, w / aspect) * eval_crop
        crop_w = crop_h * aspect
        crop_h = tf.maximum(1, tf.cast(tf.round(crop_h), tf.int32))
        crop_w = tf.maximum(1, tf.cast(tf.round(crop_w), tf.int32))
        window = tf.stack([(shape[0] - crop_h) // 2, (shape[1] - crop_w) // 2, crop_h, crop_w])
        image = _decode_crop(tf, jpeg, shape, window, (height, width), dct_scale)
        image = tf.image.resize(image, (height, width))
        return tf.clip_by_value(image / 255.0, 0.0, 1.0), label

    return train_fn if training else eval_fn


def preprocess_fn(image_size=(224, 224), *, training=True, crop_area=(0.25, 1.0), flip=True, eval_crop=0.875,
                  dct_scale=True):
    """The per-image function `make_dataset` maps: (jpeg string, label, seed[2]) -> (float32 image, label).

    Exposed so benchmarks can run the very same work over bytes held in memory.
    """
    import tensorflow as tf

    return _preprocess_fns(tf, tuple(image_size), training, tuple(crop_area), flip, eval_crop, dct_scale)


def make_dataset(url, *, batch_size: int, image_size=(224, 224), training: bool = True, shard=None,
                 num_epochs: int | None = 1, shuffle: bool = True, seed: int | None = None,
                 parallel: int | None = None, drop_remainder: bool = False, shuffle_buffer: int | None = None,
                 crop_area=(0.25, 1.0), flip: bool = True, eval_crop: float = 0.875, engine: str = "pyarrow",
                 reader_workers: int = 0, prefetch_rows: int | None = None, retries: int = 2,
                 storage_options: dict | None = None, verify: bool = True, dct_scale: bool = True):
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches from a converted dataset.

    images: float32 ``[B, H, W, 3]`` with values in [0, 1]; labels: int32 ``[B]`` class indexes
    (see `dataset_info(url)["classes"]`). The last batch of an epoch may be smaller unless
    `drop_remainder=True` (use it when a strategy needs static batch shapes).

    * `training=True`: random crop (area in `crop_area` of the image, aspect 3/4..4/3) resized to
      `image_size`, random left-right flip (`flip`). `training=False`: a centre crop of
      `eval_crop` of the largest window of the target aspect, resized; no randomness.
    * `shuffle`: row groups in a random order and rows through a shuffle buffer
      (`shuffle_buffer` rows, default: ~4 row groups, at most ~256 MB of JPEGs). With
      `shuffle=False` (and `training=False`) the order is the stored order, the same every time.
      `seed` makes shuffling and augmentation reproducible.
    * `shard=(index, count)`: this worker's disjoint share of row groups; the shards together
      cover every row exactly once per epoch.
    * `num_epochs`: how many exact passes (None: endless). Each epoch is counted; an epoch short
      of the stored rows is retried when empty, else raises `IncompleteEpochError`.
    * `parallel`: parallel decode calls (default: tf.data.AUTOTUNE).
    * `engine`: ``"pyarrow"`` (default, faster) or ``"petastorm"`` (petastorm's ``make_batch_reader``;
      `reader_workers=0` uses its dummy pool, N > 0 its thread pool, seen to end epochs early).
    * `prefetch_rows`: encoded rows queued ahead of decoding, across epoch boundaries (default 512).
    * `dct_scale`: decode a crop window at least 2, 4 or 8 times the target size (both sides) at
      1/2, 1/4 or 1/8 DCT scale (libjpeg's ``ratio``), then resize: small targets decode far fewer
      pixels. False: always decode at full scale.
    * `verify`: check footer and row-group checksums (default; see `pipeline.verify`). Parts are
      checked for presence and size before every epoch either way.

    `url`: a local folder, an fsspec URL (with `storage_options`), or ``board://<board>/<pin>``.
    Ready for ``model.fit`` and ``strategy.experimental_distribute_dataset`` (batch by the
    global batch size). Auto-sharding is switched off when `shard` is given: the reader shards.
    """
    import tensorflow as tf

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if num_epochs is not None and num_epochs < 1:
        raise ValueError(f"num_epochs must be None or at least 1, got {num_epochs!r}")
    image_size = (int(image_size),) * 2 if isinstance(image_size, (int, np.integer)) else tuple(map(int, image_size))
    if len(image_size) != 2 or min(image_size) < 1:
        raise ValueError(f"image_size must be (height, width), got {image_size!r}")
    crop_area = tuple(float(v) for v in crop_area)
    if not 0 < crop_area[0] <= crop_area[1] <= 1:
        raise ValueError(f"crop_area must satisfy 0 < low <= high <= 1, got {crop_area!r}")

    location = locate(url, storage_options)
    info = read_info(location)
    if engine == "petastorm":
        check_petastorm_metadata(location, info)   # before petastorm could unpickle anything
    info["url"] = location.url
    groups = shard_row_groups(info, shard)
    if not verify:
        info["files"] = {name: {k: v for k, v in entry.items() if k not in ("footer_xxh3", "row_group_xxh3")}
                         for name, entry in info["files"].items()}
    elif not verified(info):
        log.warning("%s: written by an older pinstorm, without checksums; convert it again to have its parts "
                    "verified", location.url)
    shard = None if shard is None else (int(shard[0]), int(shard[1]))
    base_seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
    source = _EpochSource(location, info, shard, groups, shuffle=shuffle, base_seed=base_seed, engine=engine,
                          retries=retries, workers=reader_workers)
    check_parts(location, info, source.part_names())   # a missing part fails here, not mid-epoch
    if shuffle_buffer is None:
        mean_rows = max(1, source.expected // max(1, len(groups)))
        mean_bytes = max(1, info["bytes"] // max(1, info["rows"]))
        shuffle_buffer = min(source.expected, max(1024, 4 * mean_rows), max(256, 2**28 // mean_bytes))

    signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32))

    shuffle_seed = (base_seed * 1_000_003 + 17) % (2**31 - 1)

    def epoch_dataset(epoch):
        rows = tf.data.Dataset.from_generator(source, args=(epoch,), output_signature=signature)
        rows = rows.prefetch(2).unbatch()   # read the next row group while this one is decoded
        epoch_seed = (tf.cast(base_seed, tf.int64) * 1_000_003 + epoch * 7919 + 17) % (2**31 - 1)
        if shuffle:
            # A Python int seed: a tensor seed breaks under a global `tf.random.set_seed`. Epochs still
            # differ, because the source reads each epoch's row groups in its own seeded order.
            rows = rows.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
        return rows.enumerate().map(
            lambda i, row: (row[0], row[1], tf.stack([epoch_seed, i])))

    epochs = tf.data.Dataset.range(num_epochs) if num_epochs is not None else tf.data.Dataset.range(2**62)
    dataset = epochs.flat_map(epoch_dataset)
    # Keep encoded rows queued across epoch boundaries: a new epoch starts a new reader and refills its
    # shuffle buffer, and the decoders should not wait for that.
    ahead = _AHEAD if prefetch_rows is None else prefetch_rows
    if ahead > 0:
        dataset = dataset.prefetch(ahead)
    fn = _preprocess_fns(tf, image_size, training, crop_area, flip, eval_crop, dct_scale)
    deterministic = seed is not None or not shuffle
    dataset = dataset.map(fn, num_parallel_calls=parallel or tf.data.AUTOTUNE, deterministic=deterministic)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    if shard is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = dataset.with_options(options)
    return dataset
