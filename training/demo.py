"""``pinstorm demo``: the whole pinstorm flow on embedded data, offline, in a few minutes on 2 cores.

Real images that ship with scikit-learn (handwritten digits, upscaled) become an ILSVRC-shaped
tree; its categories are pinned one per pin to a local board; that board is served over HTTP on
127.0.0.1 and opened as a read-only data.txt board; the categories are fetched back in
parallel through the board's cache and converted to Parquet; AlexNet trains under
MirroredStrategy on two logical CPU devices with NCCL requested, so the all-reduce probe fails
and the fallback to ReductionToOneDevice is shown. Every stage's time and throughput, the
strategy choice and the final validation accuracy go to the console and to ``report.md``.
``framework="torch"`` trains the same AlexNet with PyTorch instead: a process group on 127.0.0.1
with NCCL requested (the probe falls back to gloo on CPU), DDP, ``train_torch``; that run is not
pinned as an experiment (experiments hold Keras models).

Everything (boards, cache, Parquet, logs) lives under the work folder. The boards are built with
the constructors (``board_folder``, ``board_datatxt``) and never registered, so the user's board
registry and config are never touched, in this process or on disk.
"""

from __future__ import annotations

from . import keras_env  # noqa: F401  (must precede TensorFlow)
from .errors import TrainingError
from .plots import save_figure
from .runs import FRAMEWORKS

import json
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable
from pinstorm.boards.safety import secrets
from pinstorm import boards, pipeline

log = secrets.logger("pinstorm.training")

# full: ~1440 train / ~360 val digits, 64 px JPEGs, AlexNet at 1/4 width on 32 px crops; 8 epochs reach
# 0.97-0.99 on both frameworks (about 0.93 by the fourth).
SIZES = {
    "full": dict(per_class=None, tree_image_size=64, image_size=32, width=0.25, epochs=8, batch_size=32,
                 learning_rate=1e-3, normalization="lrn", dropout=0.5),
    # small: 160 train digits; without LRN and dropout AlexNet learns them in ~80 steps (>= 0.5 accuracy)
    "small": dict(per_class=20, tree_image_size=32, image_size=32, width=0.125, epochs=8, batch_size=8,
                  learning_rate=1e-3, normalization=None, dropout=0.0),
}
# A mirrored digit is another digit (or none): no flips; crops keep most of the stroke.
DIGIT_AUGMENTATION = {"flip": False, "crop_area": (0.6, 1.0)}
EXPERIMENT_PIN = "alexnet-digits"   # the demo's run, pinned to its local board
LOCAL_BOARD, HTTP_BOARD = "pinstorm-demo", "pinstorm-demo-http"   # names only label them: nothing is registered


class DemoError(TrainingError, RuntimeError):
    """The demo cannot run as asked (unknown size, workdir not empty of another demo's files, ...)."""


@dataclass
class Stage:
    name: str
    seconds: float
    items: float
    unit: str
    detail: str = ""

    @property
    def throughput(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def line(self, index: int, total: int) -> str:
        rate = f"{self.throughput:,.0f} {self.unit}/s" if self.items else ""
        return f"[{index}/{total}] {self.name:<28} {self.seconds:7.2f} s  {rate:>18}  {self.detail}"


def _folder_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def run_demo(workdir=None, *, size: str = "full", epochs: int | None = None, parallel: int = 4,
             echo: Callable[[str], None] | None = print, framework: str = "tensorflow") -> dict:
    """Run the demo in ``workdir`` (default: a new temporary folder, kept for the report).

    ``size="small"`` is a quicker end-to-end check (20 images per class, 8 short epochs, >= 0.5);
    ``"full"`` reaches >= 0.90 validation accuracy. Returns the stage timings, the strategy
    choice, the final validation metrics and the report's path. ``framework="torch"`` trains with
    PyTorch (stages 6 and 7; the run is not pinned).

    Args:
        workdir: The folder everything goes into (None: a new temporary folder).
        size: ``"full"`` or ``"small"``.
        epochs: Overrides the size's number of epochs (None: the size's).
        parallel: Parallel fetches, conversions and decodes.
        echo: A function called with each progress line (None: quiet).
        framework: ``"tensorflow"`` or ``"torch"``.

    Returns:
        A dict of the stage timings, the strategy choice, the final validation metrics and the report's path.
    """
    if size not in SIZES:
        raise DemoError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if framework not in FRAMEWORKS:
        raise DemoError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    settings = dict(SIZES[size], framework=framework)
    if epochs is not None:
        settings["epochs"] = int(epochs)
    say = echo or (lambda text: None)
    # Two logical CPU devices must exist before TensorFlow runs its first op (the pipeline's
    # conversions do not run TF ops, but a caller may have); fail now rather than after the fetch, and
    # before a temporary folder exists that a failure would leave behind (as without TensorFlow).
    if framework == "tensorflow":
        from .strategy import configure_cpu_devices

        configure_cpu_devices(2)
    workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="pinstorm-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)

    stages: list[Stage] = []
    total = 7

    def record(stage: Stage) -> None:
        stages.append(stage)
        say(stage.line(len(stages), total))

    say(f"pinstorm demo ({size}{', PyTorch' if framework == 'torch' else ''}) in {workdir}")
    tree = workdir / "ilsvrc"
    started = time.perf_counter()
    if not (tree / "LOC_synset_mapping.txt").exists():
        pipeline.make_digits_tree(tree, image_size=settings["tree_image_size"], per_class=settings["per_class"])
    layout = pipeline.scan(tree)
    n_train, n_val = len(layout.items("train")), len(layout.items("val"))
    record(Stage("build ILSVRC digits tree", time.perf_counter() - started, n_train + n_val, "images",
                 f"{len(layout.classes)} categories, {n_train} train + {n_val} val"))

    board_dir, cache_dir = workdir / "board", workdir / "cache"
    summary = _run_stages(workdir, settings, size, parallel, say, record, stages, layout, board_dir, cache_dir)
    say(f"final validation accuracy: {summary['val_accuracy']:.4f}")
    if summary["experiment"]:
        say(f"experiment: pinned as {EXPERIMENT_PIN} version {summary['experiment']['version']} on the demo board "
            f"({board_dir})")
    say(f"report: {summary['report']}")
    return summary


# What a demo writes into its folder: all that `clear_demo` (`pinstorm demo --overwrite`) may delete.
DEMO_ENTRIES = ("ilsvrc", "board", "cache", "parquet", "run", "backup", "summary.json", "report.md",
                ".report.md.tmp", "stages.png")


def clear_demo(workdir) -> list[str]:
    """Delete an earlier demo's files from `workdir` (only `DEMO_ENTRIES`: anything else of the user's
    stays), so the next demo starts from scratch. Returns the names removed."""
    import shutil

    removed = []
    for name in DEMO_ENTRIES:
        path = Path(workdir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def _local_board(board_dir: Path, cache_dir: Path):
    """The demo's writable board: a folder in the workdir with its own cache there."""

    return boards.board_folder(board_dir, cache=cache_dir / "local", name=LOCAL_BOARD)


def _run_stages(workdir, settings, size, parallel, say, record, stages, layout, board_dir, cache_dir) -> dict:
    """Stages 2-7 (a TensorFlow run is pinned to the demo's local board)."""

    from .experiments import source_pins

    n_train = len(layout.items("train"))
    local = _local_board(board_dir, cache_dir)
    started = time.perf_counter()
    pipeline.repartition(layout, local, zip=True, parallel=parallel, progress=False)
    record(Stage("repartition: pin per category", time.perf_counter() - started, n_train, "images",
                 f"{len(layout.classes)} zipped pins + categories on local board {board_dir}"))

    with boards.serve_board(board_dir) as url:
        started = time.perf_counter()
        http = boards.board_datatxt(url, cache=cache_dir / "http", name=HTTP_BOARD)
        record(Stage("serve + open data.txt board", time.perf_counter() - started, 0, "", f"{url}/data.txt"))

        started = time.perf_counter()
        data_map = pipeline.imagenet_partition(0, 1, board=http, parallel=parallel)
        seconds = time.perf_counter() - started
        sources = [dict(s, url=url) for s in source_pins(data_map["categories"], http)]
        fetched_mb = _folder_bytes(data_map["image"]) / 1e6
        record(Stage("fetch categories over HTTP", seconds, len(data_map["image"]), "images",
                     f"{len(data_map['categories'])} pins, {parallel} in parallel, {fetched_mb:.1f} MB "
                     f"({fetched_mb / seconds if seconds else 0:.1f} MB/s)"))

    started = time.perf_counter()
    train_url, val_url = workdir / "parquet" / "train", workdir / "parquet" / "val"
    converted = pipeline.convert(data_map, str(train_url), split="train", parallel=parallel, progress=False)
    converted_val = pipeline.convert(layout, str(val_url), split="val", classes=data_map["classes"],
                                     parallel=parallel, progress=False)
    rows = converted.rows + converted_val.rows
    record(Stage("convert to Parquet", time.perf_counter() - started, rows, "images",
                 f"{converted.rows} train rows in {converted.row_groups} row groups, {converted_val.rows} val"))

    if settings["framework"] == "torch":
        result, choice = _torch_stages(workdir, settings, parallel, say, record, train_url, val_url)
    else:
        result, choice = _tensorflow_stages(workdir, settings, size, parallel, say, record, train_url, val_url,
                                            local, sources)
    accuracy = result.val_metrics.get("accuracy", float("nan"))
    summary = secrets.scrub({
        "workdir": str(workdir),
        "size": size,
        "framework": settings["framework"],
        "stages": [dict(asdict(s), throughput=s.throughput) for s in stages],
        "strategy": choice.as_dict(),
        "strategy_description": choice.describe(),
        "val_metrics": result.val_metrics,
        "val_accuracy": accuracy,
        "history": result.history,
        "train": result.summary(),
        "experiment": dict(result.experiment, board=local.name, board_path=str(board_dir))
        if result.experiment else None,
    })
    summary["report"] = str(_write_report(workdir, summary, result))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _tensorflow_stages(workdir, settings, size, parallel, say, record, train_url, val_url, local, sources):
    """Stages 6-7 with TensorFlow: MirroredStrategy on two CPU devices, NCCL requested; the run is pinned."""
    from .strategy import make_strategy, strategy_choice

    started = time.perf_counter()
    strategy = make_strategy("mirrored", devices=2, cross_device_ops="nccl")
    choice = strategy_choice(strategy)
    record(Stage("strategy + all-reduce probe", time.perf_counter() - started, 0, "", choice.describe()))

    from .fit import alexnet_train

    started = time.perf_counter()
    result = alexnet_train(
        str(train_url), strategy=strategy, epochs=settings["epochs"], batch_size=settings["batch_size"],
        image_size=settings["image_size"], parallel=parallel, width=settings["width"],
        normalization=settings["normalization"], dropout=settings["dropout"],
        validation_data=str(val_url), output_dir=workdir / "run", checkpoint_dir=workdir / "backup",
        input_options=DIGIT_AUGMENTATION, seed=0, verbose=0, learning_rate=settings["learning_rate"],
        callbacks=[_epoch_printer(say)], pin=(local, EXPERIMENT_PIN),
        lineage={"demo": size, "category_pins": sources},
    )
    _record_training(record, "train AlexNet (mirrored x2)", started, result)
    return result, choice


def _record_training(record, name: str, started: float, result) -> None:
    accuracy = result.val_metrics.get("accuracy", float("nan"))
    trained = (result.steps_per_epoch or 0) * result.global_batch_size * len(result.epochs)
    record(Stage(name, time.perf_counter() - started, trained, "images",
                 f"{len(result.epochs)} epochs, global batch {result.global_batch_size}, "
                 f"{result.images_per_second:,.0f} images/s in fit, val accuracy {accuracy:.3f}"))


def _torch_stages(workdir, settings, parallel, say, record, train_url, val_url):
    """Stages 6-7 with PyTorch: a one-rank process group on 127.0.0.1 with NCCL requested (on CPU its
    probe fails and gloo takes over, as on a host with a broken NCCL), then DDP training."""
    import socket

    import torch.distributed as dist

    from .torch_fit import init_distributed, train_torch

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    group_env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    previous = {key: os.environ.get(key) for key in group_env}
    os.environ.update(group_env)
    try:
        started = time.perf_counter()
        choice = init_distributed("nccl")
        record(Stage("process group + all-reduce probe", time.perf_counter() - started, 0, "", choice.describe()))
        started = time.perf_counter()
        # one DataLoader worker per spare core: decoding beside the training loop, never more processes than cores
        workers = max(0, min(parallel, (os.cpu_count() or 1) - 1))
        result = train_torch(
            "alexnet", str(train_url), str(val_url), epochs=settings["epochs"], batch_size=settings["batch_size"],
            image_size=settings["image_size"], learning_rate=settings["learning_rate"], seed=0,
            model_kwargs=dict(width=settings["width"], normalization=settings["normalization"],
                              dropout=settings["dropout"]),
            output_dir=workdir / "run", checkpoint_dir=workdir / "backup", input_options=DIGIT_AUGMENTATION,
            num_workers=workers, callbacks=[_torch_epoch_printer(say)])
        _record_training(record, "train AlexNet (torch DDP)", started, result)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return result, choice


@contextmanager
def demo_data(workdir, *, size: str = "small", parallel: int = 4):
    """The demo's board and dataset without the training, e.g. to ``profile`` them.

    Builds (or reuses) the digits tree, pins one zip per category to a local board in
    ``workdir/board``, converts the train and val splits to Parquet and serves the board over HTTP
    for the duration of the ``with`` block. Yields ``{"board": <the data.txt Board>, "url": <its
    base URL>, "local_board": <the folder Board>, "train": <Parquet folder>, "val": <Parquet
    folder>, "categories": [wnids]}``; neither board is registered.
    """
    if size not in SIZES:
        raise DemoError(f"size must be one of {sorted(SIZES)}, got {size!r}")

    settings = SIZES[size]
    workdir = Path(workdir)
    tree = workdir / "ilsvrc"
    if not (tree / "LOC_synset_mapping.txt").exists():
        pipeline.make_digits_tree(tree, image_size=settings["tree_image_size"], per_class=settings["per_class"])
    layout = pipeline.scan(tree)
    board_dir, cache_dir = workdir / "board", workdir / "cache"
    local = _local_board(board_dir, cache_dir)
    pipeline.repartition(layout, local, zip=True, parallel=parallel, progress=False)
    # converted from the tree (the demo converts what it fetched: other inputs, other folders)
    train_url, val_url = workdir / "parquet" / "tree-train", workdir / "parquet" / "tree-val"
    pipeline.convert(layout, str(train_url), split="train", parallel=parallel, progress=False)
    pipeline.convert(layout, str(val_url), split="val", parallel=parallel, progress=False)
    with boards.serve_board(board_dir) as url:
        http = boards.board_datatxt(url, cache=cache_dir / "http", name=HTTP_BOARD)
        yield {"board": http, "url": url, "local_board": local, "train": str(train_url),
               "val": str(val_url), "categories": list(layout.classes)}


def _epoch_line(epoch: int, logs: dict) -> str:
    return (f"      epoch {epoch + 1}: loss {logs.get('loss', float('nan')):.3f}  "
            f"accuracy {logs.get('accuracy', float('nan')):.3f}  "
            f"val_accuracy {logs.get('val_accuracy', float('nan')):.3f}")


def _torch_epoch_printer(say):
    """The same line per epoch, as a train_torch callback."""
    return lambda epoch, logs: say(_epoch_line(epoch, logs))


def _epoch_printer(say):
    """One short line per epoch (a Keras callback; tf-keras is imported only when training starts)."""
    import tf_keras as keras

    def on_epoch_end(epoch, logs=None):
        say(_epoch_line(epoch, logs or {}))

    return keras.callbacks.LambdaCallback(on_epoch_end=on_epoch_end)


def _stage_plot(stages: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 3.2))
    names = [s["name"] for s in stages][::-1]
    axis.barh(names, [s["seconds"] for s in stages][::-1], color="#4c72b0")
    axis.set_xlabel("seconds")
    axis.set_title("pinstorm demo: time per stage")
    figure.tight_layout()
    return save_figure(figure, path)


def _write_report(workdir: Path, summary: dict, result) -> Path:
    """report.md beside stages.png and the run's curves.png (relative links, so the folder moves)."""
    stages_png = _stage_plot(summary["stages"], workdir / "stages.png")
    lines = [
        "# pinstorm demo report",
        "",
        f"Size: **{summary['size']}**. Final validation accuracy: **{summary['val_accuracy']:.4f}** "
        f"(loss {summary['val_metrics'].get('loss', float('nan')):.4f}).",
        "",
        f"Strategy: {summary['strategy_description']}",
        "",
        "| # | stage | seconds | throughput | detail |",
        "|---|---|---:|---:|---|",
    ]
    for index, stage in enumerate(summary["stages"], start=1):
        rate = f"{stage['throughput']:,.0f} {stage['unit']}/s" if stage["items"] else ""
        lines.append(f"| {index} | {stage['name']} | {stage['seconds']:.2f} | {rate} | {stage['detail']} |")
    lines += ["", f"![time per stage]({stages_png.name})", ""]
    if result.plot_png:
        lines += [f"![training curves]({os.path.relpath(result.plot_png, workdir)})", ""]
    lines += ["Per-epoch metrics: " + f"`{os.path.relpath(result.metrics_csv, workdir)}`" + (
        f"; TensorBoard logs: `{os.path.relpath(result.tensorboard_dir, workdir)}`." if result.tensorboard_dir
        else "."), ""]
    experiment = summary["experiment"]
    if experiment is None:   # a PyTorch run: its weights stay in the run folder
        lines += [f"Final weights (a PyTorch state dict): `{os.path.relpath(result.weights_path, workdir)}`.", ""]
        return _replace_report(workdir, lines)
    version_dir = Path(experiment["board_path"]) / experiment["name"] / experiment["version"]
    lines += [
        "## Pinned experiment",
        "",
        f"The run is pinned as **{experiment['name']}** version [{experiment['version']}]"
        f"({os.path.relpath(version_dir, workdir)}/) on the demo board (`{experiment['board_path']}`): "
        f"weights, metrics, curves, TensorBoard logs and its [lineage]({os.path.relpath(version_dir, workdir)}"
        f"/lineage.json) (the category pins and versions it was trained from, arguments, strategy, packages). "
        "Load it back:",
        "",
        "```python",
        "from pinstorm.boards import board_folder",
        "from pinstorm.training import load_experiment",
        f"board = board_folder({experiment['board_path']!r})",
        f"model = load_experiment({experiment['name']!r}, board=board, version={experiment['version']!r})",
        "```",
        "",
    ]
    return _replace_report(workdir, lines)


def _replace_report(workdir: Path, lines: list[str]) -> Path:
    report = workdir / "report.md"
    temporary = workdir / ".report.md.tmp"
    temporary.write_text("\n".join(lines))
    os.replace(temporary, report)
    return report
