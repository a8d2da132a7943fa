"""`positions.planned_chunks` (make_dataset's row source) hands over, as arrays, exactly the rows of the plan:
the sample IDs of `stream_ids` after those already delivered, each with its stored bytes and label (a sample
ID is the row's global number), for every shuffle, shard, resume point and earlier layout; `planned_rows`
(the torch loader's, one row at a time) the same; and an epoch is counted (`IncompleteEpochError`)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pinstorm.pipeline.epochs import IncompleteEpochError, epoch_order, epoch_seed, open_epochs
from pinstorm.pipeline.positions import planned_chunks, planned_rows, stream_ids

pytest_plugins = ["conftest_pipeline"]


def _plan(source, epoch, *, shuffle, buffer, consumed):
    seed = epoch_seed(source.base_seed, epoch)
    order = epoch_order(source.groups, seed, shuffle)
    return (lambda: stream_ids(source.info, source.groups, seed=seed, shuffle=shuffle, shuffle_buffer=buffer,
                               consumed=consumed)), order


@pytest.fixture(scope="module")
def stored(digits_dataset):
    """Every stored (bytes, label), by global row number: parts by name, row groups in order."""
    parts = sorted(Path(digits_dataset[0]).glob("*.parquet"))
    tables = [pq.ParquetFile(p).read(columns=["image", "label"]) for p in parts]
    return ([b for t in tables for b in t.column("image").to_pylist()],
            [x for t in tables for x in t.column("label").to_pylist()])


@pytest.mark.parametrize("shuffle,buffer", [(False, None), (True, None), (True, 7), (True, 1)])
@pytest.mark.parametrize("shard", [None, (1, 3)])
@pytest.mark.parametrize("skip", [0, 1, "half"])
@pytest.mark.parametrize("size", [1, 64, 256])
def test_the_chunks_are_the_plans_rows(digits_dataset, stored, shuffle, buffer, shard, skip, size):
    source = open_epochs(digits_dataset[0], shard, shuffle=shuffle, seed=5)
    rng = np.random.default_rng(size)
    for epoch, consumed in ((0, None), (3, rng.random(source.info.rows) < 0.3)):
        ids, order = _plan(source, epoch, shuffle=shuffle, buffer=buffer, consumed=consumed)
        first = sum(1 for _ in ids()) // 2 if skip == "half" else skip
        rows = list(planned_rows(source, ids(), order, skip=first, consumed=consumed, where="w", epoch=epoch))
        chunks = list(planned_chunks(source, ids(), order, skip=first, consumed=consumed, where="w", epoch=epoch,
                                     size=size))
        plan = list(ids())[first:]
        assert plan, "the plan delivers rows"
        assert [(i, bytes(j), label) for i, j, label in rows] == [(i, stored[0][i], stored[1][i]) for i in plan]
        assert [len(c[0]) for c in chunks[:-1]] == [size] * (len(chunks) - 1) and 0 < len(chunks[-1][0]) <= size
        assert all(c[0].dtype == np.int64 and c[1].dtype == object and c[2].dtype == np.int32 for c in chunks)
        assert np.concatenate([c[0] for c in chunks]).tolist() == [r[0] for r in rows]
        assert [bytes(j) for c in chunks for j in c[1]] == [bytes(r[1]) for r in rows]
        assert np.concatenate([c[2] for c in chunks]).tolist() == [r[2] for r in rows]


class _Dropping:
    """A real epoch source whose reads lose the last row group, or hand over one row short."""

    def __init__(self, source, how):
        self.source, self.how = source, how
        self.info, self.where = source.info, source.where

    def row_groups(self, order):
        order = list(order)
        for i, (g, (jpegs, labels)) in enumerate(self.source.row_groups(order)):
            if i == len(order) - 1:
                if self.how == "lost":
                    return
                jpegs, labels = jpegs[1:], labels[1:]
            yield g, (jpegs, labels)


@pytest.mark.parametrize("how,message", [("lost", r"epoch 2 delivered \d+ rows, expected \d+; the reader failed"),
                                         ("short", "the dataset changed after conversion")])
def test_a_lost_or_short_row_group_ends_the_epoch_with_an_error(digits_dataset, how, message):
    source = open_epochs(digits_dataset[0], None, shuffle=True, seed=5)
    ids, order = _plan(source, 2, shuffle=True, buffer=None, consumed=None)
    with pytest.raises(IncompleteEpochError, match=message):
        list(planned_chunks(_Dropping(source, how), ids(), order, skip=3, consumed=None, where="w", epoch=2, size=64))


def test_ids_not_of_the_plan_are_refused(digits_dataset):
    source = open_epochs(digits_dataset[0], None, shuffle=False, seed=5)
    ids, order = _plan(source, 0, shuffle=False, buffer=None, consumed=None)
    twice = itertools.chain([0, 1, 2], [1], ids())   # a row handed over twice
    with pytest.raises(IncompleteEpochError, match="delivered 0 rows"):
        list(planned_chunks(source, twice, order, skip=0, consumed=None, where="w", epoch=0, size=8))
    longer = itertools.chain(ids(), [0])   # one more than the epoch holds
    with pytest.raises(IncompleteEpochError, match="the reader failed"):
        list(planned_chunks(source, longer, order, skip=0, consumed=None, where="w", epoch=0, size=8))
