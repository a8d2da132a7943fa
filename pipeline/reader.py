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
`boards.safety.parquet_limits.BoundedParquetFile`; the petastorm engine is used only when
``_common_metadata``'s pickled Unischema is byte-for-byte pinstorm's own (`UntrustedSchemaError`
otherwise, at `make_dataset`), petastorm's unpickler is guarded while it opens the dataset, and
every row group of the shard is bounded the same way before petastorm is handed the dataset.
TensorFlow is imported inside the functions, so ``import pipeline`` stays light.
The TF-free parts (shards, epoch order, the counted and verified `EpochSource`, the JPEG checks) live in
`pipeline.epochs`, shared with the PyTorch reader (`pipeline.torch_loader`).
"""

from __future__ import annotations


import numpy as np

from pinstorm.errors import PinstormError

from .columns_reader import refuse_tabular
from .errors import InvalidPipelineInput
from .epochs import EpochSource as _EpochSource  # noqa: F401 (kept importable from here)
from .epochs import IncompleteEpochError, shard_row_groups  # noqa: F401 (public names of this module)
from .epochs import check_arguments, default_shuffle_buffer, open_epochs
from .options import ASPECT_RANGE, CROP_ATTEMPTS, DEFAULTS as READER, ReaderOptionError
from .epochs import check_jpegs as _check_jpegs  # noqa: F401 (kept importable from here)
from .epochs import epoch_order, epoch_seed
from .epochs import epoch_seed as _epoch_seed  # noqa: F401
from .epochs import jpeg_problem as _jpeg_problem  # noqa: F401
from .malloc_pad import pad_heaps
from .verify import open_part
from .positions import Position, planned_chunks, resume_position, state_dict, stream_ids, stream_length

ENGINES = ("petastorm", "pyarrow")
_AHEAD = 512   # encoded rows queued ahead of the decoders (~55 MB of ImageNet JPEGs)
_CHUNK = 256   # rows the planned-order generator hands to tf.data at once


DCT_RATIOS = (1, 2, 4, 8)


def _rows_of(tf, chunks):
    """Chunks of rows (tuples of [n, ...] tensors) cut into rows. ``flat_map`` over
    ``from_tensor_slices`` rather than ``unbatch``: ~20 us less CPU per row in the same pipeline
    (bench/bench_peers.py), which is ~1.5% of a decoded row."""
    return chunks.flat_map(lambda *chunk: tf.data.Dataset.from_tensor_slices(chunk))


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

    # A window that fits no reduction (most of a small stored image's) takes the plain decode without the
    # branch op, which cost ~0.05 ms an image here (bench/bench_small_images.py); the rest choose a scale.
    return tf.cond(fit >= DCT_RATIOS[1], lambda: tf.switch_case(index, [branch(r) for r in DCT_RATIOS]), branch(1))


def _flipped(tf, image, seed):
    """`image` flipped left-right when ``tf.image.stateless_random_flip_left_right`` would flip it for `seed`.

    Its draw (a uniform number from the reversed seed, below 0.5) is taken from the ops
    ``tf.random.stateless_uniform`` runs for it (the default, auto-selected algorithm) without the scaling to
    [0, 1), which is exact; and it is applied as a reverse over the axes [1] or [] rather than through a
    ``tf.cond``: the same pixels for 8 fewer ops and no nested function call an image, ~0.01 ms of CPU an
    image on small images (bench/bench_small_images.py)."""
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.reverse(seed, [0]))
    draw = tf.raw_ops.StatelessRandomUniformV2(shape=[], key=key, counter=counter,
                                               alg=tf.random.Algorithm.AUTO_SELECT.value)
    return tf.reverse(image, tf.range(1, 1 + tf.cast(draw < 0.5, tf.int32)))


def _preprocess_fns(tf, image_size, training, crop_area, flip, eval_crop, dct_scale=True, cast_first=True):
    height, width = image_size
    full_box = tf.constant([[[0.0, 0.0, 1.0, 1.0]]])

    def train_fn(jpeg, label, seed):
        shape = tf.io.extract_jpeg_shape(jpeg)
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=full_box, seed=seed, min_object_covered=crop_area[0],
            aspect_ratio_range=ASPECT_RANGE, area_range=crop_area, max_attempts=CROP_ATTEMPTS,
            use_image_if_no_bounding_boxes=True)
        window = tf.concat([begin[:2], size[:2]], 0)
        image = _resized(tf, _decode_crop(tf, jpeg, shape, window, (height, width), dct_scale), (height, width),
                         cast_first)
        if flip:
            image = _flipped(tf, image, seed)
        return _unit_scale(tf, image), label

    def eval_fn(jpeg, label, seed=None):
        shape = tf.io.extract_jpeg_shape(jpeg)
        h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
        aspect = width / height
        crop_h = tf.minimum(h, w / aspect) * eval_crop
        crop_w = crop_h * aspect
        crop_h = tf.maximum(1, tf.cast(tf.round(crop_h), tf.int32))
        crop_w = tf.maximum(1, tf.cast(tf.round(crop_w), tf.int32))
        window = tf.stack([(shape[0] - crop_h) // 2, (shape[1] - crop_w) // 2, crop_h, crop_w])
        image = _resized(tf, _decode_crop(tf, jpeg, shape, window, (height, width), dct_scale), (height, width),
                         cast_first)
        return _unit_scale(tf, image), label

    return train_fn if training else eval_fn


def _resized(tf, image, size, cast_first=True):
    """``tf.image.resize`` of the uint8 `image` (bilinear, half-pixel centres); `cast_first`, from its float32
    cast, the same pixels bit for bit: TensorFlow's bilinear kernel interpolates in float32 either way but reads
    float32 input far faster, so cast + resize cost 0.72-0.79x the resize alone for windows up to the output's
    size and 0.9x at 2.4x its pixels (bench/bench_resize_input.py). From ~3.7x the output's pixels on, the cast
    costs as much as it saves, and its float32 copy is 4x the window's bytes: `make_dataset` casts only where
    the DCT-scaled decode keeps windows small (`dct_scale`)."""
    return tf.image.resize(tf.cast(image, tf.float32) if cast_first else image, size)


def _unit_scale(tf, resized):
    """Pixels of a bilinear resize of uint8 values, scaled to [0, 1]: what ``clip_by_value(x / 255, 0, 1)``
    gives, one pass over the image fewer (~0.02 ms of CPU an image on small images,
    bench/bench_small_images.py). The resize interpolates by lerps (``a + (b - a) * t``, t in [0, 1)) of values
    in [0, 255], which stay at or above 0 in floating point; only an ulp above 255 is possible."""
    return tf.minimum(resized / 255.0, 1.0)


def _largest_stored(source):
    """``(height, width)`` that no stored image of the shard exceeds, from the parts' Parquet statistics
    (convert writes them for both columns); None where unknown: statistics missing, or a remote dataset
    (its footers would cost requests before the first row). The statistics are untrusted input too: a
    lie only costs the DCT-scale saving (`make_dataset`), never a wrong or unbounded decode."""
    if not source.location.is_local or source.parts is not None:
        return None
    info = source.info
    names = sorted(info.files)
    where = [(name, rg) for name in names for rg in range(info.files[name]["row_groups"])]
    wanted: dict[str, list[int]] = {}
    for g in source.groups:
        wanted.setdefault(where[g][0], []).append(where[g][1])
    largest = [0, 0]
    for name, groups in wanted.items():
        try:
            handle = open_part(source.location, info, name, columns=("height", "width"))
        except PinstormError:   # the epoch that reads this part names the problem
            return None
        try:
            meta = handle.metadata
            for rg in groups:
                group = meta.row_group(rg)
                columns = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
                for axis, column in enumerate(("height", "width")):
                    stats = columns[column].statistics if column in columns else None
                    if stats is None or not stats.has_min_max:
                        return None
                    largest[axis] = max(largest[axis], int(stats.max))
        finally:
            handle.close()
    return tuple(largest)


def _may_scale(source, image_size) -> bool:
    """Whether any crop window of the shard could fit a DCT reduction (`_decode_crop`): at least twice the
    target on both sides. Small stored images never do; their map then decodes without the branch, which
    cost ~0.04 ms of CPU an image (bench/bench_small_images.py) and chose the full-scale decode anyway."""
    largest = _largest_stored(source)
    return largest is None or (largest[0] >= DCT_RATIOS[1] * image_size[0]
                               and largest[1] >= DCT_RATIOS[1] * image_size[1])


def preprocess_fn(image_size=(224, 224), *, training=READER.training, crop_area=READER.crop_area, flip=READER.flip,
                  eval_crop=READER.eval_crop, dct_scale=READER.dct_scale):
    """The per-image function `make_dataset` maps: (jpeg string, label, seed[2]) -> (float32 image, label).

    Exposed so benchmarks can run the very same work over bytes held in memory.
    """
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()

    return _preprocess_fns(tf, tuple(image_size), training, tuple(crop_area), flip, eval_crop, dct_scale,
                           cast_first=dct_scale)


def _petastorm_epochs(tf, source, shuffle, shuffle_buffer):
    """The petastorm engine's epochs: its row groups as it reads them, through tf.data's shuffle buffer."""
    signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32))
    base_seed = source.base_seed
    shuffle_seed = (base_seed * 1_000_003 + 17) % (2**31 - 1)
    if shuffle_buffer is None:
        shuffle_buffer = default_shuffle_buffer(source.info, source.expected, len(source.groups))

    def epoch_dataset(epoch):
        rows = tf.data.Dataset.from_generator(source, args=(epoch,), output_signature=signature)
        rows = _rows_of(tf, rows.prefetch(2))   # read the next row group while this one is decoded
        epoch_seed = (tf.cast(base_seed, tf.int64) * 1_000_003 + epoch * 7919 + 17) % (2**31 - 1)
        if shuffle:
            # A Python int seed: a tensor seed breaks under a global `tf.random.set_seed`. Epochs still
            # differ, because the source reads each epoch's row groups in its own seeded order.
            rows = rows.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
        return rows.enumerate().map(
            lambda i, row: (row[0], row[1], tf.stack([epoch_seed, i])))

    return epoch_dataset


class DatasetPosition:
    """`make_dataset`'s plan (pyarrow engine) and where a caller is in it: one stream, whose epochs are the
    sample IDs of `positions.stream_ids`, started at `start` (a `positions.Position`).

    ``state(k)``: the JSON-able state (`positions.state_dict`, the torch loader's format) after the caller
    consumed `k` batches of the dataset. Batches run across epoch boundaries, so `k` batches are
    ``k * batch_size`` samples from `start` (fewer at the very end).

    Made by `make_dataset` (``dataset.pinstorm_position``) and `dataset_position`, whose arguments these are.

    Args:
        source: The dataset's epochs (``epochs.EpochSource``: its parts, row groups, shard and seed).
        batch_size: Rows per batch.
        shuffle: As `ReaderOptions`'.
        shuffle_buffer: As `ReaderOptions`'.
        num_epochs: As `ReaderOptions`'.
        drop_remainder: As `ReaderOptions`'.
        state: A position to start from (None: the first sample of epoch 0).
    """

    def __init__(self, source, *, batch_size, shuffle, shuffle_buffer, num_epochs, drop_remainder, state=None):
        self.source, self.batch_size, self.shuffle, self.shuffle_buffer = source, batch_size, shuffle, shuffle_buffer
        self.num_epochs, self.drop_remainder = num_epochs, drop_remainder
        self.start = Position.fresh(0, 1) if state is None else resume_position(
            state, source, shuffle=shuffle, shuffle_buffer=shuffle_buffer, num_workers=0, streams=1)

    def ids(self, epoch: int):
        """The sample IDs of `epoch`, whole (but the samples an earlier layout consumed).

        Args:
            epoch: The epoch, from 0.
        """
        return stream_ids(self.source.info, self.source.groups, seed=epoch_seed(self.source.base_seed, epoch),
                          shuffle=self.shuffle, shuffle_buffer=self.shuffle_buffer,
                          consumed=self.start.consumed.get(epoch))

    def epoch_length(self, epoch: int) -> int:
        """The samples `epoch` delivers (but those an earlier layout consumed).

        Args:
            epoch: The epoch, from 0.
        """
        return stream_length(self.source.info, self.source.groups, seed=epoch_seed(self.source.base_seed, epoch),
                             shuffle=self.shuffle, consumed=self.start.consumed.get(epoch))

    def rows(self, epoch, with_ids=True):
        """``(jpegs, labels, seeds [n, 2][, ids])`` chunks of `_CHUNK` rows of `epoch` from the start position
        on, in plan order, as arrays (`positions.planned_chunks`: no Python work per row).

        Args:
            epoch: The epoch, from 0.
            with_ids: Also yield the samples' IDs.
        """
        epoch = int(epoch)
        first, skip = self.start.streams[0]
        skip = skip if epoch == first else 0
        seed = epoch_seed(self.source.base_seed, epoch)
        order = epoch_order(self.source.groups, seed, self.shuffle)
        where = self.source.location.url + (f" shard {self.source.shard[0]}/{self.source.shard[1]}"
                                            if self.source.shard else "")
        for ids, jpegs, labels in planned_chunks(self.source, self.ids(epoch), order, skip=skip, where=where,
                                                 consumed=self.start.consumed.get(epoch), epoch=epoch, size=_CHUNK):
            seeds = np.stack([np.full(len(ids), seed, dtype=np.int64), ids], axis=1)
            yield (jpegs, labels, seeds, ids) if with_ids else (jpegs, labels, seeds)

    def chunks(self, tf, first: int, end: int, return_ids: bool):
        """A dataset of the chunks of `_CHUNK` rows (`rows`) of epochs `first` to `end` (excluded): tf.data
        hands rows over a chunk at a time, so queueing ahead and crossing epochs cost nothing per row. One
        generator runs through all the epochs: each ``from_generator`` costs ~0.01 s of CPU to start (its
        functions instantiated), which one per epoch paid again at every epoch.

        Args:
            tf: The ``tensorflow`` module.
            first: The first epoch.
            end: The epoch after the last.
            return_ids: The chunks also carry the samples' IDs.
        """
        signature = (tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32),
                     tf.TensorSpec([None, 2], tf.int64)) + ((tf.TensorSpec([None], tf.int64),) if return_ids else ())

        def epochs(first, end, with_ids):
            for epoch in range(int(first), int(end)):
                yield from self.rows(epoch, bool(with_ids))

        return tf.data.Dataset.from_generator(epochs, args=(first, end, return_ids), output_signature=signature)

    def state(self, batches_consumed: int) -> dict:
        """The state after `batches_consumed` batches of this dataset (counted from its first).

        Args:
            batches_consumed: Batches the caller took from the dataset (tf.data prefetches: count batches).

        Returns:
            A JSON-able state for `make_dataset`'s or `make_torch_loader`'s ``state``.
        """
        if batches_consumed < 0:
            raise InvalidPipelineInput(f"batches_consumed must be >= 0, got {batches_consumed!r}")
        epoch, count = self.start.streams[0]
        samples = int(batches_consumed) * self.batch_size
        end = None if self.num_epochs is None else self.start.epoch + self.num_epochs
        while True:
            left = self.epoch_length(epoch) - count
            if samples <= left or (end is not None and epoch + 1 >= end):
                count += min(samples, left)
                break
            samples -= left
            epoch, count = epoch + 1, 0
        position = Position({0: (epoch, count)}, 0, self.start.consumed)
        return state_dict(self.source, position, shuffle=self.shuffle, shuffle_buffer=self.shuffle_buffer,
                          num_workers=0, streams=1)


def dataset_position(url, *, batch_size: int, shard=None, shuffle: bool = True, seed: int | None = None,
                     shuffle_buffer: int | None = None, num_epochs: int | None = 1, drop_remainder: bool = False,
                     state=None, storage_options: dict | None = None, stream: bool = False) -> DatasetPosition:
    """The `DatasetPosition` of the `make_dataset` (pyarrow engine) these arguments build, without building it:
    for code that does not hold the dataset (a training loop behind ``distribute_datasets_from_function``).
    Needs the `seed` (or a `state`, which carries one): without, every reader draws its own.

    The arguments mean what they mean for `make_dataset`; the shared ones (``shard``, ``shuffle``, ``seed``,
    ``shuffle_buffer``, ``num_epochs``, ``drop_remainder``, ``storage_options``, ``stream``) are described
    on [`ReaderOptions`][pinstorm.pipeline.options.ReaderOptions].

    Args:
        url: The converted dataset: a local folder, an fsspec URL or ``board://<board>/<pin>``.
        batch_size: Rows per batch, as given to `make_dataset`.
        state: A position to start from, as `make_dataset`'s.

    Returns:
        The `DatasetPosition`.
    """
    if seed is None and state is None:
        raise InvalidPipelineInput("dataset_position needs the seed (or a state): an unseeded reader's order is its own")
    source = open_epochs(url, shard, shuffle=shuffle, seed=seed, storage_options=storage_options, stream=stream)
    refuse_tabular(source.info, source.location.url, "dataset_position")
    return DatasetPosition(source, batch_size=int(batch_size), shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                           num_epochs=num_epochs, drop_remainder=drop_remainder, state=state)


def make_dataset(url, *, batch_size: int, image_size=(224, 224), training: bool = READER.training,
                 shard=READER.shard, num_epochs: int | None = READER.num_epochs, shuffle: bool = READER.shuffle,
                 seed: int | None = READER.seed, parallel: int | None = None,
                 drop_remainder: bool = READER.drop_remainder, shuffle_buffer: int | None = READER.shuffle_buffer,
                 crop_area=READER.crop_area, flip: bool = READER.flip, eval_crop: float = READER.eval_crop,
                 engine: str = "pyarrow", reader_workers: int = 0, prefetch_rows: int | None = None,
                 retries: int = READER.retries, storage_options: dict | None = READER.storage_options,
                 verify: bool = READER.verify, dct_scale: bool = READER.dct_scale, state=None,
                 return_ids: bool = READER.return_ids, stream: bool = READER.stream,
                 cache_limit: int | None = READER.cache_limit, max_pixels: int | None = READER.max_pixels):
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
      pixels. False: always decode at full scale. A local dataset whose Parquet statistics show no stored
      image that large (small stored images) is decoded without that choice: the same pixels, less CPU.
    * `verify`: check footer and row-group checksums (default; see `pipeline.verify`). Parts are
      checked for presence and size before every epoch either way.
    * `max_pixels`: pixels an image may have by its JPEG frame header (default 40 MP, `convert`'s bound, above
      every ILSVRC image; None: unchecked). A larger one is refused as its row group is read, naming part, row
      group, row and file (`UndecodableImage`), before TensorFlow allocates its pixels: a checksum says
      nothing of an image's size, and a foreign dataset's 60000x60000 header would ask for 10.8 GB.
    * pyarrow engine: rows come in the sample-ID order of `positions.stream_ids` (the torch loader's,
      ``num_workers=0``), each sample cropped and flipped by its own seed (epoch seed, sample ID).
      `state`: a position to start from (`DatasetPosition.state`, or a `TorchLoader.state_dict()`, or a
      list of them, one per rank): the same shard layout continues the interrupted pass sample for
      sample; another one delivers the samples of that epoch none of the states had received.
      `num_epochs` then counts from the state's epoch. A state is checked against the epoch plan before
      any work (`positions.check_state`; `ResumeStateError` names the field).
      ``dataset.pinstorm_position.state(k)``: the state after the caller consumed `k` batches of this
      dataset (tf.data prefetches, so count batches).
      `return_ids`: batches are ``(images, labels, ids)``, ids int64 ``[B]`` the samples' global row numbers.
      The petastorm engine takes neither (ValueError), and its ``pinstorm_position`` is None.

    `url`: a local folder, an fsspec URL (with `storage_options`), or ``board://<board>/<pin>``.
    `stream=True`: a remote dataset is read part by part as the epoch plan needs it, through the machine's
    part cache of at most `cache_limit` bytes (`pipeline.part_cache`; "Datasets bigger than the disk" in
    docs/pipeline.md); the same rows in the same order.
    Ready for ``model.fit`` and ``strategy.experimental_distribute_dataset`` (batch by the
    global batch size). Auto-sharding is switched off when `shard` is given: the reader shards.

    The options both readers share (``training``, ``shard``, ``num_epochs``, ``shuffle``, ``seed``,
    ``drop_remainder``, ``shuffle_buffer``, ``crop_area``, ``flip``, ``eval_crop``, ``dct_scale``,
    ``verify``, ``retries``, ``storage_options``, ``return_ids``, ``stream``, ``cache_limit``, ``max_pixels``)
    are described once on [`ReaderOptions`][pinstorm.pipeline.options.ReaderOptions].

    Args:
        url: The converted dataset: a local folder, an fsspec URL or ``board://<board>/<pin>``.
        batch_size: Rows per batch (the global batch size under a strategy).
        image_size: ``(height, width)`` of the delivered images, or one int for a square.
        parallel: Parallel decode calls (None: ``tf.data.AUTOTUNE``).
        engine: ``"pyarrow"`` (default, faster) or ``"petastorm"``.
        reader_workers: petastorm engine only: 0 for its dummy pool, N > 0 for a pool of N threads.
        prefetch_rows: Encoded rows queued ahead of decoding (None: 512).
        state: A position to start from: a ``DatasetPosition.state``, a ``TorchLoader.state_dict()``, or a
            list of them, one per rank (pyarrow engine).

    Returns:
        A ``tf.data.Dataset`` of ``(images, labels)`` (with ``return_ids``, ``(images, labels, ids)``)
        batches, with a ``pinstorm_position`` attribute (None for the petastorm engine).

    Raises:
        ReaderOptionError: An option out of its range.
        DatasetNotFound: No finished dataset at `url`.
        IncompleteEpochError: An epoch delivered fewer rows than stored.
    """
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()
    pad_heaps()   # from_generator's kernel fixes glibc's mmap threshold: keep per-image buffers in the heaps

    if engine not in ENGINES:
        raise ReaderOptionError(f"engine must be one of {ENGINES}, got {engine!r}")
    image_size, options = check_arguments(batch_size, image_size, locals())   # the checks both readers share
    crop_area = options.crop_area
    source = open_epochs(url, shard, shuffle=shuffle, seed=seed, engine=engine, retries=retries,
                         workers=reader_workers, storage_options=storage_options, verify=verify, stream=stream,
                         cache_limit=cache_limit)
    refuse_tabular(source.info, source.location.url, "make_dataset")
    source.max_pixels = max_pixels
    shard = source.shard
    if engine == "petastorm":
        if state is not None or return_ids:
            raise InvalidPipelineInput("state= and return_ids= need engine='pyarrow': petastorm reads row groups in its own "
                             "order, so no position can be kept")
        position, first = None, 0
    else:
        position = DatasetPosition(source, batch_size=int(batch_size), shuffle=shuffle, shuffle_buffer=shuffle_buffer,
                                   num_epochs=num_epochs, drop_remainder=drop_remainder, state=state)
        first = position.start.epoch
    end = first + num_epochs if num_epochs is not None else 2**62
    # Keep encoded rows queued across epoch boundaries: a new epoch starts a new reader (and, petastorm,
    # refills its shuffle buffer), and the decoders should not wait for that.
    ahead = _AHEAD if prefetch_rows is None else prefetch_rows
    if position is None:
        epochs = tf.data.Dataset.range(first, end)
        dataset = epochs.flat_map(_petastorm_epochs(tf, source, shuffle, shuffle_buffer))
        dataset = dataset.prefetch(ahead) if ahead > 0 else dataset
    else:   # queued as whole chunks, then cut into rows
        dataset = position.chunks(tf, first, end, return_ids)
        dataset = dataset.prefetch(-(-ahead // _CHUNK)) if ahead > 0 else dataset
        dataset = _rows_of(tf, dataset)
    # Windows stay within a few times the output's pixels where DCT scaling is asked for (or images are small):
    # there the float32 resize is cheaper (`_resized`); without it a window may be a whole photograph.
    cast_first = dct_scale
    dct_scale = dct_scale and _may_scale(source, image_size)   # small stored images: no DCT-scale branch
    fn = _preprocess_fns(tf, image_size, training, crop_area, flip, eval_crop, dct_scale, cast_first)
    if return_ids:
        fn = (lambda decode: lambda jpeg, label, seed, sample: (*decode(jpeg, label, seed), sample))(fn)
    # Deterministic whenever a position is kept: batch k must hold the k-th samples of the plan.
    deterministic = seed is not None or not shuffle or position is not None
    dataset = dataset.map(fn, num_parallel_calls=parallel or tf.data.AUTOTUNE, deterministic=deterministic)
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    # Of tf.data's default graph rewrites only map-and-batch fusion pays here (the plan already prefetches and
    # parallelises): the others cost each iteration's start ~0.03 s of CPU, 0.01-0.02 ms an image over a few
    # thousand small images (bench/bench_small_images.py).
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.map_and_batch_fusion = True
    if shard is not None:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = dataset.with_options(options)
    dataset.pinstorm_position = position
    return dataset
