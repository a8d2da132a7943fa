"""train_torch(accumulate_batches=N): N batches of B train as one step of N x B (the same samples, the same
weights up to float rounding), a run killed mid-epoch resumes at a step's boundary exactly, and two DDP ranks
accumulating stay identical."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training.torch_fit import TrainingError, load_checkpoint, train_torch  # noqa: E402
from training_support import Killed, batch_recorder, finish, rendezvous_store  # noqa: E402

NO_DROPOUT = dict(width=0.125, normalization=None, dropout=0.0)   # no batch statistics, no random masks
DIGITS = {"flip": True, "crop_area": (0.6, 1.0)}                  # per-sample crops and flips: batching-free


def test_two_accumulated_batches_train_as_one_batch_twice_as_large(digits_parquet, tmp_path):
    args = dict(epochs=2, steps_per_epoch=4, image_size=32, model_kwargs=NO_DROPOUT, seed=2, input_options=DIGITS,
                learning_rate=0.05, optimizer="sgd", lr_schedule="cosine", weight_decay=1e-4)
    large, accumulated = [], []
    one = train_torch("alexnet", digits_parquet["train"], batch_size=8, output_dir=str(tmp_path / "one"),
                      on_batch=batch_recorder(large), **args)
    two = train_torch("alexnet", digits_parquet["train"], batch_size=4, accumulate_batches=2,
                      output_dir=str(tmp_path / "two"), on_batch=batch_recorder(accumulated), **args)
    assert accumulated == large and len(large) == 8               # each step: the same 8 samples, in order
    assert two.global_batch_size == one.global_batch_size == 8 and two.steps_per_epoch == 4
    assert two.history["loss"] == pytest.approx(one.history["loss"], rel=1e-5)
    assert two.history["learning_rate"] == one.history["learning_rate"]   # the schedule counts optimizer steps
    for name, value in one.model.state_dict().items():
        torch.testing.assert_close(two.model.state_dict()[name], value, rtol=1e-4, atol=1e-6, msg=name)
    # the comparison can tell: steps of 4 samples end elsewhere
    four = train_torch("alexnet", digits_parquet["train"], batch_size=4, output_dir=str(tmp_path / "four"), **args)
    last = "classifier.7.weight"
    assert not torch.allclose(four.model.state_dict()[last], one.model.state_dict()[last])


def test_an_epoch_counts_steps_of_the_accumulated_batches(digits_parquet, tmp_path):
    result = train_torch("alexnet", digits_parquet["train"], epochs=1, batch_size=8, accumulate_batches=3,
                         image_size=32, model_kwargs=NO_DROPOUT, output_dir=str(tmp_path / "run"))
    assert result.steps_per_epoch == digits_parquet["rows"] // 24 and result.global_batch_size == 24
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(TrainingError, match="accumulate_batches must be a positive number of batches"):
            train_torch("alexnet", digits_parquet["train"], accumulate_batches=bad)
    with pytest.raises(TrainingError, match="fewer than one step of 40 batches of 8"):
        train_torch("alexnet", digits_parquet["train"], batch_size=8, accumulate_batches=40,
                    output_dir=str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()   # refused before it made its folder


def test_a_run_killed_mid_epoch_resumes_at_the_step_after_its_backup(digits_parquet, tmp_path):
    """Backups every 2 steps of 2 batches: killed after step 4 of epoch 1, it resumes at step 4 (the backup
    after step 3), trains the rest of the samples step for step, and ends with the uninterrupted weights."""
    args = dict(epochs=2, batch_size=4, accumulate_batches=2, image_size=32, seed=4, input_options=DIGITS,
                model_kwargs=dict(NO_DROPOUT, dropout=0.5))   # dropout: the random state resumes too
    whole: list = []
    uninterrupted = train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"),
                                on_batch=batch_recorder(whole), **args)
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=2)
    killed: list = []
    with pytest.raises(Killed):
        train_torch("alexnet", digits_parquet["train"], on_batch=batch_recorder(killed, (1, 4)), **resumable)
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"], saved["partial"]["accumulate"]) == (1, 4, 2)
    resumed: list = []
    result = train_torch("alexnet", digits_parquet["train"], on_batch=batch_recorder(resumed), **resumable)
    assert resumed[0][:2] == (1, 4) and resumed == whole[len(whole) - len(resumed):]
    for name, value in uninterrupted.model.state_dict().items():
        assert torch.equal(result.model.state_dict()[name], value), name


RANK = textwrap.dedent("""
    import json, sys
    from pinstorm.training.torch_fit import train_torch
    result = train_torch("alexnet", sys.argv[1], epochs=1, steps_per_epoch=3, batch_size=4, accumulate_batches=2,
                         image_size=32, model_kwargs={"width": 0.125, "normalization": None, "dropout": 0.0}, seed=0,
                         output_dir=sys.argv[2], backend="gloo", input_options={"flip": False})
    print(json.dumps(result.summary()))
""")


def test_two_ddp_ranks_accumulating_end_with_identical_weights(digits_parquet, tmp_path, processes):
    """The ranks add their first batch's gradients locally (DDP's no_sync) and all-reduce at each step's last."""
    with rendezvous_store() as rendezvous:
        ranks = [processes.start(["-c", RANK, digits_parquet["train"], str(tmp_path / "run")],
                                 env=dict(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                          **rendezvous))
                 for r in range(2)]
        outputs = [finish(process, timeout=240) for process in ranks]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(r["replicas"] == 2 and r["global_batch_size"] == 2 * 4 * 2 for r in results)
    first, second = (torch.load(r["weights_path"], weights_only=True) for r in results)
    assert all(torch.equal(first[k], second[k]) for k in first)
