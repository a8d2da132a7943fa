"""A tabular dataset's columns as batches: petastorm's ``make_batch_reader`` shapes for tf.data and PyTorch.

Why: petastorm's converter is mostly used on tabular DataFrames (a ``features`` array column and a
``label``), read as namedtuples of column tensors in tf (``dataset.map(lambda x: (x.features, x.label))``)
or dicts of column tensors in torch (``batch['features']``). The Spark converter stores such a DataFrame
as a tabular pinstorm dataset (`column_digest`'s checksums); this module reads it back in those shapes,
with the epochs the image readers give: row groups sharded by `shard_row_groups`, read with every check by
`open_part` / `read_row_group`, each epoch in its own seeded order and counted (`IncompleteEpochError`).

Resuming mid-epoch is the image readers' contract in their state format (`positions.state_dict`, checked
by `positions.resume_position`): one stream (``num_workers=0``), its epoch and the rows received of it.
An epoch's row order is computed from the row counts and the seed alone (`epoch_order`, then one seeded
permutation per row group), so a state taken after k batches lets a new reader skip exactly those rows,
without reading the row groups they came from. A tabular state resumes on the same shard and shuffle
setting only (the image readers' resume on another layout recomputes their own row order, not this one).

What a column becomes (one rule for both frameworks): numbers and booleans a numeric array; timestamps
int64 microseconds since the epoch (UTC), dates int32 days; arrays of numbers (nested too) an array of
shape ``[batch, n, ...]`` when every row has the same length (else `ColumnError`, naming the column, as
petastorm refuses ragged arrays); strings and binaries strings (tf) or Python lists (torch); decimals
strings (as petastorm); structs, maps and arrays of them Python objects, torch only (tf has no tensor
for them: leave them out with ``columns=``). A null where a tensor is wanted is a `ColumnError` too.
"""

from __future__ import annotations

import collections
import itertools
import keyword
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from .column_digest import TABLE_CHECKSUM
from .epochs import IncompleteEpochError, epoch_order, epoch_seed, shard_row_groups
from .errors import InvalidPipelineInput, PipelineError
from .malloc_pad import pad_heaps
from .metadata import read_info
from .positions import Position, ResumeStateError, check_state, info_digest, resume_position, state_dict
from .storage import locate
from .verify import OpenParts, check_parts, checksummed, open_part, read_row_group

OBJECT = "object"   # a column of Python objects (strings, bytes, structs, maps), not a numeric array


class ColumnError(PipelineError, ValueError):
    """A column that cannot become a tensor: ragged arrays, nulls, or a type the framework has no tensor for."""


def is_tabular_info(info) -> bool:
    """Whether a dataset's info (`metadata.read_info`) is a tabular one: columns checksummed by
    `column_digest`, no image column."""
    return info.checksum == TABLE_CHECKSUM


def refuse_tabular(info, url: str, reader: str) -> None:
    """`InvalidPipelineInput` when the image reader `reader` is pointed at a tabular dataset (whose
    parts hold no ``image`` column): name it and the readers that do read it."""
    if is_tabular_info(info):
        columns = ", ".join(list(info.get("columns") or ())[:8])
        raise InvalidPipelineInput(
            f"{url} is a tabular dataset (columns {columns}; no image column), which {reader} cannot read: read it "
            "with the Spark converter's make_tf_dataset / make_torch_dataloader, or pinstorm.pipeline.ColumnBatches "
            "(make_columns_dataset for tf.data, TorchColumnsLoader for PyTorch)")


def column_values(name: str, column):
    """One column of a row group as a numpy array ([rows, ...]) or a list of Python objects.

    Args:
        name: The column's name (for messages).
        column: The Arrow column (Array or ChunkedArray).

    Returns:
        A numpy array (numbers, booleans, timestamps, dates, arrays of them, arrays of strings) or a list.

    Raises:
        ColumnError: Ragged arrays, or nulls in a column of numbers or arrays.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if pa.types.is_dictionary(kind):
        array, kind = array.cast(kind.value_type), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_large_binary(kind):
        return array.to_pylist()
    if pa.types.is_decimal(kind):
        return [None if v is None else str(v) for v in array.to_pylist()]
    if pa.types.is_struct(kind) or pa.types.is_map(kind):
        return array.to_pylist()
    if array.null_count:
        raise ColumnError(f"column {name!r} holds {array.null_count} null(s) in a row group; a tensor cannot "
                          "hold them (fill them in Spark first, e.g. df.fillna / coalesce)")
    if pa.types.is_timestamp(kind):
        return array.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64()).to_numpy()
    if pa.types.is_date32(kind) or pa.types.is_date64(kind):
        return array.cast(pa.date32()).cast(pa.int32()).to_numpy()
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        if pa.types.is_fixed_size_list(kind):
            width, values = kind.list_size, array.flatten()
        else:
            offsets = np.asarray(array.offsets)
            lengths = np.diff(offsets)
            if len(lengths) and (lengths != lengths[0]).any():
                raise ColumnError(f"column {name!r} holds arrays of different lengths ({int(lengths.min())} to "
                                  f"{int(lengths.max())}) in one row group; a tensor needs one length: pad or "
                                  "trim them in Spark first, or leave the column out with columns=")
            width = int(lengths[0]) if len(lengths) else 0
            values = array.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if len(array) \
                else array.values.slice(0, 0)
        inner = column_values(name, values)
        if isinstance(inner, list):
            if any(isinstance(v, (dict, list)) for v in inner):
                return array.to_pylist()   # arrays of structs or maps: Python objects
            inner = np.array(inner, dtype=object)
        return inner.reshape((len(array), width) + inner.shape[1:])
    return array.to_pylist()   # anything else Parquet holds: Python objects


def _merged(pieces: list[dict]) -> dict:
    """Row slices of several row groups as one batch; arrays whose row shapes differ are ragged."""
    if len(pieces) == 1:
        return pieces[0]
    merged = {}
    for name, first in pieces[0].items():
        parts = [piece[name] for piece in pieces]
        if isinstance(first, np.ndarray):
            shapes = {p.shape[1:] for p in parts}
            if len(shapes) > 1:
                raise ColumnError(f"column {name!r} holds arrays of shapes {sorted(shapes)} in different row "
                                  "groups; a tensor needs one length: pad or trim them in Spark first")
            merged[name] = np.concatenate(parts)
        else:
            merged[name] = [v for p in parts for v in p]
    return merged


class ColumnBatches:
    """Batches of a tabular dataset's columns (dicts of column -> values), over exact, sharded, seeded epochs.

    Each ``iter()`` runs `num_epochs` epochs (None: endless) from the start position (epoch 0's first row,
    or a resumed state's), and `state_dict` then says where the caller is; an epoch reads the shard's row groups in a
    seeded order (shuffled when `shuffle`), rows shuffled within each row group, `workers` row groups read
    ahead in threads; its last batch may be short (batches never mix epochs).

    Args:
        url: The dataset: a folder, an fsspec URL or ``board://<board>/<pin>``.
        batch_size: Rows per batch.
        num_epochs: Exact passes (None: endless).
        columns: The columns to read, in order (None: all).
        shard: ``(index, count)``: this reader's share of the row groups (None: all).
        shuffle: Row groups in a seeded random order and rows shuffled within them.
        seed: The base seed of every epoch's order (None: a fresh one).
        workers: Row groups read ahead in parallel threads.
        storage_options: For fsspec when `url` is remote.
        state: A position to start from: `state` or `state_dict` of a reader of this dataset (this class,
            ``make_columns_dataset(...).pinstorm_position``, `TorchColumnsLoader`; the image readers' state
            format, one stream) with the same shard and shuffle: the reader continues with exactly the rows
            the interrupted one would have given next; its seed replaces `seed`, and `num_epochs` counts from
            its epoch (as `make_dataset`'s). A state comes from a file: it is checked first
            (`ResumeStateError`, naming the field).

    Raises:
        InvalidPipelineInput: An argument out of its range, an image dataset, an unknown column.
        ResumeStateError: A `state` this reader cannot continue from.
    """

    def __init__(self, url, *, batch_size: int = 32, num_epochs: int | None = 1, columns=None, shard=None,
                 shuffle: bool = True, seed: int | None = None, workers: int | None = None,
                 storage_options: dict | None = None, state=None):
        if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
            raise InvalidPipelineInput(f"batch_size must be a positive integer, got {batch_size!r}")
        if num_epochs is not None and (isinstance(num_epochs, bool) or int(num_epochs) != num_epochs
                                       or num_epochs < 1):
            raise InvalidPipelineInput(f"num_epochs must be None or a positive integer, got {num_epochs!r}")
        self.location = locate(url, storage_options)
        self.info = read_info(self.location)
        stored = list(checksummed(self.info))
        if stored == ["image", "label"]:
            raise InvalidPipelineInput(f"{self.location.url} is an image dataset: read it with make_dataset or "
                                       "make_torch_loader")
        self.columns = stored if columns is None else [str(c) for c in columns]
        unknown = [c for c in self.columns if c not in stored]
        if unknown:
            raise InvalidPipelineInput(f"no column {', '.join(map(repr, unknown))} in {self.location.url} "
                                       f"(columns: {', '.join(stored)})")
        self.batch_size, self.num_epochs = int(batch_size), num_epochs
        self.groups = shard_row_groups(self.info, shard)
        self.shard = None if shard is None else (int(shard[0]), int(shard[1]))
        self.shuffle = bool(shuffle)
        self.base_seed = random.SystemRandom().randrange(2**31) if seed is None else int(seed)
        self.workers = max(1, int(workers or 1))
        self._where = []   # global row group -> (part name, row group in the part)
        for name in sorted(self.info.files):
            self._where += [(name, rg) for rg in range(self.info.files[name]["row_groups"])]
        self.rows_per_epoch = sum(self.info.row_group_rows[g] for g in self.groups)
        self.start = Position.fresh(0, 1) if state is None else self._resume(state)
        self.position = self.start.copy()   # what `iter()` has handed over so far (`state_dict`)

    @property
    def seed(self) -> int:
        """The base seed of every epoch's order (a resumed state's, when one was given)."""
        return self.base_seed

    def _resume(self, state) -> Position:
        """The position of `state` (one state, or a list of one): checked as the image readers check theirs
        (`positions.check_state`, `check_received`), then refused unless it is of this reader's layout."""
        states = [state] if isinstance(state, dict) else list(state) if isinstance(state, (list, tuple)) else None
        if states is None or len(states) != 1:
            raise ResumeStateError("a tabular reader resumes from one state (its own state_dict()), not "
                                   f"{type(state).__name__ if states is None else f'{len(states)} states'}")
        checked = check_state(states[0], self.info, info_digest(self.info), where=self.location.url)
        shard = None if self.shard is None else list(self.shard)
        if checked["shard"] != shard or checked["shuffle"] != self.shuffle or checked["num_workers"] != 0 \
                or checked["shuffle_buffer"] is not None or checked["consumed"]:
            raise ResumeStateError(
                f"the state is of shard {checked['shard']}, shuffle={checked['shuffle']}, shuffle_buffer="
                f"{checked['shuffle_buffer']}, num_workers={checked['num_workers']}; a tabular reader resumes with "
                f"the same shard and shuffle (this one: shard {shard}, shuffle={self.shuffle}) and no shuffle "
                "buffer or workers (its rows are shuffled within row groups)")
        return resume_position(checked, self, shuffle=self.shuffle, shuffle_buffer=None, num_workers=0, streams=1)

    def load_state_dict(self, state) -> None:
        """Make the next pass continue from `state` (as ``state=`` does).

        Args:
            state: A `state_dict` of this dataset, same shard and shuffle.

        Raises:
            ResumeStateError: A state this reader cannot continue from.
        """
        self.start = self._resume(state)
        self.position = self.start.copy()

    def state_dict(self) -> dict:
        """Where the caller is after the batches `iter()` has handed over (the start, before any): a
        JSON-able state (`positions.state_dict`) for ``state=``, of this reader or a new one.

        Returns:
            The state.
        """
        return state_dict(self, self.position, shuffle=self.shuffle, shuffle_buffer=None, num_workers=0, streams=1)

    def state(self, batches_consumed: int) -> dict:
        """The state after the caller consumed `batches_consumed` batches of one pass (counted from the
        start): what a ``tf.data`` pipeline, which reads ahead, records (``dataset.pinstorm_position``).

        Args:
            batches_consumed: Batches the caller took (an epoch's last may be short; batches never mix epochs).

        Returns:
            The JSON-able state (`state_dict`'s format).

        Raises:
            InvalidPipelineInput: A negative count.
        """
        if isinstance(batches_consumed, bool) or int(batches_consumed) != batches_consumed or batches_consumed < 0:
            raise InvalidPipelineInput(f"batches_consumed must be a count >= 0, got {batches_consumed!r}")
        epoch, count = self.start.streams[0]
        batches = int(batches_consumed) if self.rows_per_epoch else 0
        end = None if self.num_epochs is None else self.start.epoch + self.num_epochs
        whole = -(-self.rows_per_epoch // self.batch_size)   # batches in an epoch from its start
        while batches:
            in_epoch = -(-(self.rows_per_epoch - count) // self.batch_size)
            if batches < in_epoch:
                count += batches * self.batch_size
                break
            batches -= in_epoch
            if end is not None and epoch + 1 >= end:   # the pass is over: the end of its last epoch
                count = self.rows_per_epoch
                break
            epoch, count = epoch + 1, 0
            skipped = batches // whole if end is None else min(batches // whole, end - 1 - epoch)
            epoch, batches = epoch + skipped, batches - skipped * whole   # whole epochs at once, not one by one
        return state_dict(self, Position({0: (epoch, count)}), shuffle=self.shuffle, shuffle_buffer=None,
                          num_workers=0, streams=1)

    def skip(self, epoch: int) -> int:
        """Rows of `epoch` the start position had received (a resumed state's epoch; 0 for others).

        Args:
            epoch: The epoch, from 0.
        """
        first, received = self.start.streams[0]
        return received if int(epoch) == first else 0

    def __len__(self) -> int:
        """Batches in one epoch."""
        return -(-self.rows_per_epoch // self.batch_size)

    def _opened(self) -> OpenParts:
        return OpenParts(lambda name: open_part(self.location, self.info, name, self.columns))

    def _read(self, group: int, parts: OpenParts):
        """Row group `group`, checked, read through `parts` (which keeps the last few parts open)."""
        name, rg = self._where[group]
        return read_row_group(parts.get(name), self.location, self.info, name, rg, columns=self.columns) \
            .select(self.columns)

    def tables(self, epoch: int, order=None):
        """The row groups of one epoch (or `order`, a tail of its order), in that order (Arrow tables, each
        checked before it is yielded).

        Args:
            epoch: The epoch, from 0.
            order: Global row-group indexes to read (None: the epoch's whole order).
        """
        if order is None:
            order = epoch_order(self.groups, epoch_seed(self.seed, epoch), self.shuffle)
        check_parts(self.location, self.info, {self._where[g][0] for g in order})
        handles, opened = threading.local(), []

        def read(group):   # each thread opens the parts it reads
            if not hasattr(handles, "parts"):
                handles.parts = self._opened()
                opened.append(handles.parts)
            return self._read(group, handles.parts)

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            pending = collections.deque()
            try:
                for group in order:
                    pending.append(pool.submit(read, group))
                    if len(pending) > self.workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()
                pool.shutdown(wait=True)
                for parts in opened:
                    parts.close()

    def chunks(self, epoch: int, skip: int = 0):
        """One epoch as one dict of column values per row group, rows shuffled within it, but its first
        `skip` rows (their row groups not read: the order and permutations come from counts and the seed);
        counted against the metadata (`IncompleteEpochError`).

        Args:
            epoch: The epoch, from 0.
            skip: Rows of the epoch's order to leave out from its start (a resumed position's).
        """
        seed = epoch_seed(self.seed, epoch)
        rng = np.random.default_rng(seed)
        order, counts = epoch_order(self.groups, seed, self.shuffle), self.info.row_group_rows
        permutations = []   # one per row group of `order`, drawn in order whether the group is read or not
        for g in order:
            permutations.append(rng.permutation(counts[g]) if self.shuffle else None)
        at, skip = 0, int(skip)
        while at < len(order) and skip >= counts[order[at]]:
            skip -= counts[order[at]]
            at += 1
        rows, expected = 0, self.rows_per_epoch - sum(counts[g] for g in order[:at]) - skip
        for table, permutation in zip(self.tables(epoch, order[at:]), permutations[at:]):
            if table.num_rows != (permutation.size if permutation is not None else table.num_rows):
                break   # counted below: the dataset changed after conversion
            rows_order = np.arange(table.num_rows) if permutation is None else permutation
            rows_order, skip = rows_order[skip:], 0
            values = self._batch(table)
            if self.shuffle or len(rows_order) != table.num_rows:
                values = {name: v[rows_order] if isinstance(v, np.ndarray) else [v[i] for i in rows_order]
                          for name, v in values.items()}
            rows += len(rows_order)
            yield values
        if rows != expected:
            raise IncompleteEpochError(f"{self.location.url}: epoch {epoch} delivered {rows} rows, the shard "
                                       f"holds {expected} from where it started")

    def epoch(self, epoch: int):
        """The batches of one epoch (dicts of column -> values) from the start position on; the last may
        be short.

        Args:
            epoch: The epoch, from 0.
        """
        pieces, need = [], self.batch_size
        for chunk in self.chunks(epoch, self.skip(epoch)):
            size, start = len(next(iter(chunk.values()))), 0
            while start < size:
                take = min(need, size - start)
                pieces.append({name: v[start:start + take] for name, v in chunk.items()})
                start, need = start + take, need - take
                if need == 0:
                    yield _merged(pieces)
                    pieces, need = [], self.batch_size
        if pieces:
            yield _merged(pieces)

    def _batch(self, table) -> dict:
        return {name: column_values(name, table.column(name)) for name in self.columns}

    def epochs(self):
        """The epochs one pass runs: from the start position's, `num_epochs` of them (None: endless)."""
        first = self.start.epoch
        return itertools.count(first) if self.num_epochs is None else range(first, first + self.num_epochs)

    def __iter__(self):
        """One pass from the start position; `state_dict` follows the batches handed over."""
        self.position = self.start.copy()
        for epoch in self.epochs():
            received = self.skip(epoch)
            more = self.num_epochs is None or epoch + 1 < self.start.epoch + self.num_epochs
            for batch in self.epoch(epoch):
                received += len(next(iter(batch.values())))
                # an epoch's end is the next one's start while the pass goes on (as `state` counts)
                self.position = Position({0: (epoch + 1, 0) if more and received == self.rows_per_epoch
                                          else (epoch, received)})
                yield batch

    def first_batch(self) -> dict:
        """Up to `batch_size` rows of the shard's first row group: what the batches look like."""
        parts = self._opened()
        try:
            table = self._read(self.groups[0], parts)
        finally:
            parts.close()
        return self._batch(table.slice(0, self.batch_size))


def batch_type(names):
    """The namedtuple class of a tf batch (petastorm's shape: ``batch.features``)."""
    bad = [n for n in names if not n.isidentifier() or keyword.iskeyword(n) or n.startswith("_")]
    if bad:
        raise ColumnError(f"column(s) {', '.join(map(repr, bad))} cannot be namedtuple fields; rename them in "
                          "Spark (df.withColumnRenamed) or leave them out with columns=")
    return collections.namedtuple("ColumnBatch", list(names))


def make_columns_dataset(batches: ColumnBatches, prefetch: int | None = None):
    """A ``tf.data.Dataset`` of namedtuple batches of column tensors (petastorm's ``make_petastorm_dataset``
    of a ``make_batch_reader``).

    Args:
        batches: What to read (`ColumnBatches`).
        prefetch: Batches prefetched (None: tf.data's autotuning).

    Returns:
        The dataset; its element ``x`` has one tensor per column, ``x.features``. It runs `batches`' pass
        from its start position (a resumed state's); ``dataset.pinstorm_position`` is `batches`, whose
        ``state(k)`` is the state after the caller took k batches (tf.data reads ahead: count batches).

    Raises:
        ColumnError: A column tf has no tensor for (structs, maps), or that does not fit a namedtuple.
    """
    from pinstorm.tensorflow_quiet import tensorflow

    tf = tensorflow()
    pad_heaps()   # from_generator's kernel fixes glibc's mmap threshold: keep row-group-sized buffers in the heaps
    Batch = batch_type(batches.columns)
    specs = {}
    for name, values in batches.first_batch().items():
        if isinstance(values, np.ndarray) and values.dtype != object:
            specs[name] = tf.TensorSpec((None,) + values.shape[1:], tf.as_dtype(values.dtype))
        elif isinstance(values, np.ndarray) or all(isinstance(v, (str, bytes)) for v in values):
            specs[name] = tf.TensorSpec((None,) + np.shape(values)[1:], tf.string)
        else:
            raise ColumnError(f"column {name!r} holds structs or maps, which tf has no tensor for; leave it out "
                              "with columns= (torch gives them as Python objects)")

    def chunks(epoch):   # one element per row group; tf's rebatch cuts them into batches in C++
        for chunk in batches.chunks(int(epoch), batches.skip(int(epoch))):
            for name, values in chunk.items():
                expected, shape = tuple(specs[name].shape[1:]), tuple(np.shape(values)[1:])
                if expected != shape:
                    raise ColumnError(f"column {name!r}: arrays of shape {shape} after {expected}; ragged arrays "
                                      "cannot become one tensor (pad or trim them in Spark first)")
                if specs[name].dtype == tf.string and any(v is None for v in np.ravel(np.asarray(values, object))):
                    raise ColumnError(f"column {name!r} holds nulls; a tf string tensor cannot hold them")
            yield Batch(**chunk)

    def one_epoch(epoch):   # batches never mix epochs: each epoch is rebatched on its own
        return tf.data.Dataset.from_generator(chunks, args=(epoch,), output_signature=Batch(**specs)) \
            .rebatch(batches.batch_size)

    first = batches.start.epoch
    epochs = tf.data.Dataset.counter(first) if batches.num_epochs is None \
        else tf.data.Dataset.range(first, first + batches.num_epochs)
    dataset = epochs.flat_map(one_epoch).prefetch(tf.data.AUTOTUNE if prefetch is None else int(prefetch))
    dataset.pinstorm_position = batches
    return dataset


class TorchColumnsLoader:
    """Batches as dicts of column -> torch tensor (numbers) or Python list (strings, objects): petastorm's
    ``BatchedDataLoader`` shape. Iterable (each pass runs the configured epochs) and a context manager.

    Args:
        batches: What to read (`ColumnBatches`).
    """

    def __init__(self, batches: ColumnBatches):
        import torch

        self._torch = torch
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def state_dict(self) -> dict:
        """Where the caller is after the batches handed over (`ColumnBatches.state_dict`): for
        `load_state_dict`, a new loader's ``state=``, or `make_dataset`-style tf readers of this dataset."""
        return self.batches.state_dict()

    def load_state_dict(self, state) -> None:
        """Make the next pass continue from `state` (checked as ``ColumnBatches(state=...)`` checks it).

        Args:
            state: A `state_dict` of this dataset, same shard and shuffle.

        Raises:
            ResumeStateError: A state this loader cannot continue from.
        """
        self.batches.load_state_dict(state)

    def __iter__(self):
        torch = self._torch
        for batch in self.batches:
            yield {name: torch.from_numpy(np.require(values, requirements=["C", "W"]))
                   if isinstance(values, np.ndarray) and values.dtype != object
                   else (values.tolist() if isinstance(values, np.ndarray) else values)
                   for name, values in batch.items()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
