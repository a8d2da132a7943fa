"""Weights are only weights (issue 17, case 2): an experiment served by someone else cannot make
``load_experiment`` read local files (HDF5 external storage, external links, virtual datasets),
inflate a small file into gigabytes, or build a model beyond ``max_parameters``; a malformed
lineage is one ``ExperimentError``. Experiments are pinned to a local board, served with
``serve_board`` on 127.0.0.1 and loaded through a URL board. Memory-risky loads run in a child
process under RLIMIT_AS, so a regression fails instead of exhausting the machine. Property tests
(hypothesis) hold ``check_weights_file`` to an independent oracle."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pinstorm import boards
from pinstorm.training.weights_check import UnsafeWeights, check_weights_file
from training_support import TINY, served_experiment

pytest_plugins = ["conftest_training"]

FC7 = "layers/dense_1/vars/0"      # the fc7 kernel (512 x 512 at TINY) in Keras' weights layout
CHILD_MEMORY = 3584 << 20          # TensorFlow with a tiny model peaks near 2.2 GB of address space


@pytest.fixture(scope="module")
def genuine(tmp_path_factory, digits_arrays):
    """A real run: tiny AlexNet fitted by ``train`` (optimizer slots and metrics in its weights file)."""
    import tensorflow as tf

    from pinstorm.training import make_strategy, train

    x, y, _, _ = digits_arrays
    out = tmp_path_factory.mktemp("genuine-run")
    data = tf.data.Dataset.from_tensor_slices((tf.image.resize(x[:32], (32, 32)), y[:32]))
    result = train("alexnet", data, strategy=make_strategy("one-device"), num_classes=10, epochs=1,
                   output_dir=out / "out", verbose=0, seed=0, **TINY)
    lineage = {"format": 1, "model": {"name": "alexnet", "image_size": 32, "num_classes": 10,
                                      "kwargs": dict(TINY["model_kwargs"]), "keras_name": "alexnet"}}
    return {"weights": Path(result.weights_path), "lineage": lineage,
            "values": [w.copy() for w in result.model.get_weights()],
            "shapes": [tuple(v.shape) for v in result.model.weights]}


def _experiment(tmp_path, genuine, name, *, lineage=None, tamper=None, lineage_text=None) -> Path:
    """A run folder like ``pin_run`` stages it, its weights optionally tampered with through h5py."""
    folder = tmp_path / "runs" / name
    folder.mkdir(parents=True)
    shutil.copyfile(genuine["weights"], folder / "final.weights.h5")
    if tamper:
        with h5py.File(folder / "final.weights.h5", "a") as f:
            tamper(f)
    text = lineage_text if lineage_text is not None else json.dumps(lineage or genuine["lineage"])
    (folder / "lineage.json").write_bytes(text.encode() if isinstance(text, str) else text)
    return folder


def _replace(path: str, **create):
    def tamper(f):
        del f[path]
        f.create_dataset(path, **create)
    return tamper


def _load_refused(target: str, match: str):
    from pinstorm.training import load_experiment
    from pinstorm.training.experiments import ExperimentError

    with pytest.raises(ExperimentError, match=match) as caught:
        load_experiment(target)
    return str(caught.value)


# ---- the genuine run loads over HTTP --------------------------------------------------------
def test_a_genuine_remote_experiment_loads(http_board, tmp_path, genuine):
    from pinstorm.training import load_experiment

    model = load_experiment(served_experiment(http_board, _experiment(tmp_path, genuine, "genuine")))
    for loaded, trained in zip(model.get_weights(), genuine["values"]):
        np.testing.assert_array_equal(loaded, trained)
    summary = check_weights_file(genuine["weights"], genuine["shapes"])
    assert summary.datasets > len(genuine["shapes"])          # optimizer slots and metrics pass too


# ---- local files -----------------------------------------------------------------------------
@pytest.mark.parametrize("victim", ["/proc/self/environ", "/etc/passwd"])
def test_external_storage_is_refused_before_any_read(http_board, tmp_path, genuine, monkeypatch, victim):
    monkeypatch.setenv("PINSTORM_TEST_SECRET", "s3cr3t-value")
    tamper = _replace(FC7, shape=(512, 512), dtype="u1", external=[(victim, 0, h5py.h5f.UNLIMITED)])
    target = served_experiment(http_board, _experiment(tmp_path, genuine, "leak", tamper=tamper))
    message = _load_refused(target, f"dataset /{FC7} keeps its data in the external file {victim}")
    assert "s3cr3t" not in message


def test_external_soft_links_and_virtual_datasets_are_refused(http_board, tmp_path, genuine):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("kernel", data=np.ones((512, 512), "f4"))

    def external_link(f):
        del f["layers/dense_1/vars"]
        f["layers/dense_1/vars"] = h5py.ExternalLink(str(other), "/")

    def soft_link(f):
        del f["layers/dense_1/vars"]
        f["layers/dense_1/vars"] = h5py.SoftLink("/layers/dense/vars")

    def virtual(f):
        layout = h5py.VirtualLayout((512, 512), "f4")
        layout[:] = h5py.VirtualSource(str(other), "kernel", (512, 512))
        del f[FC7]
        f.create_virtual_dataset(FC7, layout)

    cases = {"external-link": (external_link, f"external link to {other}"),
             "soft-link": (soft_link, "soft link to /layers/dense/vars"),
             "virtual": (virtual, f"virtual dataset \\(built from \\['{other}'\\]\\)")}
    for name, (tamper, match) in cases.items():
        _load_refused(served_experiment(http_board, _experiment(tmp_path, genuine, name, tamper=tamper)), match)


# ---- sizes -----------------------------------------------------------------------------------
def test_shapes_types_chunks_and_filters_beyond_the_model_are_refused(http_board, tmp_path, genuine):
    def oversized_chunk(f):      # a raw chunk written past its declared size: the chunk index is checked
        del f[FC7]
        dataset = f.create_dataset(FC7, shape=(512, 512), dtype="f4", chunks=(64, 64), compression="gzip")
        dataset.id.write_direct_chunk((0, 0), b"\0" * (1 << 20))

    cases = {
        "reshaped": (_replace(FC7, data=np.ones(512 * 512, "f4")),
                     r"declares shape \(262144,\) \(1,048,576 bytes\); none of the model's variables"),
        "text": (_replace(FC7, data=np.array([b"x" * 64] * 4)), "has type \\|S64, not a plain number"),
        "wide-chunks": (_replace(FC7, shape=(512, 512), dtype="f4", chunks=(8192, 4096), maxshape=(None, None)),
                        r"chunks of \(8192, 4096\) = 134,217,728 bytes decompressed \(limit 67,108,864\)"),
        "filter": (_replace(FC7, data=np.ones((512, 512), "f4"), scaleoffset=4), "uses HDF5 filter 6"),
        "chunk-index": (oversized_chunk, r"chunk at \(0, 0\) claims 1,048,576 bytes"),
    }
    for name, (tamper, match) in cases.items():
        _load_refused(served_experiment(http_board, _experiment(tmp_path, genuine, name, tamper=tamper)), match)


def _child_load(target: str) -> dict:
    """``load_experiment(target)`` in a child limited to CHILD_MEMORY of address space."""
    code = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({CHILD_MEMORY}, {CHILD_MEMORY}))
        from pinstorm import boards
        from pinstorm.training import load_experiment
        boards.board_register({os.environ['PINSTORM_TEST_URL']!r}, name="web")
        try:
            load_experiment({target!r})
            print(json.dumps({{"loaded": True}}))
        except Exception as error:
            print(json.dumps({{"error": type(error).__name__, "message": str(error)}}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow      # a TensorFlow child process: 10-15 s on 2 busy cores
def test_a_gzip_bomb_dataset_is_refused_under_a_memory_limit(http_board, tmp_path, genuine, monkeypatch):
    def bomb(f):                  # 16 GiB declared; 16 MiB of zeros written, a few KiB of gzip chunks stored
        del f[FC7]
        dataset = f.create_dataset(FC7, shape=(4 << 30,), dtype="f4", chunks=(1 << 20,), compression="gzip")
        dataset[: 4 << 20] = 0

    folder = _experiment(tmp_path, genuine, "bomb", tamper=bomb)
    assert (folder / "final.weights.h5").stat().st_size < 16 << 20
    target = served_experiment(http_board, folder)
    monkeypatch.setenv("PINSTORM_TEST_URL", http_board[2])
    outcome = _child_load(target)
    assert outcome["error"] == "ExperimentError", outcome
    assert "declares shape (4294967296,) (17,179,869,184 bytes)" in outcome["message"]


@pytest.mark.slow      # a TensorFlow child process: 10-15 s on 2 busy cores
def test_a_million_classes_is_refused_before_the_model_is_built(http_board, tmp_path, genuine, monkeypatch):
    lineage = json.loads(json.dumps(genuine["lineage"]))
    lineage["model"]["num_classes"] = 1_000_000
    target = served_experiment(http_board, _experiment(tmp_path, genuine, "huge", lineage=lineage))
    monkeypatch.setenv("PINSTORM_TEST_URL", http_board[2])
    outcome = _child_load(target)
    assert outcome["error"] == "ExperimentError", outcome
    assert "1,000,000 classes" in outcome["message"] and "limit max_parameters=300,000,000" in outcome["message"]


def test_max_parameters_is_the_callers_choice(tmp_path, genuine):
    from pinstorm.training import load_experiment
    from pinstorm.training.experiments import ExperimentError, parameter_count

    folder = _experiment(tmp_path, genuine, "small")
    boards.pin(str(folder), name="small")
    parameters = parameter_count("alexnet", 32, 10, TINY["model_kwargs"])
    assert parameters == sum(int(np.prod(s)) for s in genuine["shapes"])     # counted without allocating
    with pytest.raises(ExperimentError, match=f"has {parameters:,} parameters"):
        load_experiment("small", max_parameters=parameters - 1)
    assert load_experiment("small", max_parameters=parameters).count_params() == parameters


@settings(max_examples=25, deadline=None)
@given(side=st.integers(24, 300), width=st.floats(0.01, 2.0), units=st.one_of(st.none(), st.integers(1, 600)),
       normalization=st.sampled_from(["lrn", "batch", "none", None]), classes=st.integers(2, 5000))
def test_alexnet_is_counted_exactly_without_building_it(side, width, units, normalization, classes):
    """The count ``load_experiment`` checks first is the one a graph-mode build (no memory) gives."""
    import tensorflow as tf

    from pinstorm.training import build_model
    from pinstorm.training.experiments import parameter_count

    kwargs = {"width": width, "dense_units": units, "normalization": normalization}
    with tf.Graph().as_default():
        built = build_model("alexnet", (side, side, 3), classes, **kwargs).count_params()
    assert parameter_count("alexnet", side, classes, kwargs) == built


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_the_application_bound_is_not_below_the_real_count(name):
    from pinstorm.training import build_model
    from pinstorm.training.experiments import parameter_count

    kwargs = {"alpha": 1.4} if name == "mobilenet_v2" else {}
    assert parameter_count(name, 32, 3000, kwargs) >= build_model(name, (32, 32, 3), 3000, **kwargs).count_params()


# ---- a torch run's pickle (issue 31, item 5) ----------------------------------------------------
TORCH_LINEAGE = {"format": 1, "model": {"name": "alexnet", "image_size": 32, "num_classes": 10,
                                        "kwargs": {"width": 0.5}, "framework": "torch"}}   # 28.6 MiB of tensors
PICKLE_BOMBS = {   # ~60 kB of opcodes torch's weights-only unpickler runs -> the bound that refuses them
    "stack": (b"}" * 60_000, "max_stack=4,096"),                   # EMPTY_DICT: dicts piling up on the stack
    "opcodes": (b"]" + b"]a" * 30_000, "max_opcodes="),            # a list of lists: the stack stays flat
    "memo": (b"]" + b"".join(b"]r" + i.to_bytes(4, "little") + b"a" for i in range(8_000)),   # LONG_BINPUT
             "max_opcodes="),                                      # each list kept in the memo too
    "marks": (b"(" * 60_000, "max_marks=64"),                      # MARK: a stack per mark
}


def _torch_pickle_bomb(path: Path, body: bytes) -> None:
    """``torch.save`` of a small state, then its ``<archive>/data.pkl`` replaced by `body` (stored, as
    torch.save stores it): torch.save's zip layout, well within the model's file-size limit."""
    import torch

    torch.save({"w": torch.zeros(4)}, path)
    with zipfile.ZipFile(path) as source:
        entries = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as target:
        for name, data in entries:
            target.writestr(name, b"\x80\x02" + body + b"." if name.endswith("/data.pkl") else data)


def _pinned_torch_run(board: str, tmp_path: Path, name: str, write) -> str:
    """A torch run folder as ``pin_run`` stages it (``final.pt`` written by `write`), pinned to the local
    `board`: the experiment ``load_experiment`` reads."""
    folder = tmp_path / "runs" / name
    folder.mkdir(parents=True)
    write(folder / "final.pt")
    (folder / "lineage.json").write_text(json.dumps(TORCH_LINEAGE))
    boards.pin(str(folder), name=name, board=board)
    return f"{board}/{name}"


def test_an_8_mib_pickle_bomb_in_a_torch_experiment_is_refused_before_unpickling(board, tmp_path):
    """8 MiB of one opcode as final.pt's data.pkl, within the file-size check of a model of 28.6 MiB of
    tensors: it made torch.load(weights_only=True) allocate ~600 MB over seconds. The pickle is refused
    from the zip's directory (its size), never unpickled: the traced peak stays small."""
    import tracemalloc

    torch = pytest.importorskip("torch")
    from pinstorm.training import load_experiment
    from pinstorm.training.experiments import ExperimentError
    from pinstorm.training.torch_models import build_torch_model

    target = _pinned_torch_run(board, tmp_path, "bomb", lambda path: _torch_pickle_bomb(path, b"}" * (8 << 20)))
    with torch.device("meta"):   # torch's meta device loads its Python tables (~66 MB traced) on first use
        build_torch_model("alexnet", 10, 32, width=0.125)
    tracemalloc.start()
    try:
        with pytest.raises(ExperimentError, match=r"weights of experiment 'bomb' refused: .*final\.pt: "
                                                  r"final/data\.pkl is 8,388,611 bytes.*max_pickle_bytes=") as caught:
            load_experiment(target)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "16 tensors" not in str(caught.value)
    assert peak < 64 << 20, f"{peak:,} bytes traced refusing an 8 MiB pickle"


@pytest.mark.parametrize("case", sorted(PICKLE_BOMBS))
def test_a_small_pickle_bomb_in_a_torch_experiment_is_refused_by_its_bound(board, tmp_path, case):
    """Within the size bound (~64 KiB), still far more opcodes, memo, stack or marks than 16 tensors need."""
    from pinstorm.training import load_experiment
    from pinstorm.training.experiments import ExperimentError

    pytest.importorskip("torch")
    body, bound = PICKLE_BOMBS[case]
    target = _pinned_torch_run(board, tmp_path, f"small-{case}", lambda path: _torch_pickle_bomb(path, body))
    with pytest.raises(ExperimentError, match=rf"experiment 'small-{case}' refused: .*final/data\.pkl: .*"
                                              rf"{re.escape(bound)}"):
        load_experiment(target)


def test_genuine_torch_pickles_pass_the_scan_far_within_its_bounds(tmp_path):
    """What the bounds are proportional to: a state dict, and a torch_fit checkpoint with Adam's slots, a
    metric history and an input position, of this project's models."""
    torch = pytest.importorskip("torch")
    from pinstorm.training.torch_checkpoint import bounds_for, check_torch_pickle, load_checked
    from pinstorm.training.torch_fit import CHECKPOINT_EXTRA_BYTES, checkpoint_tensors
    from pinstorm.training.torch_models import build_torch_model

    for name, kwargs in (("alexnet", {"width": 0.125}), ("resnet_small", {})):
        model = build_torch_model(name, 10, 32, **kwargs)
        state = model.state_dict()
        torch.save(state, tmp_path / "final.pt")
        summary = check_torch_pickle(tmp_path / "final.pt", tensors=len(state))
        bounds = bounds_for(len(state))
        assert summary.opcodes < bounds["max_opcodes"] / 1.3 and summary.bytes < bounds["max_pickle_bytes"] / 4
        loaded = load_checked(tmp_path / "final.pt", tensors=len(state))
        assert all(torch.equal(loaded[k], v) for k, v in state.items())

        optim = torch.optim.Adam(model.parameters())
        model(torch.zeros(2, 3, 32, 32)).sum().backward()
        optim.step()
        checkpoint = {"format": 2, "epoch": 90, "model": state, "optimizer": optim.state_dict(),
                      "history": {k: [0.5] * 90 for k in ("loss", "accuracy", "val_loss", "val_accuracy")},
                      "partial": {"step": 3, "world": 8, "sums": [1.0, 2.0], "positions": "x" * (2 << 20),
                                  "rng": torch.get_rng_state()}}
        torch.save(checkpoint, tmp_path / "checkpoint.pt")
        # within the tensors' own opcode bound, without the history's allowance (CHECKPOINT_EXTRA_OPCODES)
        check_torch_pickle(tmp_path / "checkpoint.pt", tensors=checkpoint_tensors(model),
                           extra_bytes=CHECKPOINT_EXTRA_BYTES, max_string=CHECKPOINT_EXTRA_BYTES)


@pytest.mark.parametrize("layout", ["duplicate", "outside", "no-data-pkl", "legacy", "trailing", "deflated"])
def test_zips_torch_could_read_otherwise_are_refused(tmp_path, layout):
    """The pickle scanned is the one torch.load unpickles: one archive folder, each name once (torch
    ignores case), data.pkl present and whole, nothing compressed (torch would inflate a record whole); a
    pre-1.6 (legacy) file is refused outright."""
    torch = pytest.importorskip("torch")
    from pinstorm.training.torch_checkpoint import UnsafeCheckpoint, check_torch_pickle

    path = tmp_path / "final.pt"
    torch.save({"w": torch.zeros(4)}, path, _use_new_zipfile_serialization=layout != "legacy")
    if layout != "legacy":
        with zipfile.ZipFile(path) as source:
            entries = [(info.filename, source.read(info)) for info in source.infolist()]
        deflate = zipfile.ZIP_DEFLATED if layout == "deflated" else zipfile.ZIP_STORED
        with zipfile.ZipFile(path, "w", compression=deflate) as target:
            for name, data in entries:
                if layout == "no-data-pkl" and name.endswith("/data.pkl"):
                    continue
                target.writestr(name, data + b"\0" * 8 if layout == "trailing" and name.endswith("data.pkl") else data)
            if layout == "duplicate":
                target.writestr("final/DATA.PKL", b"\x80\x02" + b"}" * 100_000 + b".")
            elif layout == "outside":
                target.writestr("other/data.pkl", b"\x80\x02}.")
    match = {"duplicate": "duplicate entry names", "outside": "outside the archive folder 'final'",
             "no-data-pkl": "no final/data.pkl", "legacy": "legacy \\(pre-1.6\\) format",
             "trailing": "8 bytes after the pickle's STOP", "deflated": "entry 'final/data.pkl' is compressed"}[layout]
    with pytest.raises(UnsafeCheckpoint, match=match):
        check_torch_pickle(path, tensors=1)


# ---- malformed lineages ----------------------------------------------------------------------
def _model(**changes):
    model = {"name": "alexnet", "image_size": 32, "num_classes": 10, "kwargs": {"width": 0.125}}
    return json.dumps({"format": 1, "model": {**model, **changes}})


MALFORMED = {
    "deep": ('{"model": {"name": "alexnet", "image_size": 32, "num_classes": 10}, "x": ' + "[" * 100_000
             + "]" * 100_000 + "}", "values nest more than 32 deep"),
    "long-int": ('{"model": {"name": "alexnet", "image_size": 32, "num_classes": 1' + "0" * 5000 + "}}",
                 "more than 19 digits"),
    "overflow": (_model().replace('"num_classes": 10', '"num_classes": 1e400'), "1e400 is not a finite float"),
    "nan": (_model().replace('"num_classes": 10', '"num_classes": NaN'), "NaN is not a number JSON allows"),
    "bool": (_model(num_classes=True), "num_classes True is out of range"),
    "string": (_model(image_size="32"), "image_size '32' is out of range"),
    "float": (_model(num_classes=10.0), "num_classes 10.0 is out of range"),
    "nested-kwarg": (_model(kwargs={"width": {"a": [1]}}), "width={'a': \\[1\\]} is out of type or range"),
    "huge-width": (_model(kwargs={"width": 1e308}), "width=1e\\+308 is out of type or range"),
    "unknown-kwarg": (_model(kwargs={"weights": "imagenet"}), "'weights' is not one alexnet takes"),
    "kwargs-list": (_model(kwargs=[1, 2]), "model kwargs must be an object, got list"),
    "model-name": (_model(name="x" * 10_000), "model name must be a short plain name"),
    "unknown-model": (_model(name="vgg16", kwargs={}), "cannot build vgg16 from its lineage: unknown model"),
    "model-list": ('{"model": [1, 2]}', "no 'model' object"),
    "top-list": ("[]", "no 'model' object"),
    "not-utf8": (b'{"model": "\xff\xfe"}', "codec can't decode"),
    "not-json": ("{model: 1", "Expecting property name"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_lineages_are_one_experiment_error(http_board, tmp_path, genuine, case):
    text, match = MALFORMED[case]
    _load_refused(served_experiment(http_board, _experiment(tmp_path, genuine, f"bad-{case}", lineage_text=text)), match)


# ---- properties of the HDF5 bounds ------------------------------------------------------------
MODEL_SHAPES = [(3, 3, 2, 4), (4,), (32, 8), (8,)]
MAX_CHUNK = 4096
DTYPES = ["f2", "f4", "f8", "i1", "i8", "u4", "?", "c8", "S4", "U2"]
VARIANT = st.fixed_dictionaries({
    "shape": st.one_of(st.sampled_from(MODEL_SHAPES + [()]),
                       st.lists(st.integers(1, 40), min_size=1, max_size=3).map(tuple)),
    "dtype": st.sampled_from(DTYPES),
    "layout": st.sampled_from(["contiguous", "chunked", "compact", "external", "virtual"]),
    "chunk": st.lists(st.integers(1, 64), min_size=3, max_size=3),
    "filter": st.sampled_from([None, "gzip", "lzf", "shuffle", "scaleoffset"]),
    "link": st.sampled_from(["hard", "hard", "hard", "soft", "external"]),
})


def _write_variant(path: Path, spec: dict, victim: Path) -> None:
    """A weights-shaped file with one extra entry, ``vars/x``, built as ``spec`` says."""
    with h5py.File(path, "w") as f:
        for i, shape in enumerate(MODEL_SHAPES):
            f.create_dataset(f"layers/l{i}/vars/0", data=np.zeros(shape, "f4"))
        where = "layers/l0/vars/x"
        if spec["link"] == "soft":
            f[where] = h5py.SoftLink("/layers/l1/vars/0")
            return
        if spec["link"] == "external":
            f[where] = h5py.ExternalLink(str(victim), "/")
            return
        shape, dtype = spec["shape"], np.dtype(spec["dtype"])
        if spec["layout"] == "virtual":
            layout = h5py.VirtualLayout(shape, dtype)
            layout[...] = h5py.VirtualSource(str(victim), "d", shape)
            f.create_virtual_dataset(where, layout)
        elif spec["layout"] == "external":
            if not shape:   # h5py drops `external` for a scalar and stores it in the file: no such variant
                raise ValueError("a scalar cannot be stored externally")
            f.create_dataset(where, shape, dtype, external=[(str(victim), 0, h5py.h5f.UNLIMITED)])
        elif spec["layout"] == "compact":
            plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            plist.set_layout(h5py.h5d.COMPACT)
            space = h5py.h5s.create_simple(shape) if shape else h5py.h5s.create(h5py.h5s.SCALAR)
            h5py.h5d.create(f.id, where.encode(), h5py.h5t.py_create(dtype, logical=True), space, dcpl=plist)
        elif spec["layout"] == "chunked" and shape:
            chunks = tuple(min(c, s) for c, s in zip(spec["chunk"], shape))
            options = {"compression": spec["filter"]} if spec["filter"] in ("gzip", "lzf") else {}
            options.update(shuffle=True) if spec["filter"] == "shuffle" else None
            options.update(scaleoffset=0) if spec["filter"] == "scaleoffset" and dtype.kind in "iu" else None
            dataset = f.create_dataset(where, shape, dtype, chunks=chunks, **options)
            dataset[(0,) * len(shape)] = np.zeros((), dtype)
        else:
            f.create_dataset(where, shape, dtype, data=np.zeros(shape, dtype) if dtype.kind != "U" else None)


def _oracle(spec: dict) -> bool:
    """Whether a weights file for MODEL_SHAPES may hold ``spec`` (computed from the spec, not the file)."""
    if spec["link"] != "hard" or spec["layout"] in ("external", "virtual"):
        return False
    dtype = np.dtype(spec["dtype"])
    if dtype.kind not in "fiub" or tuple(spec["shape"]) not in set(MODEL_SHAPES) | {()}:
        return False
    if spec["layout"] == "chunked" and spec["shape"]:
        chunks = [min(c, s) for c, s in zip(spec["chunk"], spec["shape"])]
        if math.prod(chunks) * dtype.itemsize > MAX_CHUNK:
            return False
        if spec["filter"] == "scaleoffset" and dtype.kind in "iu":
            return False
    return True


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=VARIANT)
def test_check_weights_file_accepts_exactly_what_the_model_can_hold(tmp_path, spec):
    victim = tmp_path / "victim.h5"
    if not victim.exists():
        with h5py.File(victim, "w") as f:
            f.create_dataset("d", data=np.ones((40, 40, 40), "f8"))
    path = tmp_path / "w.weights.h5"
    try:
        _write_variant(path, spec, victim)
    except (ValueError, TypeError, OSError):
        return                                # a combination h5py cannot write (e.g. a compact 40^3)
    largest = max(math.prod(s) for s in MODEL_SHAPES) * 8
    if _oracle(spec):
        summary = check_weights_file(path, MODEL_SHAPES, max_chunk_bytes=MAX_CHUNK)
        with h5py.File(path) as f:            # what passed reads back within the model's bound
            read = []
            f.visititems(lambda name, item: read.append(item[()].nbytes) if isinstance(item, h5py.Dataset) else None)
        assert len(read) == len(MODEL_SHAPES) + 1 and max(read) <= largest
        assert summary.datasets == len(MODEL_SHAPES) + 1
    else:
        with pytest.raises(UnsafeWeights):
            check_weights_file(path, MODEL_SHAPES, max_chunk_bytes=MAX_CHUNK)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(extra=st.lists(st.tuples(st.integers(1, 2_000_000), st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=4))
def test_declared_sizes_past_the_largest_variable_are_refused(tmp_path, extra):
    """Datasets declared (never written) with any element count: refused unless a model shape."""
    path = tmp_path / "w.weights.h5"
    with h5py.File(path, "w") as f:
        for i, (count, itemsize) in enumerate(extra):
            f.create_dataset(f"layers/l{i}/vars/0", (count,), f"f{itemsize}" if itemsize > 1 else "i1",
                             chunks=(min(count, 512),), compression="gzip")
    shapes = [(4,), (1000,)]
    if all((count,) in shapes for count, _ in extra):
        assert check_weights_file(path, shapes).declared_bytes <= 8 * 1000 * len(extra)
    else:
        with pytest.raises(UnsafeWeights, match="none of the model's variables has that shape"):
            check_weights_file(path, shapes)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 8191), st.integers(0, 255)), min_size=1, max_size=20))
def test_a_damaged_structure_is_refused_or_passes_never_a_raw_error(tmp_path, genuine, flips):
    """Bytes changed in the file's first 8 KiB (superblock, object headers, B-trees, heaps)."""
    data = bytearray(genuine["weights"].read_bytes())
    for position, value in flips:
        data[position] = value
    path = tmp_path / "damaged.weights.h5"
    path.write_bytes(bytes(data))
    try:
        summary = check_weights_file(path, genuine["shapes"])
    except UnsafeWeights:
        return
    assert summary.declared_bytes <= 8 * max(math.prod(s) for s in genuine["shapes"]) * summary.datasets


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from([8, 32, 224, 10, 1000, 0.125, 1.4, "lrn", "alexnet"]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["width", "dense_units", "dropout", "normalization", "name", "alpha", "x"]), children,
        max_size=4),
    max_leaves=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["alexnet", "resnet50", "mobilenet_v2", "AlexNet", "vgg"]) | JSON_VALUES,
       image_size=JSON_VALUES, num_classes=JSON_VALUES, kwargs=JSON_VALUES)
def test_any_lineage_is_checked_or_one_experiment_error(tmp_path, name, image_size, num_classes, kwargs):
    """Whatever JSON a board puts in the model record: a spec within bounds, or one ExperimentError."""
    from pinstorm.training.experiments import ExperimentError, _checked_lineage

    path = tmp_path / "lineage.json"
    path.write_text(json.dumps({"model": {"name": name, "image_size": image_size, "num_classes": num_classes,
                                          "kwargs": kwargs}}))
    try:
        model = _checked_lineage(path, "prop")["model"]
    except ExperimentError:
        return
    assert type(model["image_size"]) is int and 8 <= model["image_size"] <= 8192
    assert type(model["num_classes"]) is int and 2 <= model["num_classes"] <= 1_000_000
    assert model["kwargs"] is None or isinstance(model["kwargs"], dict)
    for value in (model["kwargs"] or {}).values():
        assert value is None or isinstance(value, (bool, int, float, str))
        assert not isinstance(value, (int, float)) or abs(value) <= 65536
