"""Where a reader is in its data, framework-free: the sample-ID sequence of an epoch, and the resumable state.

One rule for every reader (`reader.make_dataset`, `torch_loader.make_torch_loader`): a sample's ID is its
global row number (row groups in the dataset's order); one stream's epoch is a sequence of IDs computed
from the row counts alone (`stream_ids`: the epoch's row groups in `epochs.epoch_order`, through a seeded
shuffle buffer), and the reader delivers exactly it (`planned_chunks` as arrays, for tf.data;
`planned_rows` a row at a time, for the torch loader). A position (`Position`: per stream the epoch and
the samples received of it) is then enough to deliver the rest; on another shard layout, the samples
every old stream had received are recomputed and skipped (`consumed_by`).

The state (`state_dict`) is one JSON-able format for both readers: a TensorFlow state resumes a PyTorch
loader (``num_workers=0``) and the other way round. No TensorFlow, no torch here.

A state is read from a file (a checkpoint), so `resume_position` checks it against the epoch plan before
any work that grows with what it says (`ResumeStateError`, naming the field): every value of its type,
epochs in [0, `MAX_EPOCH`] (`epoch_seed` works modulo 2**31 - 1, and no run reaches 2**31 epochs),
samples received in [0, what that stream's epoch holds], at most `MAX_STREAMS` streams. Resuming on
another layout costs O(row groups) per epoch the states' streams span, and O(rows) memory per epoch:
they may be at most `MAX_EPOCH_SPAN` epochs apart.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import random
import re
import zlib

import numpy as np

from .contracts import DatasetInfo
from .errors import PipelineError
from .epochs import IncompleteEpochError, default_shuffle_buffer, epoch_order, epoch_seed, shard_row_groups

STATE_FORMAT = "pinstorm.make_torch_loader/1"   # the name it was born with; TensorFlow states use it too
_MARK_CHUNK = 1 << 16   # sample IDs marked consumed at a time (`consumed_by`)
MAX_EPOCH = 2**31 - 1   # the last epoch a state may name (`epoch_seed` is modulo 2**31 - 1)
MAX_EPOCH_SPAN = 64     # epochs apart the streams of states resumed on another layout may be (`consumed_by`)
MAX_STREAMS = 1024      # DataLoader workers a state may name
_MAX_SEED = 2**63
_EPOCH_KEY = re.compile(r"^(0|[1-9][0-9]{0,9})$")


class ResumeStateError(PipelineError, ValueError):
    """A reader state this dataset's reader cannot have written: another dataset or run, a field of the
    wrong type, or a position outside the epoch plan (a negative count, an epoch past `MAX_EPOCH`, more
    samples received than the stream's epoch holds)."""


def _shuffled(rows, size: int, rng: random.Random):
    """Rows through a shuffle buffer of `size` (tf.data's: each row out is a random one of the buffer)."""
    buffer = []
    for row in rows:
        if len(buffer) < size:
            buffer.append(row)
            continue
        at = rng.randrange(size)
        yield buffer[at]
        buffer[at] = row
    rng.shuffle(buffer)
    yield from buffer


def row_starts(info: DatasetInfo) -> np.ndarray:
    """The sample ID of each row group's first row: a sample ID is the row's global number, counted
    over the row groups in the dataset's order (parts by name, row groups in order)."""
    return np.concatenate([[0], np.cumsum(info.row_group_rows, dtype=np.int64)])


def stream_ids(info: DatasetInfo, groups, *, seed: int, shuffle: bool, shuffle_buffer: int | None, split=None,
               consumed: np.ndarray | None = None):
    """The sample IDs one stream (a shard's `groups`, the `split` = (i, n) of one DataLoader worker, or all)
    delivers in the epoch of `seed` (`epoch_seed`), in order, from the row counts alone (no data read):
    the epoch's row groups (`epoch_order`), their rows in order but those `consumed` (a bool per row),
    through the seeded shuffle buffer. Both readers deliver exactly this sequence."""
    starts, rows = row_starts(info), info.row_group_rows
    order = epoch_order(groups, seed, shuffle, split)

    def ids():
        for g in order:
            if consumed is None:
                yield from range(int(starts[g]), int(starts[g] + rows[g]))
            else:
                yield from (np.flatnonzero(~consumed[starts[g]:starts[g + 1]]) + starts[g]).tolist()

    if not shuffle:
        return ids()
    size = shuffle_buffer
    if size is None:
        count = split[1] if split else 1
        expected = sum(rows[g] for g in groups)
        size = default_shuffle_buffer(info, max(1, expected // count), max(1, len(groups) // count), share=count)
    return _shuffled(ids(), size, random.Random(seed * 64 + (split[0] if split else 0)))


def stream_length(info: DatasetInfo, groups, *, seed: int, shuffle: bool, split=None, consumed=None) -> int:
    """How many samples `stream_ids` delivers (without walking the shuffle buffer)."""
    starts = row_starts(info)
    order = epoch_order(groups, seed, shuffle, split)
    total = sum(int(info.row_group_rows[g]) for g in order)
    if consumed is not None:
        total -= sum(int(consumed[starts[g]:starts[g + 1]].sum()) for g in order)
    return total


def planned_rows(source, ids, order, *, skip: int, consumed, where: str, epoch: int):
    """(sample ID, jpeg, label) of the sequence `ids` after its first `skip`, read from `source`
    (an `epochs.EpochSource`) in the row-group `order` (only row groups with a row left), each row held
    from its row group's read to its turn; counted (`IncompleteEpochError`)."""
    info = source.info
    starts, rows = row_starts(info), info.row_group_rows
    left = np.zeros(info.rows, dtype=bool)
    for g in order:
        left[starts[g]:starts[g + 1]] = True
    if consumed is not None:
        left &= ~consumed
    for sample in itertools.islice(ids, skip):
        left[sample] = False
    expected = int(left.sum())
    groups = source.row_groups([g for g in order if left[starts[g]:starts[g + 1]].any()])
    held, delivered = {}, 0
    for sample in ids:
        while sample not in held:
            g, (jpegs, labels) = next(groups, (None, (None, None)))
            if g is None:
                raise IncompleteEpochError(f"{where}: epoch {epoch} delivered {delivered} rows, expected "
                                           f"{expected}; the reader failed")
            if len(labels) != rows[g]:
                raise IncompleteEpochError(f"{source.where}: delivered {len(labels)} rows, expected "
                                           f"{rows[g]}; the dataset changed after conversion")
            labels = labels.tolist()
            for at in np.flatnonzero(left[starts[g]:starts[g + 1]]).tolist():
                held[int(starts[g]) + at] = (jpegs[at], labels[at])
        jpeg, label = held.pop(sample)
        delivered += 1
        yield sample, jpeg, label
    if delivered != expected:
        raise IncompleteEpochError(f"{where}: epoch {epoch} delivered {delivered} rows, expected "
                                   f"{expected}; the reader failed")


def planned_chunks(source, ids, order, *, skip: int, consumed, where: str, epoch: int, size: int):
    """`planned_rows` as arrays: ``(sample IDs int64, jpegs object, labels int32)`` of `size` rows at a time
    (the last fewer), the same rows in the same order, checked and counted the same way
    (`IncompleteEpochError`), with no Python work per row but drawing the IDs: a chunk is gathered from its
    row groups' arrays, and a delivered row's bytes are let go at once (each row is held from its row
    group's read to its turn, as `planned_rows` holds it).

    Args:
        source: The epoch source (`epochs.EpochSource`).
        ids: The epoch's sample IDs (`stream_ids`), an iterator.
        order: The epoch's row groups in reading order (`epochs.epoch_order`).
        skip: Leading IDs of `ids` already delivered (a resumed position).
        consumed: A bool per row consumed under another layout, or None.
        where: The stream, for error messages.
        epoch: The epoch, for error messages.
        size: Rows per chunk.

    Raises:
        IncompleteEpochError: A row group missing or of another length than recorded, or the epoch's count off.
    """
    info = source.info
    starts, rows = row_starts(info), np.asarray(info.row_group_rows, dtype=np.int64)
    left = np.zeros(info.rows, dtype=bool)
    for g in order:
        left[starts[g]:starts[g + 1]] = True
    if consumed is not None:
        left &= ~consumed
    head = np.fromiter(itertools.islice(ids, skip), dtype=np.int64)
    left[head] = False
    expected = int(left.sum())
    # Rows still to come per row group: a row group's arrays are dropped when its last row is delivered.
    marked = np.concatenate([[0], np.cumsum(left, dtype=np.int64)])
    pending = marked[starts[1:]] - marked[starts[:-1]]
    groups = source.row_groups([g for g in order if pending[g]])
    held, delivered = {}, 0   # row group -> [jpegs, labels]

    def short():
        return IncompleteEpochError(f"{where}: epoch {epoch} delivered {delivered} rows, expected {expected}; "
                                    "the reader failed")

    while True:
        chunk = np.fromiter(itertools.islice(ids, size), dtype=np.int64)
        if not len(chunk):
            break
        if not left[chunk].all() or len(np.unique(chunk)) != len(chunk):   # a row not due: not this plan
            raise short()
        left[chunk] = False
        of = np.searchsorted(starts, chunk, side="right") - 1
        at = chunk - starts[of]
        needed = np.unique(of)
        for g in needed.tolist():
            while g not in held:
                read, (jpegs, labels) = next(groups, (None, (None, None)))
                if read is None:
                    raise short()
                if len(labels) != rows[read]:
                    raise IncompleteEpochError(f"{source.where}: delivered {len(labels)} rows, expected "
                                               f"{rows[read]}; the dataset changed after conversion")
                held[read] = [np.array(jpegs, dtype=object, copy=True), np.asarray(labels, dtype=np.int32)]
        if len(needed) == 1:
            g = int(needed[0])
            out_jpegs, out_labels = held[g][0][at], held[g][1][at]
        else:
            out_jpegs, out_labels = np.empty(len(chunk), dtype=object), np.empty(len(chunk), dtype=np.int32)
            for g in needed.tolist():
                mine = of == g
                out_jpegs[mine], out_labels[mine] = held[g][0][at[mine]], held[g][1][at[mine]]
        for g, count in zip(*np.unique(of, return_counts=True)):
            g = int(g)
            held[g][0][at[of == g]] = None   # delivered: its bytes let go
            pending[g] -= count
            if pending[g] <= 0:
                del held[g]
        delivered += len(chunk)
        yield chunk, out_jpegs, out_labels
    if delivered != expected:
        raise short()


def info_digest(info: DatasetInfo) -> str:
    """What identifies a dataset's rows: counts per row group and parts with their sizes (not the url,
    not the checksums, which `verify=False` drops)."""
    identity = {"rows": info.rows, "row_group_rows": info.row_group_rows,
                "files": {n: [e["row_groups"], e.get("bytes")] for n, e in sorted(info.files.items())}}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def pack_bits(bits: np.ndarray) -> str:
    """A bool per row as JSON-able text (packed, zlib, base64): ImageNet's 1.28 M rows in ~160 kB at most."""
    return base64.b64encode(zlib.compress(np.packbits(bits).tobytes(), 6)).decode("ascii")


def unpack_bits(text: str, rows: int) -> np.ndarray:
    """`pack_bits` undone; a state comes from a file, so the bitmap must inflate to exactly `rows` bits
    (never past them: a zlib bomb stops at the expected size)."""
    expected = (rows + 7) // 8
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(base64.b64decode(text, validate=True), expected)
        extra = inflate.unconsumed_tail or inflate.flush(1)
    except (ValueError, TypeError, zlib.error) as error:
        raise ResumeStateError(f"a resume state's bitmap is not packed bits: {error}") from None
    if len(raw) != expected or extra or not inflate.eof:
        raise ResumeStateError(f"a resume state's bitmap does not hold {rows} rows ({expected} bytes)")
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=rows).astype(bool)


class Position:
    """Where the caller is in the data: per stream (DataLoader worker, or 0), the epoch and how many samples
    of that epoch's `stream_ids` it has received; the next stream to hand over a batch; and the samples of
    some epochs already consumed under another shard layout (a bool per row), which these streams skip."""

    def __init__(self, streams: dict, next_stream: int = 0, consumed: dict | None = None):
        self.streams = {int(s): (int(e), int(n)) for s, (e, n) in streams.items()}
        self.next_stream, self.consumed = int(next_stream), dict(consumed or {})

    @classmethod
    def fresh(cls, epoch: int, streams: int) -> "Position":
        return cls({s: (epoch, 0) for s in range(streams)})

    @property
    def epoch(self) -> int:
        return min(e for e, _ in self.streams.values())

    def copy(self) -> "Position":
        return Position(self.streams, self.next_stream, self.consumed)


def state_dict(source, position: Position, *, shuffle: bool, shuffle_buffer, num_workers: int, streams: int) -> dict:
    """The JSON-able state of `position` in `source` (an `epochs.EpochSource`): dataset identity, seed, shard
    layout, per stream (epoch, samples received), and the samples of those epochs consumed under an earlier
    layout (`pack_bits`)."""
    epoch = position.epoch
    return {
        "format": STATE_FORMAT,
        "dataset": {"url": source.location.url, "rows": int(source.info.rows),
                    "row_groups": int(source.info.row_groups), "digest": info_digest(source.info)},
        "seed": int(source.base_seed), "shuffle": bool(shuffle),
        "shuffle_buffer": None if shuffle_buffer is None else int(shuffle_buffer),
        "shard": None if source.shard is None else list(source.shard), "num_workers": int(num_workers),
        "epoch": epoch, "streams": [list(position.streams[s]) for s in range(streams)],
        "next_stream": position.next_stream,
        "consumed": {str(e): pack_bits(bits) for e, bits in sorted(position.consumed.items()) if e >= epoch},
    }


def resume_position(state, source, *, shuffle: bool, shuffle_buffer, num_workers: int, streams: int) -> Position:
    """Where to continue from `state` (a `state_dict`, or a list of them, one per rank); sets `source`'s seed
    to the state's.

    The same shard, `num_workers` and shuffle settings: each stream skips what it had delivered, and the
    pass is the rest of the uninterrupted one, sample for sample. Another layout: give every rank's
    state; this epoch's streams then deliver only the samples none of them had received (`consumed_by`).
    """
    if isinstance(state, dict):
        states = [state]
    elif isinstance(state, (list, tuple)) and len(state) <= MAX_STREAMS:
        states = list(state)
    else:
        raise ResumeStateError(f"a state is a state_dict() or a list of them (one per rank, at most {MAX_STREAMS}), "
                               f"not {_shown(state)}")
    if not states:
        raise ResumeStateError("a state is needed (or a list of them, one per rank)")
    digest = info_digest(source.info)
    states = [check_state(s, source.info, digest, where=source.location.url) for s in states]
    if len({s["seed"] for s in states}) != 1:
        raise ResumeStateError(f"the states have different seeds {sorted({s['seed'] for s in states})}: not one run")
    source.base_seed = int(states[0]["seed"])
    shard = None if source.shard is None else list(source.shard)
    same = [s for s in states if s["shard"] == shard and s["num_workers"] == num_workers
            and s["shuffle"] == shuffle and s["shuffle_buffer"] == shuffle_buffer]
    if same:
        s = same[0]
        consumed = {int(e): unpack_bits(b, source.info.rows) for e, b in s["consumed"].items()}
        check_received(s, source.info, source.groups, consumed)
        return Position(dict(enumerate(s["streams"])), s["next_stream"], consumed)
    return consumed_by(states, source.info, streams)


def _shown(value) -> str:
    """`value` for an error message, short (an int of any size, a container of any length)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value) if isinstance(value, (int, float, bool, type(None))) else type(value).__name__
    if isinstance(value, str):
        text = repr(value[:60]) + ("..." if len(value) > 60 else "")
    return text


def _integer(value, what: str, low: int, high: int) -> int:
    """`value` if it is an integer in [low, high] (not a bool, not a float), else `ResumeStateError`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise ResumeStateError(f"a resume state's {what} must be an integer, not {_shown(value)}")
    if not low <= value <= high:
        raise ResumeStateError(f"a resume state's {what} is {_shown(int(value))}, outside [{low}, {high}]")
    return int(value)


def check_state(s, info: DatasetInfo, digest: str, *, where: str = "the dataset") -> dict:
    """`s` (one `state_dict`, from a file) checked field by field against the dataset (`info`, its
    `info_digest`), in O(streams): types, the dataset's identity, epochs in [0, `MAX_EPOCH`] and samples
    received in [0, rows] (`check_received` then bounds them by the stream's epoch). A normalized copy,
    or `ResumeStateError` naming the field."""
    if not isinstance(s, dict) or s.get("format") != STATE_FORMAT:
        raise ResumeStateError(f"not a pinstorm reader state ({STATE_FORMAT}): {str(s)[:200]}")
    dataset = s.get("dataset")
    if not isinstance(dataset, dict) or not isinstance(dataset.get("digest"), str):
        raise ResumeStateError(f"a resume state's dataset must name its digest, not {_shown(dataset)}")
    if dataset["digest"] != digest:
        raise ResumeStateError(f"the state is of {str(dataset.get('url'))[:300]} (digest {dataset['digest'][:64]}), "
                               f"not of {where} (digest {digest}): another dataset")
    rows, groups = int(info.rows), int(info.row_groups)
    seed = _integer(s.get("seed"), "seed", -_MAX_SEED, _MAX_SEED)
    if not isinstance(s.get("shuffle"), bool):
        raise ResumeStateError(f"a resume state's shuffle must be true or false, not {_shown(s.get('shuffle'))}")
    buffer = s.get("shuffle_buffer")
    buffer = None if buffer is None else _integer(buffer, "shuffle_buffer", 1, MAX_EPOCH)
    shard = s.get("shard")
    if shard is not None:
        if not isinstance(shard, (list, tuple)) or len(shard) != 2:
            raise ResumeStateError(f"a resume state's shard must be [index, count] or null, not {_shown(shard)}")
        count = _integer(shard[1], "shard count", 1, groups)
        shard = [_integer(shard[0], "shard index", 0, count - 1), count]
    workers = _integer(s.get("num_workers"), "num_workers", 0, MAX_STREAMS)
    epoch = _integer(s.get("epoch"), "epoch", 0, MAX_EPOCH)
    streams = s.get("streams")
    if not isinstance(streams, (list, tuple)) or len(streams) != max(1, workers):
        raise ResumeStateError(f"a resume state with num_workers={workers} has {max(1, workers)} streams, not "
                               f"{len(streams) if isinstance(streams, (list, tuple)) else _shown(streams)}")
    positions = []
    for i, stream in enumerate(streams):
        if not isinstance(stream, (list, tuple)) or len(stream) != 2:
            raise ResumeStateError(f"a resume state's stream {i} must be [epoch, samples received], not "
                                   f"{_shown(stream)}")
        positions.append((_integer(stream[0], f"stream {i} epoch", 0, MAX_EPOCH),
                          _integer(stream[1], f"stream {i} samples received", 0, rows)))
    if epoch != min(e for e, _ in positions):
        raise ResumeStateError(f"a resume state's epoch {epoch} is not its streams' earliest "
                               f"({min(e for e, _ in positions)})")
    next_stream = _integer(s.get("next_stream"), "next_stream", 0, len(positions) - 1)
    consumed = s.get("consumed")   # bitmaps of the epochs a resume on another layout spanned (`consumed_by`)
    last = epoch + MAX_EPOCH_SPAN
    if not isinstance(consumed, dict) or len(consumed) > MAX_EPOCH_SPAN + 1:
        raise ResumeStateError(f"a resume state's consumed must map at most {MAX_EPOCH_SPAN + 1} epochs to bitmaps, "
                               f"not {_shown(consumed) if not isinstance(consumed, dict) else len(consumed)}")
    for key, bits in consumed.items():
        if not isinstance(key, str) or not _EPOCH_KEY.match(key) or not epoch <= int(key) <= last:
            raise ResumeStateError(f"a resume state's consumed names epoch {_shown(key)}, not one in "
                                   f"[{epoch}, {last}] (its epoch, at most {MAX_EPOCH_SPAN} on)")
        if not isinstance(bits, str):
            raise ResumeStateError(f"a resume state's consumed bitmap of epoch {key} is {_shown(bits)}, not text")
    return {**s, "seed": seed, "shuffle_buffer": buffer, "shard": shard, "num_workers": workers, "epoch": epoch,
            "streams": [list(p) for p in positions], "next_stream": next_stream, "consumed": dict(consumed)}


def _rows_left(info: DatasetInfo, consumed: np.ndarray | None) -> np.ndarray:
    """Rows of each row group not `consumed` (all of them without a bitmap): O(rows) once, O(1) per group."""
    rows = np.asarray(info.row_group_rows, dtype=np.int64)
    if consumed is None:
        return rows
    marked = np.concatenate([[0], np.cumsum(consumed, dtype=np.int64)])
    starts = row_starts(info)
    return rows - (marked[starts[1:]] - marked[starts[:-1]])


def check_received(s: dict, info: DatasetInfo, groups, consumed: dict) -> None:
    """Every stream of `s` (checked by `check_state`) has received at most what its epoch holds: the rows
    of its row groups (`epoch_order`) that no earlier layout `consumed`. O(row groups) per stream."""
    workers, left = s["num_workers"], {}
    for i, (epoch, received) in enumerate(s["streams"]):
        if epoch not in left:
            left[epoch] = _rows_left(info, consumed.get(epoch))
        order = epoch_order(groups, epoch_seed(s["seed"], epoch), s["shuffle"], (i, workers) if workers else None)
        holds = int(left[epoch][order].sum()) if order else 0
        if received > holds:
            raise ResumeStateError(f"a resume state's stream {i} has received {received} samples of epoch {epoch}, "
                                   f"more than that epoch of the stream holds ({holds})")


def consumed_by(states, info: DatasetInfo, streams: int) -> Position:
    """`streams` streams at the start of the states' earliest epoch, skipping every sample the states'
    streams had received (recomputed from their `stream_ids`) in each epoch they are in: an epoch a
    stream finished is all its row groups (O(row groups)), the epoch it is in its first samples received.
    The states are `check_state`'s; their streams at most `MAX_EPOCH_SPAN` epochs apart."""
    count = {1 if s["shard"] is None else s["shard"][1] for s in states}
    indexes = sorted(0 if s["shard"] is None else s["shard"][0] for s in states)
    if len(count) != 1 or indexes != list(range(count.pop())):
        raise ResumeStateError(f"states of shards {[s['shard'] for s in states]}: give one state of every shard "
                               "of the run (each rank's), so that what each had received is known")
    epochs = [e for s in states for e, _ in s["streams"]]
    first, last = min(epochs), max(epochs)
    if last - first > MAX_EPOCH_SPAN:   # before a bitmap per epoch is made
        raise ResumeStateError(f"the states' streams are at epochs {first} to {last}: resuming on another layout "
                               f"takes streams at most {MAX_EPOCH_SPAN} epochs apart")
    plans = []
    for s in states:   # every state's positions within its epochs' plan, before the bitmaps are made
        groups = shard_row_groups(info, s["shard"])
        earlier = {int(e): unpack_bits(b, info.rows) for e, b in s["consumed"].items()}
        check_received(s, info, groups, earlier)
        plans.append((s, groups, earlier))
    starts = row_starts(info)
    consumed = {e: np.zeros(info.rows, dtype=bool) for e in range(first, last + 1)}
    for s, groups, earlier in plans:
        for e, bits in earlier.items():
            if e in consumed:
                consumed[e] |= bits
        workers = s["num_workers"]
        for stream, (at, received) in enumerate(s["streams"]):
            split = (stream, workers) if workers else None
            for e in range(first, at):   # epochs the stream finished: all its rows (those `earlier` are marked)
                for g in epoch_order(groups, epoch_seed(s["seed"], e), s["shuffle"], split):
                    consumed[e][starts[g]:starts[g + 1]] = True
            ids = stream_ids(info, groups, seed=epoch_seed(s["seed"], at), shuffle=s["shuffle"],
                             shuffle_buffer=s["shuffle_buffer"], split=split, consumed=earlier.get(at))
            ids = itertools.islice(ids, received)
            while chunk := list(itertools.islice(ids, _MARK_CHUNK)):   # memory bounded, not per row received
                consumed[at][np.asarray(chunk, dtype=np.int64)] = True
    return Position(Position.fresh(first, streams).streams, 0, consumed)
