"""Where a reader is in its data, framework-free: the sample-ID sequence of an epoch, and the resumable state.

One rule for every reader (`reader.make_dataset`, `torch_loader.make_torch_loader`): a sample's ID is its
global row number (row groups in the dataset's order); one stream's epoch is a sequence of IDs computed
from the row counts alone (`stream_ids`: the epoch's row groups in `epochs.epoch_order`, through a seeded
shuffle buffer), and the reader delivers exactly it (`planned_rows`). A position (`Position`: per stream
the epoch and the samples received of it) is then enough to deliver the rest; on another shard layout,
the samples every old stream had received are recomputed and skipped (`consumed_by`).

The state (`state_dict`) is one JSON-able format for both readers: a TensorFlow state resumes a PyTorch
loader (``num_workers=0``) and the other way round. No TensorFlow, no torch here.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import random
import zlib

import numpy as np

from .epochs import IncompleteEpochError, default_shuffle_buffer, epoch_order, epoch_seed, shard_row_groups

STATE_FORMAT = "pinstorm.make_torch_loader/1"   # the name it was born with; TensorFlow states use it too
_MARK_CHUNK = 1 << 16   # sample IDs marked consumed at a time (`consumed_by`)


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


def row_starts(info: dict) -> np.ndarray:
    """The sample ID of each row group's first row: a sample ID is the row's global number, counted
    over the row groups in the dataset's order (parts by name, row groups in order)."""
    return np.concatenate([[0], np.cumsum(info["row_group_rows"], dtype=np.int64)])


def stream_ids(info: dict, groups, *, seed: int, shuffle: bool, shuffle_buffer: int | None, split=None,
               consumed: np.ndarray | None = None):
    """The sample IDs one stream (a shard's `groups`, the `split` = (i, n) of one DataLoader worker, or all)
    delivers in the epoch of `seed` (`epoch_seed`), in order, from the row counts alone (no data read):
    the epoch's row groups (`epoch_order`), their rows in order but those `consumed` (a bool per row),
    through the seeded shuffle buffer. Both readers deliver exactly this sequence."""
    starts, rows = row_starts(info), info["row_group_rows"]
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


def stream_length(info: dict, groups, *, seed: int, shuffle: bool, split=None, consumed=None) -> int:
    """How many samples `stream_ids` delivers (without walking the shuffle buffer)."""
    starts = row_starts(info)
    order = epoch_order(groups, seed, shuffle, split)
    total = sum(int(info["row_group_rows"][g]) for g in order)
    if consumed is not None:
        total -= sum(int(consumed[starts[g]:starts[g + 1]].sum()) for g in order)
    return total


def planned_rows(source, ids, order, *, skip: int, consumed, where: str, epoch: int):
    """(sample ID, jpeg, label) of the sequence `ids` after its first `skip`, read from `source`
    (an `epochs.EpochSource`) in the row-group `order` (only row groups with a row left), each row held
    from its row group's read to its turn; counted (`IncompleteEpochError`)."""
    info = source.info
    starts, rows = row_starts(info), info["row_group_rows"]
    left = np.zeros(info["rows"], dtype=bool)
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


def info_digest(info: dict) -> str:
    """What identifies a dataset's rows: counts per row group and parts with their sizes (not the url,
    not the checksums, which `verify=False` drops)."""
    identity = {"rows": info["rows"], "row_group_rows": info["row_group_rows"],
                "files": {n: [e["row_groups"], e.get("bytes")] for n, e in sorted(info["files"].items())}}
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
    except (ValueError, zlib.error) as error:
        raise ValueError(f"a resume state's bitmap is not packed bits: {error}") from None
    if len(raw) != expected or extra or not inflate.eof:
        raise ValueError(f"a resume state's bitmap does not hold {rows} rows ({expected} bytes)")
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
        "dataset": {"url": source.location.url, "rows": int(source.info["rows"]),
                    "row_groups": int(source.info["row_groups"]), "digest": info_digest(source.info)},
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
    states = [state] if isinstance(state, dict) else list(state)
    if not states:
        raise ValueError("a state is needed (or a list of them, one per rank)")
    digest = info_digest(source.info)
    for s in states:
        if not isinstance(s, dict) or s.get("format") != STATE_FORMAT:
            raise ValueError(f"not a pinstorm reader state ({STATE_FORMAT}): {str(s)[:200]}")
        if s["dataset"]["digest"] != digest:
            raise ValueError(f"the state is of {s['dataset']['url']} (digest {s['dataset']['digest']}), not of "
                             f"{source.location.url} (digest {digest}): another dataset")
    if len({s["seed"] for s in states}) != 1:
        raise ValueError(f"the states have different seeds {sorted({s['seed'] for s in states})}: not one run")
    source.base_seed = int(states[0]["seed"])
    shard = None if source.shard is None else list(source.shard)
    same = [s for s in states if s["shard"] == shard and s["num_workers"] == num_workers
            and s["shuffle"] == shuffle and s["shuffle_buffer"] == shuffle_buffer]
    if same:
        s = same[0]
        return Position(dict(enumerate(s["streams"])), s["next_stream"],
                        {int(e): unpack_bits(b, source.info["rows"]) for e, b in s["consumed"].items()})
    return consumed_by(states, source.info, streams)


def consumed_by(states, info: dict, streams: int) -> Position:
    """`streams` streams at the start of the states' earliest epoch, skipping every sample the states'
    streams had received (recomputed from their `stream_ids`) in each epoch they are in."""
    count = {1 if s["shard"] is None else s["shard"][1] for s in states}
    indexes = sorted(0 if s["shard"] is None else s["shard"][0] for s in states)
    if len(count) != 1 or indexes != list(range(count.pop())):
        raise ValueError(f"states of shards {[s['shard'] for s in states]}: give one state of every shard of the "
                         "run (each rank's), so that what each had received is known")
    epochs = [e for s in states for e, _ in s["streams"]]
    first, last = min(epochs), max(epochs)
    consumed = {e: np.zeros(info["rows"], dtype=bool) for e in range(first, last + 1)}
    for s in states:
        groups = shard_row_groups(info, s["shard"])
        earlier = {int(e): unpack_bits(b, info["rows"]) for e, b in s["consumed"].items()}
        for e, bits in earlier.items():
            if e in consumed:
                consumed[e] |= bits
        workers = s["num_workers"]
        for stream, (at, received) in enumerate(s["streams"]):
            split = (stream, workers) if workers else None
            for e in range(first, at + 1):
                ids = stream_ids(info, groups, seed=epoch_seed(s["seed"], e), shuffle=s["shuffle"],
                                 shuffle_buffer=s["shuffle_buffer"], split=split, consumed=earlier.get(e))
                ids = itertools.islice(ids, received if e == at else None)
                while chunk := list(itertools.islice(ids, _MARK_CHUNK)):   # memory bounded, not per row received
                    consumed[e][np.asarray(chunk, dtype=np.int64)] = True
    return Position(Position.fresh(first, streams).streams, 0, consumed)
