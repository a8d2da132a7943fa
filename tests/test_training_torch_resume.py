"""train_torch(backup_every=N): a run killed mid-epoch (SIGKILL in the middle of a step) resumes with
exactly the samples it had not trained on, and ends with the weights and metrics of a run never killed; the
sample IDs it trains on (``on_batch``) are the rest of the epoch, also when two ranks resume as one."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import sys
import textwrap
import zipfile

import numpy as np
import pytest

pytest_plugins = ["conftest_training"]
torch = pytest.importorskip("torch")

from pinstorm.training.torch_fit import TrainingError, load_checkpoint, train_torch  # noqa: E402
from training_support import Killed, batch_recorder, rendezvous_store, stderr_of  # noqa: E402

MODEL = dict(width=0.125, normalization=None, dropout=0.5)   # dropout: the random state must resume too
DIGITS = {"flip": True, "crop_area": (0.6, 1.0)}             # crops and flips: the input position must too

KILLED_AT_STEP = """
import os, signal, sys, json
import torch
from pinstorm.training.torch_fit import train_torch

steps = 0
def count_steps(module, inputs, output):   # the whole model's forward: one per training step
    global steps
    if type(module).__name__ == "AlexNet":
        steps += 1
        if steps == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)   # a crash in the middle of a step, after its input was taken
torch.nn.modules.module.register_module_forward_hook(count_steps)
train_torch("alexnet", sys.argv[1], **json.loads(sys.argv[3]))
"""


def test_a_run_killed_mid_epoch_resumes_with_the_rest_and_ends_as_if_never_killed(digits_parquet, tmp_path,
                                                                                  processes):
    args = dict(epochs=2, batch_size=8, image_size=32, model_kwargs=MODEL, seed=0, input_options=DIGITS)
    whole = train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"), **args)
    steps = whole.steps_per_epoch
    assert steps > 8

    kill_at = steps + 5   # in the second epoch, two steps after its backup at step 3
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=3)
    child = processes.start(["-c", textwrap.dedent(KILLED_AT_STEP), digits_parquet["train"], str(kill_at),
                             json.dumps(resumable)])
    assert child.wait(180) == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == (1, 3)
    (epoch, received), = json.loads(saved["partial"]["positions"])[0]["streams"]   # the loader's position
    assert epoch * digits_parquet["rows"] + received == (steps + 3) * 8     # what the fit had taken, no more

    resumed = train_torch("alexnet", digits_parquet["train"], **resumable)
    assert resumed.initial_epoch == 1 and resumed.epochs == [1]
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
    assert resumed.history["loss"] == pytest.approx(whole.history["loss"][1:], rel=1e-12)
    assert resumed.history["accuracy"] == whole.history["accuracy"][1:]
    assert not (tmp_path / "ckpt" / "checkpoint.pt").exists()


def test_a_backup_at_an_epoch_end_also_resumes_exactly(digits_parquet, tmp_path, processes):
    args = dict(epochs=2, batch_size=8, image_size=32, model_kwargs=MODEL, seed=1, input_options=DIGITS)
    whole = train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"), **args)
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"),
                     backup_every=whole.steps_per_epoch + 1)   # no mid-epoch backup: only the epoch's end
    child = processes.start(["-c", textwrap.dedent(KILLED_AT_STEP), digits_parquet["train"],
                             str(whole.steps_per_epoch + 2), json.dumps(resumable)])
    assert child.wait(180) == -signal.SIGKILL
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == (1, 0)
    resumed = train_torch("alexnet", digits_parquet["train"], **resumable)
    for name, value in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name


def test_backup_every_needs_a_checkpoint_dir(digits_parquet):
    with pytest.raises(TrainingError, match="backup_every must be a positive number of steps, with a checkpoint_dir"):
        train_torch("alexnet", digits_parquet["train"], backup_every=3)
    with pytest.raises(TrainingError, match="backup_every"):
        train_torch("alexnet", digits_parquet["train"], backup_every=0, checkpoint_dir=sys.prefix)


# --------------------------------------------------------------------------- a checkpoint's pickle (issue 31)

def _pickle_bomb(path, body: bytes) -> None:
    """A torch.save zip (a small checkpoint written by torch.save) whose ``<archive>/data.pkl`` is `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": 2, "epoch": 1, "model": {"w": torch.zeros(4)}}, path)
    with zipfile.ZipFile(path) as source:
        entries = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as target:
        for name, data in entries:
            target.writestr(name, b"\x80\x02" + body + b"." if name.endswith("/data.pkl") else data)


def test_an_8_mib_pickle_bomb_checkpoint_is_refused_before_the_run_resumes(digits_parquet, tmp_path, monkeypatch):
    """8 MiB of one opcode as checkpoint.pt's pickle: torch.load(weights_only=True) built millions of
    objects from it (~600 MB, seconds). train_torch refuses it from the bounded scan, naming the file and
    the bound; reading the checkpoint traces a small peak (the 8 MiB read, nothing unpickled)."""
    import tracemalloc

    from pinstorm.training import torch_fit

    peaks = []

    def traced(*args, **kwargs):   # the checkpoint's read alone (not the imports and set-up before it)
        tracemalloc.start()
        try:
            return load_checkpoint(*args, **kwargs)
        finally:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    monkeypatch.setattr(torch_fit, "load_checkpoint", traced)
    path = tmp_path / "ckpt" / "checkpoint.pt"
    _pickle_bomb(path, b"}" * (8 << 20))
    with pytest.raises(TrainingError, match=rf"refused to resume from {re.escape(str(path))}: "
                                            r"checkpoint/data\.pkl: a pickle stack 4,097 deep .*max_stack=4,096"):
        train_torch("alexnet", digits_parquet["train"], epochs=1, batch_size=8, image_size=32, model_kwargs=MODEL,
                    checkpoint_dir=str(tmp_path / "ckpt"), output_dir=str(tmp_path / "run"))
    assert len(peaks) == 1 and peaks[0] < 32 << 20, f"{peaks} bytes traced refusing an 8 MiB checkpoint pickle"


def test_a_checkpoint_pickle_beyond_its_bounds_is_a_training_error_naming_the_bound(tmp_path):
    """Bounds proportional to the model's tensors: opcodes (dicts made and dropped), the data.pkl entry's
    size (from the zip's directory, before a byte is read), nesting."""
    path = tmp_path / "checkpoint.pt"
    cases = [(b"]" + b"]a" * 300_000, 100, "more pickle opcodes than max_opcodes="),   # a list of lists
             (b"]" + b"]a" * 300_000, None, "more pickle opcodes than max_opcodes=167,936"),   # CHECKPOINT_TENSORS'
             (b"N" * (40 << 20), None, r"data\.pkl is 41,943,043 bytes.*max_pickle_bytes="),
             (b"(" * 100, 100, "marks nested 65 deep")]
    for body, tensors, match in cases:
        _pickle_bomb(path, body)
        with pytest.raises(TrainingError, match=rf"refused to resume from {re.escape(str(path))}: .*{match}"):
            load_checkpoint(tmp_path, tensors=tensors)


# --------------------------------------------------------------------------- the sample IDs (issue 20, part 3)

def _digest(seen: list) -> str:
    return hashlib.sha256(np.asarray([i for _, _, ids in seen for i in ids], dtype=np.int64).tobytes()).hexdigest()


@pytest.mark.parametrize("kill_at, backup_at", [((0, 4), (0, 3)), ((1, 7), (1, 6)), ((1, 0), (1, 0))])
def test_the_resumed_run_trains_on_exactly_the_samples_the_killed_one_had_not(digits_parquet, tmp_path, kill_at,
                                                                               backup_at):
    """Killed after any step: the resumed run's sample IDs are the rest of the epoch, step for step, and the
    killed + resumed ID sequence hashes as the uninterrupted one's."""
    args = dict(epochs=2, batch_size=8, image_size=32, model_kwargs=MODEL, seed=3, input_options=DIGITS)
    whole: list = []
    train_torch("alexnet", digits_parquet["train"], output_dir=str(tmp_path / "whole"),
                on_batch=batch_recorder(whole), **args)
    resumable = dict(args, output_dir=str(tmp_path / "run"), checkpoint_dir=str(tmp_path / "ckpt"), backup_every=3)
    killed: list = []
    with pytest.raises(Killed):
        train_torch("alexnet", digits_parquet["train"], on_batch=batch_recorder(killed, kill_at), **resumable)
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"]) == backup_at
    resumed: list = []
    train_torch("alexnet", digits_parquet["train"], on_batch=batch_recorder(resumed), **resumable)

    assert resumed[0][:2] == backup_at                                  # not the epoch's start
    trained_before = [entry for entry in killed if entry[:2] < backup_at]
    assert resumed == whole[len(trained_before):]                       # the rest, step for step
    assert trained_before == whole[:len(trained_before)]
    assert _digest(trained_before + resumed) == _digest(whole)


RANK_KILLED_AFTER = textwrap.dedent("""
    import json, sys
    from pinstorm.training.torch_fit import train_torch

    seen = []
    def on_batch(epoch, step, ids):
        seen.append(ids.tolist())
        with open(sys.argv[3], "w") as handle:
            json.dump(seen, handle)
        if step == int(sys.argv[4]):
            raise SystemExit(f"killed after step {step}")
    train_torch("alexnet", sys.argv[1], checkpoint_dir=sys.argv[2], on_batch=on_batch, **json.loads(sys.argv[5]))
""")


def test_two_ranks_backed_up_mid_epoch_resume_on_one_with_every_remaining_sample_once(digits_parquet, tmp_path,
                                                                                      processes):
    """Two gloo ranks (two processes) back up at step 3 and die at step 4; one process resumes: the epoch's
    samples neither rank had trained on before the backup come next, each once, and nothing else first."""
    args = dict(epochs=1, batch_size=8, image_size=32, model_kwargs=MODEL, seed=5, input_options=DIGITS,
                backup_every=3, output_dir=str(tmp_path / "run"))
    with rendezvous_store() as rendezvous:
        ranks = [processes.start(["-c", RANK_KILLED_AFTER, digits_parquet["train"], str(tmp_path / "ckpt"),
                                  str(tmp_path / f"rank{r}.json"), "4", json.dumps(args)],
                                 env=dict(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                          **rendezvous))
                 for r in range(2)]
        for process in ranks:
            assert process.wait(240) == 1, stderr_of(process)[-3000:]
            assert "killed after step 4" in stderr_of(process)
    saved = load_checkpoint(tmp_path / "ckpt")
    assert (saved["epoch"], saved["partial"]["step"], saved["partial"]["world"]) == (0, 3, 2)
    before = [i for r in range(2) for ids in json.loads((tmp_path / f"rank{r}.json").read_text())[:3] for i in ids]
    assert len(before) == len(set(before)) == 2 * 3 * 8

    resumed: list = []
    result = train_torch("alexnet", digits_parquet["train"], checkpoint_dir=str(tmp_path / "ckpt"),
                         on_batch=batch_recorder(resumed), **dict(args, epochs=2))
    assert result.replicas == 1 and resumed[0][:2] == (0, 6)           # the two ranks' 3 steps each, done
    rest = [i for _, _, ids in resumed for i in ids][:digits_parquet["rows"] - len(before)]
    assert sorted(before + rest) == list(range(digits_parquet["rows"]))   # every sample of the epoch once
