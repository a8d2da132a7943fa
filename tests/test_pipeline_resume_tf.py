"""make_dataset resumes mid-epoch: the rest of the uninterrupted run sample for sample, or, on another shard
layout, every sample of the epoch once; its state is the torch loader's (issue 20, part 3, TensorFlow side)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from pinstorm.pipeline import dataset_info
from pinstorm.pipeline.epochs import epoch_seed
from pinstorm.pipeline.positions import stream_ids

pytest_plugins = ["conftest_pipeline", "conftest_training"]
pytest.importorskip("tensorflow")

from pinstorm.pipeline import make_dataset  # noqa: E402

BATCH = 32


def _dataset(url, **kw):
    kw = {"batch_size": BATCH, "image_size": 16, "seed": 11, "return_ids": True, **kw}
    return make_dataset(url, **kw)


def _take(dataset, batches=None):
    """(ids, images) of the first `batches` batches (all when None), and the state after them, through
    JSON as a checkpoint keeps it. The iterator is dropped there: the kill (its prefetched rows are lost)."""
    ids, images = [], []
    for step, (x, _, i) in enumerate(dataset if batches != 0 else ()):
        ids += i.numpy().tolist()
        images.append(x.numpy())
        if batches is not None and step + 1 == batches:
            break
    state = json.loads(json.dumps(dataset.pinstorm_position.state(len(images))))
    return ids, images, state


def _digest(ids) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


@pytest.mark.parametrize("shuffle,training", [(True, True), (False, False)])
def test_resumed_after_any_batch_the_run_is_the_uninterrupted_one(digits_dataset, shuffle, training):
    url, result = digits_dataset
    kw = dict(shuffle=shuffle, training=training, num_epochs=2)
    whole, whole_images, _ = _take(_dataset(url, **kw))
    assert sorted(whole) == sorted(list(range(result.rows)) * 2)
    info = dataset_info(url)
    planned = [i for e in (0, 1) for i in stream_ids(info, list(range(info["row_groups"])), seed=epoch_seed(11, e),
                                                     shuffle=shuffle, shuffle_buffer=None)]
    assert whole == planned   # the reader delivers the plan computed from the row counts alone
    count = len(whole_images)
    pixels = dict(zip(whole[:BATCH * count], np.concatenate(whole_images)))
    for k in sorted({0, 1, count // 4, count // 2 + 1, count - 1, count}):
        head, _, state = _take(_dataset(url, **kw), k)
        assert state["epoch"] == (0 if BATCH * k <= result.rows else 1)
        rest, rest_images, _ = _take(_dataset(url, **{**kw, "num_epochs": 2 - state["epoch"]}, state=state))
        assert _digest(head + rest) == _digest(whole), k
        if rest_images:   # the same crops and flips: augmentation is seeded per sample, not by stream position
            got = dict(zip(rest, np.concatenate(rest_images)))
            some = rest[:: max(1, len(rest) // 8)]
            assert all(np.allclose(got[i], pixels[i], atol=1e-5) for i in some if i in pixels)


def test_another_shard_layout_repeats_and_skips_nothing(digits_dataset):
    url, result = digits_dataset
    two = [_dataset(url, shard=(i, 2), num_epochs=1) for i in range(2)]
    taken = [_take(d, k) for d, k in zip(two, (2, 3))]
    seen = [i for ids, _, _ in taken for i in ids]
    rest, _, state = _take(_dataset(url, num_epochs=1, state=[s for _, _, s in taken]), 1)
    rest += _take(_dataset(url, num_epochs=1, state=state))[0]
    assert Counter(seen + rest) == Counter(range(result.rows))   # 2 -> 1: each row of the epoch once

    head, _, state = _take(_dataset(url, num_epochs=1), 3)
    halves = [_take(_dataset(url, shard=(i, 2), num_epochs=1, state=state))[0] for i in range(2)]
    assert Counter(head + halves[0] + halves[1]) == Counter(range(result.rows))   # 1 -> 2
    assert not set(halves[0]) & set(halves[1])


def test_the_state_is_the_torch_loaders(digits_dataset):
    torch = pytest.importorskip("torch")
    from pinstorm.pipeline import make_torch_loader

    url, _ = digits_dataset
    head, _, tf_state = _take(_dataset(url, num_epochs=1), 3)
    loader = make_torch_loader(url, batch_size=BATCH, image_size=16, seed=11, return_ids=True)
    loader.load_state_dict(tf_state)
    torch_rest = torch.cat([i for _, _, i in loader]).tolist()
    tf_rest = _take(_dataset(url, num_epochs=1, state=tf_state))[0]
    assert torch_rest == tf_rest and len(head) + len(tf_rest) == dataset_info(url)["rows"]

    loader = make_torch_loader(url, batch_size=BATCH, image_size=16, seed=11, return_ids=True)
    batches = iter(loader)
    torch_head = torch.cat([next(batches)[2] for _ in range(2)]).tolist()
    del batches
    torch_state = json.loads(json.dumps(loader.state_dict()))
    assert set(torch_state) == set(tf_state) and torch_state["streams"] == [[0, 2 * BATCH]]
    rest = _take(_dataset(url, num_epochs=1, state=torch_state))[0]
    whole = _take(_dataset(url, num_epochs=1))[0]
    assert torch_head + rest == whole


def test_petastorm_engine_refuses_a_state(digits_dataset):
    url, _ = digits_dataset
    state = _take(_dataset(url), 1)[2]
    with pytest.raises(ValueError, match="engine='pyarrow'"):
        make_dataset(url, batch_size=BATCH, engine="petastorm", state=state)


def test_a_state_of_another_dataset_is_refused(digits_dataset, digits_val_dataset):
    state = _take(_dataset(digits_dataset[0]), 1)[2]
    with pytest.raises(ValueError, match="another dataset"):
        _dataset(digits_val_dataset[0], state=state)


@pytest.mark.once
def test_train_killed_mid_epoch_continues_at_the_saved_input_position(digits_dataset, two_cpu_devices, tmp_path):
    """A mirrored run (2 replicas: 2 batches of 8 per step) killed at step 24 of 2 x 20 resumes with its input at
    the position of step 24, then at step 28 the saved position is the uninterrupted run's after 28 steps."""
    import tf_keras as keras

    from pinstorm.pipeline.reader import dataset_position
    from pinstorm.training import make_strategy, train
    from pinstorm.training.resume import state_path
    from training_support import NO_FLIP, TINY

    class Crash(keras.callbacks.Callback):
        def __init__(self, after):
            super().__init__()
            self.after, self.steps = after, 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.steps == self.after:
                raise RuntimeError("simulated crash")

    url, result = digits_dataset
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="one-device")
    args = dict(strategy=strategy, epochs=2, output_dir=tmp_path / "run", checkpoint_dir=tmp_path / "backup",
                backup_every=4, seed=5, input_options=NO_FLIP, verbose=0, **TINY)
    plan = dataset_position(url, batch_size=8, seed=5, num_epochs=None, drop_remainder=True)
    assert result.rows // 16 == 20
    for crash_at, steps in ((24, 24), (4, 28)):
        with pytest.raises(RuntimeError, match="simulated crash"):
            train("alexnet", url, callbacks=[Crash(crash_at)], **args)
        saved = json.loads(state_path(tmp_path / "backup").read_text())
        assert saved["steps"] == steps and saved["counters"] == [1, steps - 20 - 1]
        assert saved["input"] == [plan.state(2 * steps)]
        assert saved["input"][0]["epoch"] == 1   # 448 of 325 rows: the second epoch of the data
    finished = train("alexnet", url, **args)
    assert finished.initial_epoch == 1 and not state_path(tmp_path / "backup").exists()
