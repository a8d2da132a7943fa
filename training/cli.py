"""`pinstorm train` and `pinstorm demo`: the training commands of the one `pinstorm` command line.

TensorFlow is imported only inside the commands, so listing or helping stays fast.
"""
from __future__ import annotations

from . import keras_env  # noqa: F401  (before anything can import TensorFlow)

import json
import logging
import os
from pathlib import Path

import click

from pinstorm.pipeline import DECODES, ReaderOptions

from .runs import DEFAULTS as FIT, FRAMEWORKS, LR_SCHEDULES, OPTIMIZERS, PRECISIONS, WEIGHTS_FILES
from .strategy import STRATEGY_KINDS   # a plain tuple: importing it does not load TensorFlow

READER = ReaderOptions()   # the readers' defaults, shown in the flags' help

MODEL_NAMES = ("alexnet", "resnet50", "mobilenet_v2")
TORCH_MODELS = ("alexnet", "resnet_small", "resnet50")        # training/torch_models.py
TORCH_ONLY_MODELS = tuple(m for m in TORCH_MODELS if m not in MODEL_NAMES)
TORCH_BACKENDS = ("auto", "nccl", "gloo")
POSITIVE = click.IntRange(min=1)
POSITIVE_FLOAT = click.FloatRange(min=0, min_open=True)


def _image_size(value: str) -> int | list[tuple[int, int]]:
    """`224`, or a progressive-resizing schedule `0:128,6:192,12:224` (epoch:size, fast.ai style)."""
    try:
        if ":" not in value:
            size = int(value)
            if size < 1:
                raise ValueError
            return size
        schedule = [(int(epoch), int(size)) for epoch, size in (step.split(":") for step in value.split(","))]
        if any(epoch < 0 or size < 1 for epoch, size in schedule):
            raise ValueError
        return schedule
    except ValueError:
        raise click.BadParameter(f"expected a positive size or EPOCH:SIZE,... such as 0:128,6:192, got {value!r}",
                                 param_hint="--image-size") from None


def output_option(*aliases: str, help: str):
    """`-o/--output`: the folder a command writes, the same name on every command (older names still work)."""
    return click.option("--output", "-o", *aliases, "output_dir", default=None, type=click.Path(file_okay=False),
                        help=help)


overwrite_option = click.option("--overwrite", is_flag=True,
                                help="Replace what an earlier run left in --output instead of refusing.")


def fit_options(command):
    """The options of the fit itself, one definition for `train` and `spark-train`: the same flags mean
    the same there."""
    options = [
        click.option("--learning-rate", type=POSITIVE_FLOAT, default=FIT.learning_rate, show_default=True),
        click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=FIT.optimizer, show_default=True),
        click.option("--lr-schedule", type=click.Choice(LR_SCHEDULES), default=FIT.lr_schedule, show_default=True,
                     help="cosine: to zero at the last step; step: /10 at 1/3, 2/3 and 8/9 of the epochs."),
        click.option("--warmup-epochs", type=click.FloatRange(0), default=FIT.warmup_epochs, show_default=True,
                     help="Epochs over which the learning rate rises linearly to --learning-rate."),
        click.option("--weight-decay", type=click.FloatRange(0), default=FIT.weight_decay, show_default=True,
                     help="sgd: L2 on the gradient (1e-4 for ResNet); adam: decoupled (AdamW). Not on biases "
                          "or normalisation."),
        click.option("--label-smoothing", type=click.FloatRange(0, 1, max_open=True), default=FIT.label_smoothing,
                     show_default=True, help="Share of each target spread over all classes (0.1 for ImageNet)."),
        click.option("--accumulate-batches", type=POSITIVE, default=FIT.accumulate_batches, metavar="N",
                     show_default=True, help="Each optimizer step sums the gradients of N batches (global batch: "
                                             "batch size x replicas or ranks x N)."),
        click.option("--ema-decay", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=None,
                     metavar="D", help="Also keep a moving average of the weights with this decay a step (e.g. "
                                       "0.9998), validated each epoch and saved beside the final weights."),
        click.option("--seed", type=int, default=None),
        click.option("--no-flip", is_flag=True, help="No random left-right flips (for digits, text, ...)."),
        click.option("--crop-min", type=click.FloatRange(0, 1, min_open=True), default=None,
                     help=f"Smallest random-crop area (0-1], default {READER.crop_area[0]}."),
        click.option("--stream", is_flag=True, default=READER.stream,
                     help="Read a remote dataset part by part through the machine's bounded part cache."),
        click.option("--cache-limit", default=READER.cache_limit, metavar="BYTES", callback=_byte_size,
                     help="The part cache's size with --stream: bytes, or with K, M, G, T (default: 80% of what "
                          "its disk could give it)."),
    ]
    for option in reversed(options):   # decorators apply bottom-up: keep the --help order as listed
        command = option(command)
    return command


def torch_options(command):
    """The PyTorch fit's own flags, one definition for `train` and `spark-train`. Each defaults to None (then
    `train_torch`'s and `make_torch_loader`'s own defaults apply) and is refused with TensorFlow (`torch_only`)."""
    options = [
        click.option("--precision", type=click.Choice(PRECISIONS), default=None,
                     help="PyTorch: auto (the default) is bf16 autocast on a GPU that has bf16, else fp32; fp16 adds "
                          "a gradient scaler."),
        click.option("--compile", "compile_model", is_flag=True, default=None,
                     help="PyTorch: run the model through torch.compile (the first steps compile)."),
        click.option("--decode", type=click.Choice(DECODES), default=None,
                     help="PyTorch: where the JPEGs are decoded (default cpu); gpu: nvJPEG on the training GPU "
                          "(without one it says so and decodes on the CPU)."),
        click.option("--cpu-share", type=click.FloatRange(0, 1), default=None,
                     help="PyTorch, with --decode gpu: the share of the batches the loader's CPU workers decode "
                          "instead (both decode at once)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def torch_only(framework: str, precision, compile_model, decode, cpu_share=None) -> dict:
    """The `train_torch` arguments the PyTorch flags ask for (only those given); with TensorFlow, a usage error
    that names them rather than a silent ignore."""
    given = {"--precision": precision, "--compile": compile_model or None, "--decode": decode,
             "--cpu-share": cpu_share}
    named = [flag for flag, value in given.items() if value is not None]
    if framework != "torch":
        if named:
            raise click.UsageError(f"{', '.join(named)}: PyTorch's flags; add --framework torch")
        return {}
    options: dict = {}
    if precision is not None:
        options["precision"] = precision
    if compile_model:
        options["compile"] = True
    if cpu_share is not None and decode != "gpu":
        raise click.UsageError("--cpu-share splits the decode between the CPU and the GPU: add --decode gpu")
    if decode is not None:
        options["input_options"] = {"decode": decode}
    if cpu_share is not None:
        options["input_options"]["cpu_share"] = cpu_share
    return options


def reader_options(no_flip: bool, crop_min: float | None, stream: bool = READER.stream,
                   cache_limit: int | None = READER.cache_limit) -> dict:
    """The reader's `input_options` the fit flags ask for (only what differs from `ReaderOptions`' defaults)."""
    options: dict = {}
    if no_flip:
        options["flip"] = False
    if crop_min is not None:
        options["crop_area"] = (crop_min, READER.crop_area[1])
    if stream != READER.stream:
        options["stream"] = stream
    if cache_limit != READER.cache_limit:
        options["cache_limit"] = cache_limit
    return options


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _byte_size(ctx, param, value):
    """--cache-limit: bytes, or a number with K, M, G or T (powers of 1024)."""
    if value is None:
        return None
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    try:
        size = int(float(text[:len(text) - len(unit)]) * _UNITS[unit])
    except ValueError:
        raise click.BadParameter(f"expected bytes, or a number with K, M, G or T, got {value!r}") from None
    if size < 1:
        raise click.BadParameter(f"must be at least 1 byte, got {value!r}")
    return size


def _refuse_finished(output_dir, marker: str, overwrite: bool) -> None:
    """A finished run's outputs are not replaced unasked: --overwrite, or another --output."""
    if output_dir and not overwrite and list(Path(output_dir).glob(marker)):
        raise click.UsageError(f"--output {output_dir} holds the results of an earlier run ({marker}); add "
                               "--overwrite to replace them, or choose another --output")


def _throughput_line(result) -> str:
    """`1,234 images/s, input stall 3%, global batch 256; outputs in runs/...` (the stall where measured)."""
    stall = "" if result.input_stall is None else f", input stall {result.input_stall:.0%}"
    return (f"{result.images_per_second:,.0f} images/s{stall}, global batch {result.global_batch_size}; "
            f"outputs in {result.output_dir}")


def _log_to_console(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


@click.command()
@click.argument("model", type=click.Choice(MODEL_NAMES + TORCH_ONLY_MODELS, case_sensitive=False))
@click.argument("data")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default="tensorflow", show_default=True,
              help="torch: PyTorch (DDP when launched by torchrun; --cross-device-ops auto, nccl or gloo).")
@click.option("--val", "validation", default=None, help="Validation dataset (Parquet URL or folder).")
@click.option("--epochs", type=POSITIVE, default=FIT.epochs, show_default=True)
@click.option("--steps-per-epoch", type=POSITIVE, default=FIT.steps_per_epoch,
              help="Steps per epoch (default: one pass over the data): a short trial run.")
@click.option("--batch-size", type=POSITIVE, default=FIT.batch_size, show_default=True,
              help="Per replica; global = x replicas.")
@click.option("--image-size", default=str(FIT.image_size), show_default=True, callback=lambda c, p, v: _image_size(v),
              help="A size, or a progressive schedule EPOCH:SIZE,... such as 0:128,6:192,12:224.")
@click.option("--width", type=POSITIVE_FLOAT, default=1.0, show_default=True, help="AlexNet width multiplier.")
@click.option("--strategy", "kind", type=click.Choice(STRATEGY_KINDS),
              default="auto", show_default=True, help="auto: multi-worker when TF_CONFIG names several workers.")
@click.option("--devices", type=POSITIVE, default=None, help="GPUs to use, or logical CPU devices without GPUs.")
@click.option("--cross-device-ops", default="auto", show_default=True,
              help="auto, nccl, hierarchical, one-device, collective (across workers: auto, nccl, ring).")
@click.option("--no-fallback", is_flag=True, help="Fail instead of falling back when the all-reduce probe fails.")
@click.option("--probe-timeout", type=POSITIVE_FLOAT, default=60.0, show_default=True)
@click.option("--checkpoint-dir", default=None, help="BackupAndRestore folder: a restarted run resumes from it.")
@click.option("--backup-every", type=POSITIVE, default=None, metavar="STEPS",
              help="Back up every STEPS steps instead of every epoch; a restarted run continues mid-epoch with "
                   "exactly the samples it had not trained on (Parquet input; with --framework torch, needs "
                   "--checkpoint-dir).")
@output_option("--output-dir", help="Metrics CSV, curves PNG, TensorBoard logs, final weights "
                                    "(default: runs/<model>-<time>).")
@overwrite_option
@click.option("--parallel", type=POSITIVE, default=None, help="Parallel image decodes.")
@fit_options
@torch_options
@click.option("--pin", "pin", default=None, metavar="BOARD/NAME",
              help="Pin the finished run (weights, metrics, curves, TensorBoard, lineage) as a new version.")
@click.option("--json", "as_json", is_flag=True, help="Print the result summary as JSON.")
@click.option("--verbose", "-v", is_flag=True)
def train(model, data, framework, validation, epochs, steps_per_epoch, batch_size, image_size, width, kind, devices,
          cross_device_ops, no_fallback, probe_timeout, checkpoint_dir, backup_every, output_dir, overwrite, parallel,
          learning_rate, optimizer, lr_schedule, warmup_epochs, weight_decay, label_smoothing, seed, no_flip, crop_min,
          stream, cache_limit, precision, compile_model, decode, cpu_share, accumulate_batches, ema_decay, pin, as_json,
          verbose):
    """Train MODEL on the Parquet dataset DATA (with TF_CONFIG set: one worker of a multi-worker run; with
    --framework torch under torchrun: one rank of a DDP run)."""
    model = model.lower()
    if framework == "torch":
        _check_torch_arguments(model, kind, devices, cross_device_ops)
        if backup_every is not None and checkpoint_dir is None:
            raise click.UsageError("--backup-every needs --checkpoint-dir (where the backups go)")
    elif model not in MODEL_NAMES:
        raise click.UsageError(f"{model} is a PyTorch model: add --framework torch")
    torch_args = torch_only(framework, precision, compile_model, decode, cpu_share)
    _refuse_finished(output_dir, f"**/{WEIGHTS_FILES[framework]}", overwrite)
    _log_to_console(verbose)
    input_options = {**reader_options(no_flip, crop_min, stream, cache_limit), **torch_args.pop("input_options", {})}
    recipe = dict(learning_rate=learning_rate, optimizer=optimizer, lr_schedule=lr_schedule,
                  warmup_epochs=warmup_epochs, weight_decay=weight_decay, label_smoothing=label_smoothing,
                  accumulate_batches=accumulate_batches, ema_decay=ema_decay)
    if framework == "torch":
        _train_torch(model, data, validation, epochs=epochs, steps_per_epoch=steps_per_epoch,
                     batch_size=batch_size, image_size=image_size,
                     width=width, pin=pin, backend=cross_device_ops.lower(), fallback=not no_fallback,
                     probe_timeout=probe_timeout, checkpoint_dir=checkpoint_dir, backup_every=backup_every,
                     output_dir=output_dir,
                     num_workers=parallel or 0, seed=seed, input_options=input_options, as_json=as_json,
                     **recipe, **torch_args)
        return
    from .strategy import make_strategy, strategy_choice
    from .fit import train as run_training

    strategy = make_strategy(kind, devices=devices, cross_device_ops=cross_device_ops,
                             fallback=None if no_fallback else "one-device", probe_timeout=probe_timeout)
    if not as_json:
        click.echo(f"strategy: {strategy_choice(strategy).describe()}")
    model_kwargs = {"width": width} if model == "alexnet" else {}
    result = run_training(model, data, validation, strategy=strategy, epochs=epochs,
                          steps_per_epoch=steps_per_epoch, batch_size=batch_size,
                          image_size=image_size, parallel=parallel, checkpoint_dir=checkpoint_dir,
                          output_dir=output_dir, seed=seed, model_kwargs=model_kwargs, input_options=input_options,
                          pin=pin, **recipe,
                          backup_every=backup_every or "epoch",
                          verbose=0 if as_json else 2)   # --json: stdout carries only the summary
    if as_json:
        click.echo(json.dumps(result.summary()))
        return
    click.echo(f"validation: {json.dumps(result.val_metrics)}")
    click.echo(_throughput_line(result))
    if result.experiment:
        click.echo(f"pinned as {result.experiment['pin']} version {result.experiment['version']}")


def _check_torch_arguments(model, kind, devices, cross_device_ops) -> None:
    """The TensorFlow-only flags, refused with --framework torch rather than ignored."""
    if model not in TORCH_MODELS:
        raise click.UsageError(f"--framework torch trains {', '.join(TORCH_MODELS)}, not {model}")
    if kind != "auto" or devices is not None:
        raise click.UsageError("--strategy and --devices are TensorFlow's: with --framework torch, launch one process "
                               "per device with torchrun (each becomes a DDP rank)")
    if cross_device_ops.lower() not in TORCH_BACKENDS:
        raise click.UsageError(f"with --framework torch, --cross-device-ops is the backend: one of "
                               f"{', '.join(TORCH_BACKENDS)}")


def _train_torch(model, data, validation, *, width, as_json, pin, **options) -> None:
    from .torch_fit import train_torch

    result = train_torch(model, data, validation, model_kwargs={"width": width} if model != "resnet50" else {},
                         pin=pin, **options)
    if not result.is_chief:   # one line per run, from rank 0
        return
    if as_json:
        click.echo(json.dumps(result.summary()))
        return
    strategy = result.strategy or {}
    if strategy.get("kind") == "ddp":
        from .torch_fit import BackendChoice

        import dataclasses

        fields = {f.name for f in dataclasses.fields(BackendChoice)}
        click.echo("strategy: " + BackendChoice(**{k: v for k, v in strategy.items() if k in fields}).describe())
    click.echo(f"validation: {json.dumps(result.val_metrics)}")
    click.echo(_throughput_line(result))
    if result.experiment:
        click.echo(f"pinned as {result.experiment['pin']} version {result.experiment['version']}")


@click.command()
@output_option("--workdir", help="Where boards, cache, Parquet, logs and the report go (default: a new temp "
                                 "folder). An earlier demo's folder is reused: its images, board and Parquet are "
                                 "kept, and the run is pinned as a new version.")
@click.option("--overwrite", is_flag=True, help="Start from scratch: delete what an earlier demo left in --output "
                                                "(only the demo's own files and folders).")
@click.option("--size", type=click.Choice(["full", "small"]), default="full", show_default=True,
              help="small: a quick end-to-end check on a few images.")
@click.option("--epochs", type=POSITIVE, default=None, help="Override the size's epochs.")
@click.option("--parallel", type=POSITIVE, default=4, show_default=True, help="Parallel fetches and decodes.")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default="tensorflow", show_default=True,
              help="torch: train with PyTorch (DDP, NCCL probed and fallen back from) instead of TensorFlow.")
@click.option("--verbose", "-v", is_flag=True)
def demo(output_dir, overwrite, size, epochs, parallel, framework, verbose):
    """The whole flow offline: digits -> board -> HTTP -> Parquet -> AlexNet under MirroredStrategy (or DDP)."""
    _log_to_console(verbose)
    from .demo import clear_demo, run_demo

    if overwrite and output_dir:
        removed = clear_demo(output_dir)
        if removed:
            click.echo(f"--overwrite: removed {', '.join(removed)} from {output_dir}")
    run_demo(output_dir, size=size, epochs=epochs, parallel=parallel, echo=click.echo, framework=framework)



# --------------------------------------------------------------------------- pinstorm spark-train (issue 13)

def _spark_conf(pairs) -> dict:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--conf")
        conf[key.strip()] = value
    return conf


@click.command("spark-train")
@click.argument("model", type=click.Choice(MODEL_NAMES + TORCH_ONLY_MODELS, case_sensitive=False))
@click.argument("data", required=False)
@click.option("--framework", type=click.Choice(FRAMEWORKS), default="tensorflow", show_default=True,
              help="torch: each task is a DDP rank (Spark's TorchDistributor where it runs, else pinstorm's "
                   "barrier stage).")
@click.option("--master", default=None, help="local[N] (default: local[--workers]), spark://HOST:PORT, yarn, "
              "k8s://https://HOST:PORT.")
@click.option("--workers", type=POSITIVE, default=2, show_default=True, help="Barrier tasks = training workers.")
@click.option("--partition-board", default=None, metavar="URL|BOARD",
              help="Instead of DATA: each worker fetches its own 1/N of the categories from this board "
                   "(a data.txt URL or a registered board), converts and trains on them.")
@click.option("--val", "validation", default=None, help="Validation dataset (Parquet URL every executor can read).")
@click.option("--epochs", type=POSITIVE, default=FIT.epochs, show_default=True)
@click.option("--batch-size", type=POSITIVE, default=FIT.batch_size, show_default=True,
              help="Per replica; global = x replicas.")
@click.option("--image-size", type=POSITIVE, default=FIT.image_size, show_default=True)
@click.option("--width", type=POSITIVE_FLOAT, default=1.0, show_default=True, help="AlexNet width multiplier.")
@click.option("--checkpoint-dir", default=None, help="Shared BackupAndRestore folder: a relaunch resumes from it.")
@click.option("--backup-every", type=POSITIVE, default=None, metavar="STEPS",
              help="Back up every STEPS steps too: a relaunch continues mid-epoch with exactly the samples not "
                   "yet trained on (needs --checkpoint-dir).")
@output_option("--output-dir", help="Shared folder for metrics, curves, TensorBoard, weights.")
@overwrite_option
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Relaunch the barrier stage this many times when a worker dies.")
@click.option("--python", default=None, help="Interpreter the executors run (default: this one).")
@click.option("--driver-host", default=None, help="Address executors reach the driver at "
              "(default: 127.0.0.1 for local masters, Spark's choice otherwise).")
@click.option("--conf", "conf_pairs", multiple=True, metavar="KEY=VALUE", help="Spark setting (repeatable).")
@click.option("--slots-timeout", type=POSITIVE_FLOAT, default=120.0, show_default=True,
              help="Seconds to wait for executors to offer --workers task slots.")
@click.option("--parallel", type=POSITIVE, default=None, help="Parallel image decodes (and fetches).")
@fit_options
@torch_options
@click.option("--json", "as_json", is_flag=True, help="Print the result (every rank, every attempt) as JSON.")
@click.option("--verbose", "-v", is_flag=True)
def spark_train_cmd(model, data, framework, master, workers, partition_board, validation, epochs, batch_size,
                    image_size, width, checkpoint_dir, backup_every, output_dir, overwrite, max_restarts, python,
                    driver_host, conf_pairs, slots_timeout, parallel, learning_rate, optimizer, lr_schedule,
                    warmup_epochs, weight_decay, label_smoothing, seed, no_flip, crop_min, stream, cache_limit,
                    precision, compile_model, decode, cpu_share, accumulate_batches, ema_decay, as_json, verbose):
    """Train MODEL on DATA with --workers workers as one Spark barrier stage (MultiWorkerMirroredStrategy, or
    with --framework torch one DDP rank per task)."""
    model = model.lower()
    with_torch = framework == "torch"
    if with_torch and model not in TORCH_MODELS:
        raise click.UsageError(f"--framework torch trains {', '.join(TORCH_MODELS)}, not {model}")
    if not with_torch and model not in MODEL_NAMES:
        raise click.UsageError(f"{model} is a PyTorch model: add --framework torch")
    if backup_every is not None and checkpoint_dir is None:
        raise click.UsageError("--backup-every needs --checkpoint-dir (where the backups go)")
    torch_args = torch_only(framework, precision, compile_model, decode, cpu_share)
    _refuse_finished(output_dir, f"**/{WEIGHTS_FILES[framework]}", overwrite)
    _log_to_console(verbose)
    if (data is None) == (partition_board is None):
        raise click.UsageError("give DATA (a Parquet dataset every executor can read) or --partition-board, not both")
    conf = _spark_conf(conf_pairs)
    from .spark import spark_train
    from .spark_session import spark_session

    input_options = {**reader_options(no_flip, crop_min, stream, cache_limit), **torch_args.pop("input_options", {})}
    args = dict(model_name=model, data=data, validation_data=validation, epochs=epochs, batch_size=batch_size,
                image_size=image_size, checkpoint_dir=checkpoint_dir, output_dir=output_dir,
                learning_rate=learning_rate, optimizer=optimizer, lr_schedule=lr_schedule,
                warmup_epochs=warmup_epochs, weight_decay=weight_decay, label_smoothing=label_smoothing,
                accumulate_batches=accumulate_batches, ema_decay=ema_decay, seed=seed, input_options=input_options,
                model_kwargs={"width": width} if model in ("alexnet", "resnet_small") else {})
    if with_torch:
        args.update(num_workers=parallel or 0, backup_every=backup_every, **torch_args)
    else:
        args.update(parallel=parallel, backup_every=backup_every or "epoch", verbose=0)
    if partition_board is not None:
        args.update(partition_board=partition_board, partition_parallel=parallel)
    session = spark_session(master, workers=workers, app_name=f"pinstorm spark-train {model.lower()}", python=python,
                            driver_host=driver_host, conf=conf)
    used_master = session.sparkContext.master
    try:
        result = spark_train(args, workers, session, max_restarts=max_restarts, slots_timeout=slots_timeout,
                             framework=framework)
    finally:
        session.stop()
    if as_json:
        click.echo(json.dumps(result.summary()))
        return
    chief = result[0].result
    click.echo(f"{len(result)} workers on {used_master}: "
               f"{', '.join(w.address for w in result)}")
    if result.restarts:
        causes = "; ".join(a.error for a in result.attempts if a.error)
        click.echo(f"restarts: {result.restarts} ({causes}); resumed at epoch {result.resumed_from_epoch}, "
                   f"~{result.seconds_lost:.0f} s lost")
    click.echo(f"validation: {json.dumps(chief.get('val_metrics', {}))}")
    click.echo(f"outputs in {chief.get('output_dir')}")


@click.command()
@click.argument("dataset", required=False)
@click.option("--board", default=None, help="Board to time fetching from: a registered name or a data.txt URL.")
@click.option("--pins", default=None, help="Comma-separated pins to fetch (default: the board's first categories).")
@click.option("--max-pins", type=POSITIVE, default=8, show_default=True)
@click.option("--demo", "use_demo", is_flag=True,
              help="Profile the demo's board (served over HTTP) and dataset, built in --output.")
@click.option("--size", type=click.Choice(["full", "small"]), default="small", show_default=True,
              help="With --demo: the demo's size.")
@click.option("--model", type=click.Choice(MODEL_NAMES, case_sensitive=False), default="alexnet", show_default=True)
@click.option("--image-size", type=POSITIVE, default=None, help="Default 224 (32 with --demo).")
@click.option("--batch-size", type=POSITIVE, default=FIT.batch_size, show_default=True, help="Per replica.")
@click.option("--width", type=POSITIVE_FLOAT, default=None,
              help="AlexNet width multiplier (default 1.0; 0.25 with --demo).")
@click.option("--steps", type=POSITIVE, default=20, show_default=True, help="Training steps per timed epoch.")
@click.option("--parallel", type=POSITIVE, default=None, help="Parallel image decodes (default: AUTOTUNE).")
@click.option("--fetch-parallel", type=POSITIVE, default=8, show_default=True, help="Pins fetched at once.")
@click.option("--strategy", "kind", type=click.Choice(STRATEGY_KINDS), default="auto", show_default=True)
@click.option("--devices", type=POSITIVE, default=None, help="GPUs to use, or logical CPU devices without GPUs.")
@click.option("--cross-device-ops", default="auto", show_default=True)
@click.option("--no-flip", is_flag=True, help="No random left-right flips (implied by --demo).")
@output_option(help="Folder for profile.json and profile.png (default: a new temp folder).")
@overwrite_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--verbose", "-v", is_flag=True)
def profile(dataset, board, pins, max_pins, use_demo, size, model, image_size, batch_size, width, steps, parallel,
            fetch_parallel, kind, devices, cross_device_ops, no_flip, output_dir, overwrite, as_json, verbose):
    """Time each stage from BOARD to a training step on DATASET; name the bound and what to change."""
    import contextlib
    import tempfile

    _refuse_finished(output_dir, "profile.json", overwrite)
    _log_to_console(verbose)
    from .profiling import profile as run_profile
    from .strategy import make_strategy

    if not (dataset or board or use_demo):
        raise click.UsageError("give a DATASET, a --board, or --demo")
    output_dir = output_dir or tempfile.mkdtemp(prefix="pinstorm-profile-")
    say = (lambda text: None) if as_json else click.echo
    strategy = None
    if dataset or use_demo:   # devices are fixed when TensorFlow starts: build the strategy first
        strategy = make_strategy(kind, devices=devices, cross_device_ops=cross_device_ops)
    with contextlib.ExitStack() as stack:
        input_options = {"flip": False} if (no_flip or use_demo) else {}
        if use_demo:
            from .demo import demo_data

            data = stack.enter_context(demo_data(os.path.join(output_dir, "demo"), size=size))
            dataset, board = dataset or data["train"], board or data["board"]
            image_size, width = image_size or 32, width or 0.25
            input_options["crop_area"] = (0.6, 1.0)
            say(f"demo board {data['url']} and dataset {dataset}")
        model_kwargs = {"width": width or 1.0} if model.lower() == "alexnet" else {}
        report = run_profile(dataset, board=board, pins=pins.split(",") if pins else None, max_pins=max_pins,
                             model_name=model, model_kwargs=model_kwargs, image_size=image_size or 224,
                             batch_size=batch_size, strategy=strategy, parallel=parallel,
                             fetch_parallel=fetch_parallel, steps=steps, input_options=input_options,
                             output_dir=output_dir, echo=say)
    if as_json:
        click.echo(json.dumps(report.summary()))
