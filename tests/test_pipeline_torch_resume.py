"""make_torch_loader resumes mid-epoch: the rest of the uninterrupted run sample for sample, or, on another
shard layout or number of workers, every sample of the epoch once (issue 20, part 3)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from pinstorm.pipeline import dataset_info
from pipeline_support import read_rows

pytest_plugins = ["conftest_pipeline"]
torch = pytest.importorskip("torch")

from pinstorm.pipeline import make_torch_loader  # noqa: E402 (only with torch installed)
from pinstorm.pipeline.epochs import epoch_seed, shard_row_groups  # noqa: E402
from pinstorm.pipeline.torch_loader import stream_ids  # noqa: E402

BATCH = 32


def _loader(url, **kw):
    kw = {"batch_size": BATCH, "image_size": 16, "seed": 11, "return_ids": True, **kw}
    return make_torch_loader(url, **kw)


def _take(loader, steps=None):
    """(ids, images) of the first `steps` batches (all when None), and the state after them."""
    ids, images = [], []
    batches = iter(loader)
    for step, (x, _, i) in enumerate(batches if steps != 0 else ()):
        ids.append(i.clone())
        images.append(x.clone())
        if steps is not None and step + 1 == steps:
            break
    del batches   # the workers stop: the kill
    state = json.loads(json.dumps(loader.state_dict()))   # what a checkpoint keeps
    return torch.cat(ids) if ids else torch.empty(0, dtype=torch.int64), images, state


def _digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def _pixels(ids, images) -> dict:
    return {int(i): x for i, x in zip(ids, torch.cat(images))} if images else {}


@pytest.mark.parametrize("workers,shuffle,training", [(0, True, True), (0, False, False), (2, True, True)])
def test_resumed_at_any_step_the_run_is_the_uninterrupted_one(digits_dataset, workers, shuffle, training):
    url, result = digits_dataset
    kw = dict(num_workers=workers, shuffle=shuffle, training=training)
    whole, whole_images, _ = _take(_loader(url, **kw))
    assert sorted(whole.tolist()) == list(range(result.rows))
    batches = len(whole_images)
    steps = range(batches + 1) if workers == 0 else (0, 1, batches // 2, batches - 1)
    pixels = _pixels(whole, whole_images)
    for k in steps:
        first, first_images, state = _take(_loader(url, **kw), k)
        assert state["epoch"] == 0 and sum(n for _, n in state["streams"]) == len(first) == min(
            result.rows, sum(len(x) for x in whole_images[:k]))
        resumed_loader = _loader(url, **kw)
        resumed_loader.load_state_dict(state)
        rest, rest_images, _ = _take(resumed_loader)
        assert _digest(torch.cat([first, rest])) == _digest(whole), k
        if training:   # each sample cropped and flipped as in the uninterrupted run, wherever it came
            assert all(torch.equal(x, pixels[i]) for i, x in _pixels(rest, rest_images).items()), k


def test_sample_ids_are_planned_from_row_counts_and_name_real_rows(digits_dataset):
    url, _ = digits_dataset
    info = dataset_info(url)
    ids, _, _ = _take(_loader(url, shard=(1, 2), training=False))
    planned = list(stream_ids(info, shard_row_groups(info, (1, 2)), seed=epoch_seed(11, 0), shuffle=True,
                              shuffle_buffer=None))
    assert ids.tolist() == planned
    stored = [r["label"] for r in read_rows(url)]
    labels = torch.cat([y for _, y, _ in _loader(url, shard=(1, 2), training=False)])
    assert labels.tolist() == [stored[i] for i in planned]


def _once(*id_lists, rows: int, times: int = 1) -> bool:
    counts = Counter(i for ids in id_lists for i in ids.tolist())
    return counts == Counter({i: times for i in range(rows)})


def test_two_shards_resume_as_one(digits_dataset):
    url, result = digits_dataset
    first0, _, state0 = _take(_loader(url, shard=(0, 2)), 2)
    first1, _, state1 = _take(_loader(url, shard=(1, 2)), 1)
    merged = _loader(url)
    merged.load_state_dict([state0, state1])
    rest, _, _ = _take(merged)
    assert _once(first0, first1, rest, rows=result.rows)
    # The next epoch is whole: the same, with two epochs in the resumed pass.
    twice = _loader(url, num_epochs=2)
    twice.load_state_dict([state1, state0])
    rest2, _, after = _take(twice)
    assert _once(first0, first1, rest2, rows=result.rows, times=2)
    assert after["epoch"] == 1 and after["consumed"] == {}


def test_one_shard_resumes_as_two_with_the_same_pixels(digits_dataset):
    url, result = digits_dataset
    whole, whole_images, _ = _take(_loader(url))
    first, _, state = _take(_loader(url), 3)
    parts = []
    for index in range(2):
        loader = _loader(url, shard=(index, 2), seed=None)   # the state's seed is the run's
        loader.load_state_dict(state)
        parts.append(_take(loader))
    assert _once(first, *(ids for ids, _, _ in parts), rows=result.rows)
    pixels = _pixels(whole, whole_images)
    for ids, images, _ in parts:
        assert all(torch.equal(x, pixels[i]) for i, x in _pixels(ids, images).items())
    # A resumed, re-sharded run resumes too: its own state continues it.
    resumed = _loader(url, shard=(0, 2))
    resumed.load_state_dict(state)
    ids, _, state2 = _take(resumed, 1)
    again = _loader(url, shard=(0, 2))
    again.load_state_dict(state2)
    tail, _, _ = _take(again)
    assert Counter(ids.tolist() + tail.tolist()) == Counter(parts[0][0].tolist())


def test_two_workers_resume_in_the_calling_process(digits_dataset):
    url, result = digits_dataset
    first, _, state = _take(_loader(url, num_workers=2), 3)
    assert len(state["streams"]) == 2 and state["num_workers"] == 2
    alone = _loader(url, num_workers=0)
    alone.load_state_dict(state)
    rest, _, _ = _take(alone)
    assert _once(first, rest, rows=result.rows)


def test_a_state_is_small_json_and_names_its_dataset(digits_dataset, digits_val_dataset):
    url, _ = digits_dataset
    _, _, state = _take(_loader(url), 2)
    assert set(state) >= {"dataset", "seed", "epoch", "shard", "num_workers", "streams", "consumed"}
    assert state["dataset"]["rows"] == dataset_info(url)["rows"] and len(json.dumps(state)) < 2000
    other = _loader(digits_val_dataset[0])
    with pytest.raises(ValueError, match=r"the state is of .*train .*digest \w+\), not of .*val .*digest \w+\)"):
        other.load_state_dict(state)
    one_shard = _take(_loader(url, shard=(0, 2)), 1)[2]
    with pytest.raises(ValueError, match=r"give one state of every shard"):
        _loader(url).load_state_dict(one_shard)


def test_set_epoch_keeps_a_loaded_position_of_that_epoch_only(digits_dataset):
    url, result = digits_dataset
    loader = _loader(url, training=False)
    loader.dataset.set_epoch(3)
    first, _, state = _take(loader, 2)
    assert state["epoch"] == 3
    resumed = _loader(url, training=False)
    resumed.load_state_dict(state)
    resumed.dataset.set_epoch(3)   # the loop's own call for the epoch it resumes: the position stays
    rest, _, _ = _take(resumed)
    assert _once(first, rest, rows=result.rows)
    resumed.load_state_dict(state)
    resumed.dataset.set_epoch(4)   # another epoch: a whole one
    assert _once(_take(resumed)[0], rows=result.rows)


def test_a_state_bitmap_inflates_to_exactly_its_rows_never_more():
    """A state comes from a file: a zlib bomb or a bitmap of another size is refused, not inflated."""
    import base64
    import zlib

    from pinstorm.pipeline.positions import pack_bits, unpack_bits

    bits = np.arange(1001) % 3 == 0
    assert (unpack_bits(pack_bits(bits), 1001) == bits).all()
    bomb = base64.b64encode(zlib.compress(b"\0" * (64 << 20))).decode()
    for bad in (bomb, pack_bits(bits[:500]), "not base64!"):
        with pytest.raises(ValueError, match="bitmap"):
            unpack_bits(bad, 1001)


# ---- a state from a file is checked against the epoch plan first (issue 31, item 5) -------------
def _no_work(monkeypatch):
    """Make every piece of work that grows with a state's values fail the test if it runs: a refusal must
    come from `check_state`'s O(1) checks, before them."""
    from pinstorm.pipeline import positions

    def work(*args, **kwargs):
        raise AssertionError("work on the state's positions ran before its O(1) checks refused it")

    for name in ("epoch_order", "stream_ids", "stream_length", "unpack_bits", "check_received"):
        monkeypatch.setattr(positions, name, work)


STATE_CASES = {   # change to a genuine 0-worker state -> what the refusal names
    "huge epoch": ({"epoch": 10**15, "streams": [[10**15, 0]]},
                   r"epoch is 1000000000000000, outside \[0, 2147483647\]"),
    "huge stream epoch": ({"streams": [[10**15, 0]]}, r"stream 0 epoch is 1000000000000000, outside \[0, 2147483647\]"),
    "past 2**31": ({"epoch": 2**31, "streams": [[2**31, 0]]}, r"epoch is 2147483648, outside"),
    "negative received": ({"streams": [[0, -5]]}, r"stream 0 samples received is -5, outside \[0, 323\]"),
    "negative epoch": ({"epoch": -1, "streams": [[-1, 0]]}, r"epoch is -1, outside"),
    "past the rows": ({"streams": [[0, 324]]}, r"stream 0 samples received is 324, outside \[0, 323\]"),
    "a float": ({"streams": [[0, 1.5]]}, r"samples received must be an integer, not 1.5"),
    "a bool": ({"streams": [[0, True]]}, r"samples received must be an integer, not True"),
    "a text seed": ({"seed": "11"}, r"seed must be an integer, not '11'"),
    "a 4000-bit seed": ({"seed": 2**4000}, r"seed is an integer of 4,001 bits"),
    "no streams": ({"streams": []}, r"num_workers=0 has 1 streams, not 0"),
    "next stream": ({"next_stream": 5}, r"next_stream is 5, outside \[0, 0\]"),
    "workers": ({"num_workers": 10**6}, r"num_workers is 1000000, outside \[0, 1024\]"),
    "consumed epoch": ({"consumed": {"10000000000": "eJw="}}, r"consumed names epoch '10000000000'"),
    "epoch not the streams'": ({"epoch": 3}, r"epoch 3 is not its streams' earliest \(0\)"),
    # the probe's 339 bytes: another layout (2 workers) with a stream 10**6 epochs on; walked epoch by epoch
    # it cost seconds per 10**5 epochs and a bitmap of every row per epoch
    "streams far apart": ({"num_workers": 2, "streams": [[0, 0], [10**6, 0]]},
                          r"epochs 0 to 1000000: resuming on another layout takes streams at most 64 epochs apart"),
}


@pytest.mark.parametrize("case", sorted(STATE_CASES))
def test_a_state_outside_the_epoch_plan_is_refused_by_its_o1_check(digits_dataset, monkeypatch, case):
    from pinstorm.pipeline.positions import ResumeStateError

    url, result = digits_dataset
    assert result.rows == 323
    _, _, state = _take(_loader(url), 0)
    change, match = STATE_CASES[case]
    loader = _loader(url)
    _no_work(monkeypatch)
    with pytest.raises(ResumeStateError, match=match):
        loader.load_state_dict({**state, **change})


def test_the_tensorflow_reader_refuses_the_same_states(digits_dataset, monkeypatch):
    from pinstorm.pipeline.positions import ResumeStateError
    from pinstorm.pipeline.reader import dataset_position

    url, _ = digits_dataset
    _, _, state = _take(_loader(url), 0)
    _no_work(monkeypatch)
    for change, match in (STATE_CASES["huge epoch"], STATE_CASES["negative received"]):
        with pytest.raises(ResumeStateError, match=match):
            dataset_position(url, batch_size=BATCH, seed=11, state={**state, **change})


def test_samples_received_past_the_streams_epoch_are_refused(digits_dataset):
    """Within the dataset's rows, but more than that worker's slice of the epoch holds (O(row groups))."""
    from pinstorm.pipeline.positions import ResumeStateError

    url, _ = digits_dataset
    _, _, state = _take(_loader(url, num_workers=2), 0)
    for workers in (2, 0):   # the same layout, and another (`consumed_by`)
        with pytest.raises(ResumeStateError, match=r"stream 1 has received 300 samples of epoch 0, more than that "
                                                   r"epoch of the stream holds \(\d+\)"):
            _loader(url, num_workers=workers).load_state_dict({**state, "streams": [[0, 0], [0, 300]]})


def _walked(states, info):
    """The samples each epoch's streams had received, as `consumed_by` marked them before issue 31: every
    epoch of every stream walked sample by sample (linear in the epochs, and in the rows)."""
    from pinstorm.pipeline.positions import unpack_bits

    first = min(e for s in states for e, _ in s["streams"])
    last = max(e for s in states for e, _ in s["streams"])
    marked = {e: np.zeros(info["rows"], dtype=bool) for e in range(first, last + 1)}
    for s in states:
        groups = shard_row_groups(info, s["shard"])
        earlier = {int(e): unpack_bits(b, info["rows"]) for e, b in s["consumed"].items()}
        for e, bits in earlier.items():
            marked[e] |= bits
        for stream, (at, received) in enumerate(s["streams"]):
            split = (stream, s["num_workers"]) if s["num_workers"] else None
            for e in range(first, at + 1):
                ids = list(stream_ids(info, groups, seed=epoch_seed(s["seed"], e), shuffle=s["shuffle"],
                                      shuffle_buffer=s["shuffle_buffer"], split=split, consumed=earlier.get(e)))
                marked[e][ids[:received] if e == at else ids] = True
    return marked


def test_another_layout_across_epochs_skips_what_the_sample_walk_skipped(digits_dataset):
    """`consumed_by` marks an epoch a stream finished by its row groups (O(row groups)), not sample by sample:
    the same samples, for streams epochs apart, with bitmaps from an earlier layout."""
    from pinstorm.pipeline.positions import check_state, consumed_by, info_digest, pack_bits

    url, _ = digits_dataset
    info = dataset_info(url)
    _, _, state = _take(_loader(url, num_workers=2), 0)
    rng = np.random.default_rng(0)
    earlier = {"1": pack_bits(rng.random(info["rows"]) < 0.3), "2": pack_bits(rng.random(info["rows"]) < 0.1)}
    for streams, consumed in (([[0, 37], [3, 11]], {}), ([[1, 0], [2, 20]], earlier), ([[2, 5], [2, 0]], {})):
        s = check_state({**state, "epoch": min(e for e, _ in streams), "streams": streams, "consumed": consumed},
                        info, info_digest(info))
        position = consumed_by([s], info, 1)
        expected = _walked([s], info)
        assert sorted(position.consumed) == sorted(expected)
        for e, bits in expected.items():
            assert (position.consumed[e] == bits).all(), (streams, e)

    # A run resumed on another layout from streams in two epochs: each sample of both epochs once.
    kw = dict(num_workers=2, num_epochs=2, training=False)
    for steps in range(4, 16):
        first, _, state = _take(_loader(url, **kw), steps)
        if len({e for e, _ in state["streams"]}) == 2:   # one worker's stream is an epoch ahead of the other's
            break
    else:
        pytest.fail("no state with its streams in two epochs")
    alone = _loader(url, num_workers=0, num_epochs=2, training=False)
    alone.load_state_dict(state)
    rest, _, _ = _take(alone)
    assert _once(first, rest, rows=info["rows"], times=2)
