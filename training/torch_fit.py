"""``train_torch``: the PyTorch side of ``train``, single process or DDP, resumable, with the same outputs.

Data is a Parquet dataset URL from the pipeline, read with ``pipeline.make_torch_loader``. When the
process was launched for ``torch.distributed`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, as torchrun and Spark's ``TorchDistributor`` set them), the model runs under
``DistributedDataParallel`` and each rank reads its own ``shard=(rank, world)`` of the row groups;
``batch_size`` is per rank, so the global batch grows with the world.

The backend follows ``strategy.py``'s idea: a broken NCCL fails (or hangs) at the first
collective, not when the group is made, so NCCL is only used after one real ``all_reduce`` has
passed inside a timeout, and every rank agrees on the outcome through the rendezvous store. When
the probe fails on any rank, every rank falls back to gloo, the original error is logged as a
WARNING, and the choice is recorded (``TrainResult.strategy``). On CPU-only machines gloo is used
directly.

``checkpoint_dir`` holds one ``checkpoint.pt`` (model, optimizer, finished epochs, the metric
history): written by rank 0 after every epoch, read back with ``torch.load(weights_only=True)``
(tensors and plain containers only, never arbitrary objects) after its pickle was scanned within bounds
set by the model's tensors (``torch_checkpoint``), removed after a finished run. With
``backup_every=N`` it is also written every N steps, with every rank's input position, so a resumed
run goes on with exactly the samples not yet trained on. Every write is synced, then renamed.
Outputs, as ``train`` writes them: ``metrics.csv``, ``curves.png``, ``final.pt`` (a state dict);
ranks other than 0 write into ``output_dir/workers/rank<N>``. Neither TensorFlow nor tf-keras is
imported here.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable

from pinstorm.extras import require

from .errors import InvalidTrainingInput, TrainingError
from .fallback import error_line, fallback_warning, probe_failure, probe_outcome
from .plots import plot_curves, read_metrics_csv
from .results import TrainResult
from .image_sizes import ImageSizes
from .runs import (DEFAULTS as FIT, EMA_WEIGHTS_FILES, PRECISIONS, SGD_MOMENTUM, TOP_K, WEIGHTS_FILES, FitOptions,
                   decays, default_output_dir, reports_top_k)
from .torch_models import build_torch_model
from pinstorm.boards.safety import secrets
from pinstorm.progress import progress_bar
from pinstorm import pipeline
from pinstorm.pipeline import shard_row_groups

torch = require("torch", "torch", "pinstorm.training.train_torch")
dist = torch.distributed

__all__ = ["BackendChoice", "BackendProbeError", "init_distributed", "train_torch"]

log = secrets.logger("pinstorm.training")

BACKENDS = ("auto", "nccl", "gloo")
_GROUP: dict = {}   # the BackendChoice of the group init_distributed made, while that group lives
CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_FORMAT = 2   # 2: mid-epoch backups (step, partial sums, RNG, every rank's input position)
CHECKPOINT_TENSORS = 2048             # load_checkpoint without a model: ResNet-50 with Adam's slots holds ~1,000
CHECKPOINT_EXTRA_OPCODES = 1 << 15    # the metric history (a float per metric per epoch: 6,000 epochs of 5)
CHECKPOINT_EXTRA_BYTES = 32 << 20     # every rank's input position (JSON; ImageNet's bitmap ~160 kB per epoch)
_LOADER_OPTIONS = ("flip", "crop_area", "eval_crop", "shuffle_buffer", "dct_scale", "verify", "retries",
                   "storage_options", "max_pixels", "prefetch_factor", "multiprocessing_context", "decode",
                   "decode_threads", "device", "cpu_share", "stream", "cache_limit")


class BackendProbeError(TrainingError, RuntimeError):
    """The process group's all-reduce probe failed and no fallback was allowed."""


class BackendProbeTimeout(BackendProbeError, TimeoutError):
    """The all-reduce probe hung past its deadline (its thread is abandoned: a collective cannot be cancelled)."""


# --------------------------------------------------------------------------- the process group

@dataclass
class BackendChoice:
    """Which ``torch.distributed`` backend runs the all-reduce, and why; ``describe()`` is one line."""

    backend: str
    requested: str
    world_size: int
    rank: int
    probe_seconds: float | None = None
    fallback_from: str | None = None
    error: str | None = None

    def describe(self) -> str:
        return (f"DDP on {self.world_size} process(es) with {self.backend}"
                + probe_outcome(self.fallback_from, self.error, self.probe_seconds))

    def as_dict(self) -> dict:
        return dict(self.__dict__, kind="ddp")


def launched_distributed() -> bool:
    """Whether torchrun (or TorchDistributor, or a test) launched this process as one rank of a group."""
    return all(os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def _device_for(backend: str):
    if backend == "nccl" or (torch.cuda.is_available() and backend != "gloo"):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def _probe(backend: str, store, rank: int, world: int, timeout: float) -> float:
    """Make the default group with ``backend`` and run one all-reduce; its seconds, or an exception.

    Runs in a daemon thread joined with ``timeout``: a hung collective cannot be cancelled, so its
    thread is abandoned (``TimeoutError``), as ``strategy.probe_all_reduce`` does.
    """
    outcome: dict = {}

    def target():
        try:
            started = time.perf_counter()
            dist.init_process_group(backend, store=dist.PrefixStore(f"pinstorm/{backend}/", store), rank=rank,
                                    world_size=world, timeout=timedelta(seconds=max(timeout, 1.0)))
            value = torch.full((8,), float(rank + 1), device=_device_for(backend))
            dist.all_reduce(value)
            expected = world * (world + 1) / 2
            if not torch.allclose(value.cpu(), torch.full((8,), expected)):
                raise BackendProbeError(f"all-reduce probe returned {value.tolist()} instead of {expected}")
            outcome["seconds"] = time.perf_counter() - started
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"pinstorm-{backend}-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise BackendProbeTimeout(f"the {backend} all-reduce probe did not finish within {timeout:g} s (hung "
                                  "collective); its thread was abandoned")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["seconds"]


def _agree(store, rank: int, world: int, backend: str, error: str | None, timeout: float) -> list[str]:
    """Every rank's probe error ("" for a pass), shared through the store, so all ranks choose alike."""
    store.set(f"pinstorm/probe/{backend}/{rank}", error or "")
    keys = [f"pinstorm/probe/{backend}/{r}" for r in range(world)]
    store.wait(keys, timedelta(seconds=max(timeout, 1.0)))
    return [store.get(key).decode() for key in keys]


def init_distributed(backend: str = "auto", *, probe_timeout: float = 60.0, fallback: bool = True) -> BackendChoice:
    """Join the process group the environment describes, with a backend whose all-reduce was seen to work.

    ``backend``: ``"auto"`` (NCCL when CUDA is available, else gloo), ``"nccl"`` or ``"gloo"``. A
    failed or hung NCCL probe on any rank makes every rank fall back to gloo and logs why
    (``fallback=False``: raise ``BackendProbeError`` instead). A group that already exists is used
    as it is.

    Args:
        backend: ``"auto"``, ``"nccl"`` or ``"gloo"``.
        probe_timeout: Seconds the all-reduce probe (and the rendezvous, at least 30) may take.
        fallback: Fall back to gloo when the NCCL probe fails (False: raise).

    Returns:
        The ``BackendChoice``: the backend in use, the one asked for, the world size, this rank.

    Raises:
        InvalidTrainingInput: An unknown backend, or no torch.distributed environment (``RANK``,
            ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
        BackendProbeError: The NCCL probe failed and ``fallback`` is False.
    """
    if backend not in BACKENDS:
        raise InvalidTrainingInput(f"unknown backend {backend!r}; use one of {BACKENDS}")
    if dist.is_initialized():   # made by init_distributed (its record, fallback included) or by the caller
        made = _GROUP.get("choice")
        if made is not None and made.world_size == dist.get_world_size() and made.backend == dist.get_backend():
            return made
        return BackendChoice(dist.get_backend(), backend, dist.get_world_size(), dist.get_rank())
    if not launched_distributed():
        raise InvalidTrainingInput("init_distributed needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun "
                                   "and TorchDistributor set them)")
    store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=max(probe_timeout, 30.0))))
    chosen = backend if backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    choice = BackendChoice(chosen, backend, world, rank)
    if chosen == "gloo":
        choice.probe_seconds = _probe("gloo", store, rank, world, probe_timeout)
        return _made(choice)
    error = None
    try:
        choice.probe_seconds = _probe("nccl", store, rank, world, probe_timeout)
    except BaseException as exc:  # noqa: BLE001 - any failure of NCCL here means "do not use it"
        error = error_line(exc)
        cause = exc
    errors = _agree(store, rank, world, "nccl", error, probe_timeout)
    failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
    if not failed:
        return _made(choice)
    reason = error or failed[0]
    if not fallback:
        raise BackendProbeError(probe_failure("NCCL", reason)) from (cause if error else None)
    log.warning("%s", fallback_warning("NCCL", reason, "gloo"))
    if dist.is_initialized():     # NCCL came up on this rank but not on another one
        try:
            dist.destroy_process_group()
        except Exception as exc:  # noqa: BLE001 - a half-broken NCCL group; gloo gets a fresh one
            log.warning("could not tear down the NCCL group (%s)", error_line(exc))
    choice = BackendChoice("gloo", backend, world, rank, fallback_from="nccl", error=reason)
    choice.probe_seconds = _probe("gloo", store, rank, world, probe_timeout)
    return _made(choice)


def _made(choice: BackendChoice) -> BackendChoice:
    _GROUP["choice"] = choice
    log.info("torch.distributed: %s", choice.describe())
    return choice


# --------------------------------------------------------------------------- results and files

def _write_csv(path: Path, history: dict[str, list[float]]) -> None:
    """The whole run's metrics as Keras's CSVLogger writes them (epoch, then sorted names), atomically."""
    names = sorted(history)
    rows = len(next(iter(history.values()), []))
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["epoch", *names])
        for epoch in range(rows):
            writer.writerow([epoch, *(history[name][epoch] for name in names)])
    os.replace(temporary, path)


def _save(obj, path: Path) -> None:
    """torch.save under a temporary name, synced to disk, then renamed: a crash (or a lost node) never
    leaves half a file, and the rename is never on disk before the bytes it names."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:   # a platform whose folders cannot be opened (Windows): the rename stands as it is
        return
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def _backup(checkpoint_dir: Path, rank: int, distributed: bool, *, model, optim, epoch: int, step: int, world: int,
            history: dict, model_name: str, loader, sums: list[float], accumulate: int = 1, ema=None) -> None:
    """A checkpoint at `step` of `epoch` (0: its start) with every rank's input position (gathered), the
    epoch's summed metrics so far and torch's random state; rank 0 writes it, the ranks wait until it is
    whole."""
    positions = [loader.state_dict()]
    if distributed:
        gathered: list = [None] * world
        dist.all_gather_object(gathered, positions[0])
        positions = gathered
    if rank == 0:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
        _save({"format": CHECKPOINT_FORMAT, "epoch": epoch, "model": model.state_dict(),
               "optimizer": optim.state_dict(), "history": history, "model_name": model_name,
               "partial": {"step": step, "world": world, "accumulate": accumulate, "sums": [float(v) for v in sums],
                           "positions": json.dumps(positions), "rng": torch.get_rng_state()},
               **({"ema": ema.state_dict()} if ema is not None else {})},
              checkpoint_dir / CHECKPOINT_FILE)
    if distributed:
        dist.barrier()


def checkpoint_tensors(model) -> int:
    """Tensors a checkpoint of `model` holds at most: its state, its moving average's (``ema_decay``), up to 4
    optimizer slots per parameter (Adam's step, moments, AMSGrad's max), the random state."""
    parameters = sum(1 for _ in model.parameters())
    return 2 * (len(model.state_dict()) + 1) + 4 * parameters + 8


def load_checkpoint(checkpoint_dir, *, tensors: int | None = None) -> dict | None:
    """The last epoch's checkpoint (tensors and plain containers only: ``weights_only=True``), or None.

    Its pickle is scanned first (`torch_checkpoint.check_torch_pickle`), bounded by `tensors` (what
    `checkpoint_tensors` counts for the model; None: `CHECKPOINT_TENSORS`, any model here) plus room for
    the metric history and every rank's input position; a refusal is a `TrainingError` naming the file.
    """
    from .torch_checkpoint import UnsafeCheckpoint, load_checked

    path = Path(checkpoint_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        state = load_checked(path, tensors=CHECKPOINT_TENSORS if tensors is None else tensors,
                             extra_opcodes=CHECKPOINT_EXTRA_OPCODES, extra_bytes=CHECKPOINT_EXTRA_BYTES,
                             max_string=CHECKPOINT_EXTRA_BYTES)
    except UnsafeCheckpoint as error:
        raise InvalidTrainingInput(f"refused to resume from {error}") from None
    if not isinstance(state, dict) or state.get("format") not in (1, CHECKPOINT_FORMAT):
        raise InvalidTrainingInput(f"{path} is not a pinstorm torch checkpoint (format {CHECKPOINT_FORMAT})")
    return state


def _optimizer(recipe: FitOptions, model):
    """SGD with momentum (`weight_decay` as L2 on the gradient) or Adam (AdamW with a `weight_decay`), the
    decay only on the parameters `decays` names."""
    parameters = list(model.parameters())
    if recipe.weight_decay:
        parameters = [{"params": [p for p in parameters if decays(p.shape)], "weight_decay": recipe.weight_decay},
                      {"params": [p for p in parameters if not decays(p.shape)], "weight_decay": 0.0}]
    if recipe.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=recipe.learning_rate, momentum=SGD_MOMENTUM)
    if recipe.weight_decay:
        return torch.optim.AdamW(parameters, lr=recipe.learning_rate)
    return torch.optim.Adam(parameters, lr=recipe.learning_rate)


def _shard_rows(info: pipeline.DatasetInfo, world: int) -> list[int]:
    """Rows of each rank's shard (the loader's rule), so every rank can compute the same step count."""

    if world == 1:
        return [int(info.rows)]
    return [sum(info.row_group_rows[g] for g in shard_row_groups(info, (r, world))) for r in range(world)]


def _autocast_dtype(precision: str, device):
    """The autocast dtype of `precision` on `device` (None: fp32, no autocast). "auto": bf16 on a CUDA GPU
    that has it (Ampere and later), else fp32, so CPU runs keep their results."""
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def _check_portable(model, model_name: str, num_classes: int, sizes: ImageSizes, model_kwargs: dict) -> None:
    """Progressive resizing trains one set of weights at every size: refused, before any work, for a model
    whose weights' shapes depend on the image size (dense layers after a flatten)."""
    shapes = [tuple(p.shape) for p in model.parameters()]
    for phase in sizes.phases:
        if phase.size != sizes.final and [tuple(p.shape) for p in build_torch_model(
                model_name, num_classes, phase.size, **model_kwargs).parameters()] != shapes:
            raise InvalidTrainingInput(f"{model_name}'s weights depend on the image size ({phase.size} against "
                                       f"{sizes.final} px): progressive resizing needs a model with global "
                                       "pooling (resnet_small, resnet50)")


def _sum_across(values: list[float], distributed: bool) -> list[float]:
    if not distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _to_device(images, device, layout):
    """A batch on `device` in `layout`, float32 in [0, 1]: uint8 batches are scaled there."""
    images = images.to(device, non_blocking=True, memory_format=layout or torch.contiguous_format)
    return images.float().mul_(1 / 255) if images.dtype == torch.uint8 else images


def _step_sums(loss_sum, logits, labels, top_k: bool):
    """A step's metric sums, on the device: loss, correct, samples and, with `top_k`, correct in the top 5."""
    sums = [loss_sum.detach().double(), (logits.argmax(1) == labels).sum().double(),
            torch.tensor(float(len(labels)), dtype=torch.float64, device=logits.device)]
    if top_k:
        sums.append((logits.topk(TOP_K, 1).indices == labels[:, None]).any(1).sum().double())
    return torch.stack(sums)


def _metrics(sums: list[float]) -> dict[str, float]:
    """Mean loss, accuracy and (with a fourth sum) top-5 accuracy from `_step_sums` totals."""
    loss_sum, correct, count, *top = sums
    count = max(count, 1)
    return {"loss": loss_sum / count, "accuracy": correct / count,
            **({"top5_accuracy": top[0] / count} if top else {})}


def _evaluate(models, loader, device, distributed: bool, amp=None, layout=None,
              top_k: bool = False) -> list[dict[str, float]]:
    """Each model's mean loss, accuracy (and top-5) over every row ``loader`` yields (summed over ranks when each
    read a shard): one decode of the data for all of them (the weights and their moving average)."""
    sums = [torch.zeros(4 if top_k else 3, dtype=torch.float64, device=device) for _ in models]
    for model in models:
        model.eval()
    with torch.no_grad():
        for images, labels in loader:
            images = _to_device(images, device, layout)
            labels = labels.to(device, non_blocking=True)
            for model, total in zip(models, sums):
                with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                    logits = model(images).float()
                total += _step_sums(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"), logits,
                                    labels, top_k)
    return [_metrics(_sum_across(total.tolist(), distributed)) for total in sums]


# --------------------------------------------------------------------------- the entry point

def train_torch(
    model_name: str = "alexnet",
    data=None,
    validation_data=None,
    *,
    epochs: int = FIT.epochs,
    batch_size: int = FIT.batch_size,
    image_size: int | list = FIT.image_size,
    num_classes: int | None = FIT.num_classes,
    learning_rate: float = FIT.learning_rate,
    optimizer: str = FIT.optimizer,
    model_kwargs: dict | None = FIT.model_kwargs,
    seed: int | None = FIT.seed,
    output_dir=FIT.output_dir,
    checkpoint_dir=FIT.checkpoint_dir,
    input_options: dict | None = FIT.input_options,
    num_workers: int = 0,
    steps_per_epoch: int | None = FIT.steps_per_epoch,
    backend: str = "auto",
    probe_timeout: float = 60.0,
    fallback: bool = True,
    threads: int | None = None,
    callbacks: list[Callable[[int, dict], None]] | None = None,
    backup_every: int | None = None,
    on_batch: Callable[[int, int, "torch.Tensor"], None] | None = None,
    pin: str | tuple | None = FIT.pin,
    lineage: dict | None = FIT.lineage,
    precision: str = "auto",
    channels_last: bool | None = None,
    compile: bool = False,
    lr_schedule: str = FIT.lr_schedule,
    warmup_epochs: float = FIT.warmup_epochs,
    weight_decay: float = FIT.weight_decay,
    label_smoothing: float = FIT.label_smoothing,
    accumulate_batches: int = FIT.accumulate_batches,
    ema_decay: float | None = FIT.ema_decay,
) -> TrainResult:
    """Train ``model_name`` (``alexnet``, ``resnet_small``) with PyTorch on the Parquet dataset ``data``.

    ``batch_size`` is per rank. Launched with the torch.distributed environment, the model runs
    under DDP with ``backend`` (``init_distributed``: NCCL probed and fallen back from, gloo on
    CPU) and each rank reads its own shard; otherwise one process trains alone. Every rank runs
    the same steps per epoch: the smallest shard's full batches (or ``steps_per_epoch``).
    ``validation_data``: a Parquet URL, every row evaluated once after each epoch.
    ``input_options`` go to ``make_torch_loader`` (e.g. ``{"flip": False, "crop_area": (0.6, 1.0)}``
    for digits; ``"shard": None`` when each rank was given its own dataset). ``num_workers``:
    DataLoader processes per rank. ``checkpoint_dir``: resume from its checkpoint when one exists,
    save one after every epoch, remove it after a finished run. ``callbacks``: functions called
    on every rank as ``fn(epoch, logs)`` after each epoch (``logs``: the epoch's metrics).
    ``threads``: torch's intra-op threads (default under DDP on CPU: ``OMP_NUM_THREADS`` where set,
    torch's own setting, else the cores shared by the ranks on this machine). ``backup_every=N``
    (with ``checkpoint_dir``): also back up every N steps within an epoch, with every rank's input
    position (``loader.state_dict()``), the epoch's partial metrics and the random state; a run
    killed mid-epoch resumes with exactly the samples it had not trained on (on another number of
    ranks: every one of them once; ranks that each read a dataset of their own, ``"shard": None``,
    resume on as many ranks), and on the same layout ends with the weights an uninterrupted run ends
    with. ``on_batch``: a function called on every rank after each training step as
    ``fn(epoch, step, ids)``, ``ids`` the step's samples (int64 ``[B]``, the loader's
    ``return_ids``), before that step's backup: which samples trained, for audits and tests.
    ``pin`` and ``lineage``: as ``train``'s (rank 0 pins the finished run; ``load_experiment`` returns the
    module).

    On a GPU: ``precision="auto"`` trains under bf16 autocast where the GPU supports it (else fp32), ``"fp16"``
    with a gradient scaler, ``"fp32"`` without autocast; the CPU keeps fp32 unless asked. ``channels_last``
    (default: on CUDA) stores images and weights NHWC, what tensor cores want; ``compile=True`` runs the
    model through ``torch.compile``; batches come from pinned memory with ``non_blocking`` copies and cuDNN
    picks its fastest kernels (``cudnn.benchmark``). ``input_options={"decode": "gpu"}`` decodes the JPEGs
    on the training GPU (`pipeline.device_decode`); without one it says so and decodes on the CPU
    (``"device": "cpu"`` beside it runs the device path there, as the tests do).

    ``accumulate_batches=N``: each optimizer step sums the gradients of N batches a rank (DDP all-reduces
    only the last one's), so the global batch is ``batch_size * ranks * N`` where memory holds only
    ``batch_size`` images: a reference recipe's batch of 1,024 on one GPU. Steps, ``steps_per_epoch``,
    ``backup_every`` and the learning-rate schedule count optimizer steps; ``on_batch`` gets a step's
    samples from all N batches.

    ``ema_decay=d`` (``--ema-decay``) also keeps an exponential moving average of the weights (and batch-norm
    statistics, as TensorFlow's `train` does), updated after every optimizer step
    (``torch.optim.swa_utils.AveragedModel``; 0.9998 a step is common for ImageNet): validated each epoch
    beside the weights, from the same decoded batches
    (``val_ema_*`` in the history; ``ema_*`` in ``val_metrics``), kept in the checkpoints so a resumed run
    goes on with it, and written as ``final-ema.pt`` (``ema_weights_path``, pinned with ``pin=``).

    The options every fit shares (``epochs``, ``batch_size``, ``image_size``, ``num_classes``,
    ``learning_rate``, ``optimizer``, ``model_kwargs``, ``steps_per_epoch``, ``seed``, ``output_dir``,
    ``checkpoint_dir``, ``input_options``, ``pin``, ``lineage``, ``lr_schedule``, ``warmup_epochs``,
    ``weight_decay``, ``label_smoothing``, ``accumulate_batches``, ``ema_decay``) are described once on
    [`FitOptions`][pinstorm.training.runs.FitOptions].

    Args:
        model_name: The model to build: ``"alexnet"``, ``"resnet_small"`` or ``"resnet50"`` (`build_torch_model`).
        data: The training data: a Parquet dataset URL from `convert` (local, fsspec or ``board://``).
        validation_data: A Parquet dataset URL evaluated after each epoch, every row once (None: none).
        num_workers: DataLoader worker processes per rank.
        backend: The process group's backend under DDP: ``"auto"``, ``"nccl"`` or ``"gloo"``
            (`init_distributed`).
        probe_timeout: Seconds the NCCL all-reduce probe may take before it counts as failed.
        fallback: Fall back to gloo when the NCCL probe fails (False: raise ``BackendProbeError``).
        threads: torch's intra-op threads (None: under DDP on CPU, ``OMP_NUM_THREADS`` where set, else
            the cores shared by this machine's ranks).
        callbacks: Functions called on every rank as ``fn(epoch, logs)`` after each epoch.
        backup_every: With ``checkpoint_dir``, also back up every that many steps within an epoch
            (None: after each epoch only).
        on_batch: A function called on every rank after each training step as ``fn(epoch, step, ids)``.
        precision: On a GPU: ``"auto"`` (bf16 autocast where supported, else fp32), ``"bf16"``,
            ``"fp16"`` (with a gradient scaler) or ``"fp32"``.
        channels_last: Store images and weights NHWC (None: on CUDA).
        compile: Run the model through ``torch.compile``.

    Returns:
        A `TrainResult` (its ``model`` the trained ``torch.nn.Module``).
    """

    wall_started, started_at = time.perf_counter(), datetime.now(timezone.utc)
    if data is None or not isinstance(data, (str, os.PathLike)):
        raise InvalidTrainingInput("train_torch needs data as a Parquet dataset URL or folder (convert it first)")
    recipe = FitOptions.pick(locals())   # the checks every fit shares, and its learning rates (training/runs.py)
    sizes = ImageSizes(image_size, epochs)   # an int, or progressive resizing [(epoch, size), ...]
    if precision not in PRECISIONS:
        raise InvalidTrainingInput(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if pin is not None:   # a bad target fails now, not after the fit
        from .experiments import check_target
        check_target(pin)
    if backup_every is not None and (int(backup_every) < 1 or checkpoint_dir is None):
        raise InvalidTrainingInput(f"backup_every must be a positive number of steps, with a checkpoint_dir (got "
                                   f"{backup_every!r}, checkpoint_dir={checkpoint_dir!r})")
    distributed = launched_distributed() or dist.is_initialized()
    own_group = distributed and not dist.is_initialized()
    choice = init_distributed(backend, probe_timeout=probe_timeout, fallback=fallback) if distributed else None
    try:
        result = _train(model_name, os.fspath(data), validation_data, choice=choice, epochs=epochs,
                      batch_size=batch_size, sizes=sizes, num_classes=num_classes,
                      model_kwargs=dict(model_kwargs or {}),
                      seed=seed, output_dir=output_dir, checkpoint_dir=checkpoint_dir,
                      input_options=dict(input_options or {}), num_workers=num_workers,
                      steps_per_epoch=steps_per_epoch, threads=threads, callbacks=list(callbacks or []),
                      backup_every=int(backup_every) if backup_every else None, on_batch=on_batch,
                      precision=precision, channels_last=channels_last, compiled=compile, recipe=recipe,
                      accumulate=accumulate_batches, ema_decay=ema_decay)
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
    if pin is not None and result.is_chief:
        from . import experiments

        result.experiment = experiments.pin_fit(
            result, pin, model_name=model_name, image_size=sizes.final, model_kwargs=dict(model_kwargs or {}),
            data=data, validation_data=validation_data, arguments={
                "epochs": epochs, "batch_size": batch_size,
                "image_size": sizes.as_list() if sizes.progressive else sizes.final,
                "learning_rate": learning_rate, "optimizer": optimizer,
                "lr_schedule": lr_schedule, "warmup_epochs": warmup_epochs, "weight_decay": weight_decay,
                "label_smoothing": label_smoothing, "accumulate_batches": accumulate_batches, "ema_decay": ema_decay,
                "steps_per_epoch": steps_per_epoch, "seed": seed,
                "num_workers": num_workers, "backend": backend,
                "input_options": dict(input_options or {}), "output_dir": result.output_dir,
                "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None},
            started_at=started_at, wall_started=wall_started, lineage=lineage)
    return result


def _train(model_name, url, validation_data, *, choice, epochs, batch_size, sizes: ImageSizes, num_classes,
           model_kwargs, seed, output_dir, checkpoint_dir, input_options, num_workers, steps_per_epoch, threads,
           callbacks, backup_every, on_batch, recipe: FitOptions, precision="fp32", channels_last=None,
           compiled=False, accumulate: int = 1, ema_decay: float | None = None) -> TrainResult:
    distributed = choice is not None
    rank, world = (choice.rank, choice.world_size) if distributed else (0, 1)
    device = _device_for(choice.backend) if distributed else torch.device("cuda" if torch.cuda.is_available()
                                                                            else "cpu")
    # an OMP_NUM_THREADS of the user's (or torchrun's 1 a rank) is torch's own setting and stays
    if threads is None and distributed and device.type == "cpu" and not os.environ.get("OMP_NUM_THREADS"):
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
        threads = max(1, (os.cpu_count() or 1) // max(local_world, 1))
    if threads:
        torch.set_num_threads(int(threads))
    output_dir = Path(output_dir) if output_dir else default_output_dir(model_name)
    write_dir = output_dir if rank == 0 else output_dir / "workers" / f"rank{rank}"
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None

    info = pipeline.dataset_info(url, storage_options=input_options.get("storage_options"))
    num_classes = num_classes or int(info.num_classes)
    if num_classes != int(info.num_classes):
        raise InvalidTrainingInput(f"num_classes={num_classes} but {url} has {info.num_classes} classes")
    top_k = reports_top_k(num_classes)
    options = {k: v for k, v in input_options.items() if k != "shard"}
    unknown = sorted(set(options) - set(_LOADER_OPTIONS))
    if unknown:
        raise InvalidTrainingInput(f"unknown input_options {unknown}; make_torch_loader takes {list(_LOADER_OPTIONS)}")
    shard = input_options["shard"] if "shard" in input_options else ((rank, world) if world > 1 else None)
    rows = [int(info.rows)] if shard is None else _shard_rows(info, world)
    steps = steps_per_epoch or min(rows) // (batch_size * accumulate)   # optimizer steps, of `accumulate` batches
    if steps < 1:
        one_step = (f"one batch of {batch_size}; lower batch_size" if accumulate == 1 else
                    f"one step of {accumulate} batches of {batch_size}; lower batch_size or accumulate_batches")
        raise InvalidTrainingInput(f"{url}: the smallest shard has {min(rows)} rows, fewer than {one_step}")
    write_dir.mkdir(parents=True, exist_ok=True)   # once the run is possible: a refused one leaves no folder

    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True   # fixed shapes: cuDNN's fastest kernels, found once
    amp = _autocast_dtype(precision, device)
    channels_last = cuda if channels_last is None else bool(channels_last)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = build_torch_model(model_name, num_classes, sizes.final, **model_kwargs)
    if sizes.progressive:
        _check_portable(model, model_name, num_classes, sizes, model_kwargs)
    model = model.to(device, memory_format=layout)
    optim = _optimizer(recipe, model)
    state = load_checkpoint(checkpoint_dir, tensors=checkpoint_tensors(model)) if checkpoint_dir else None
    initial_epoch, history, partial = 0, {}, None
    ema = None
    if ema_decay is not None:
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(ema_decay), use_buffers=True)
    if state is not None:
        # a checkpoint's tensors are checked (load_checkpoint); its structure is checked here, as it is applied
        try:
            model.load_state_dict(state["model"])
            optim.load_state_dict(state["optimizer"])
            initial_epoch, history = int(state["epoch"]), {k: list(v) for k, v in state["history"].items()}
            partial = state.get("partial")   # backup_every's: where in the epoch, and what it had summed
            if partial:
                partial.update(step=int(partial["step"]), world=int(partial["world"]),
                               accumulate=int(partial.get("accumulate", 1)))
            if ema is not None:   # the average a backup kept; without one, it starts from the restored weights
                if "ema" in state:
                    ema.load_state_dict(state["ema"])
                else:
                    ema.module.load_state_dict(model.state_dict())
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
            raise InvalidTrainingInput(f"{checkpoint_dir / CHECKPOINT_FILE} does not fit this run of {model_name}: "
                                       f"{type(error).__name__}: {str(error)[:300]}") from None
        log.info("resuming from %s at epoch %d%s", checkpoint_dir / CHECKPOINT_FILE, initial_epoch,
                 f", step {partial['step']}" if partial and partial["step"] else "")
    trained = model
    if distributed:   # DDP broadcasts rank 0's parameters: every rank starts from the same weights
        trained = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    step_model = torch.compile(trained) if compiled else trained
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    decode_on_device = options.get("decode") == "gpu"
    # decode="gpu" decodes on the training GPU; without CUDA no device is named, so the loader says so once and
    # takes the CPU path. An explicit "device" wins ("cpu": the device path with libjpeg-turbo standing in for
    # nvJPEG, how it is tested without a GPU, slower than the CPU path)
    decode_device = options.pop("device", device if cuda else None)

    # CPU decode for a GPU: uint8 batches cross to the device and become floats there (a quarter of the
    # bytes over PCIe, and no float conversion on the CPU thread that drives the GPU)
    # (with a `cpu_share`, the batches the workers decode cross from pinned memory)
    loader_device = ({"device": decode_device, "pin_memory": cuda and bool(options.get("cpu_share"))}
                     if decode_on_device and decode_device is not None
                     else {"pin_memory": True, "dtype": torch.uint8} if cuda else {})

    def training_loader(size: int, epoch: int):   # endless, from `epoch`; one per phase of a progressive schedule
        made = pipeline.make_torch_loader(url, batch_size=batch_size, image_size=size, training=True, shard=shard,
                                          num_epochs=None, seed=seed, num_workers=num_workers, drop_remainder=True,
                                          return_ids=on_batch is not None, **loader_device, **options)
        made.dataset.set_epoch(epoch)
        return made

    size = sizes.size_at(initial_epoch)
    loader = training_loader(size, initial_epoch)
    first_step = 0
    if partial:   # the samples every rank had received, so the epoch goes on with exactly the rest
        positions = json.loads(partial["positions"])
        if distributed and shard is None:    # each rank reads a dataset of its own: only its position applies
            if partial["world"] != world:
                raise InvalidTrainingInput(f"{checkpoint_dir / CHECKPOINT_FILE} was backed up by {partial['world']} "
                                           "ranks each reading a dataset of its own: resume it on "
                                           f"{partial['world']} ranks, not {world}")
            positions = positions[rank]
        loader.load_state_dict(positions)
        # counted in the batches all ranks had trained: the world or the accumulation may differ from the backup's
        trained_batches = partial["step"] * partial["world"] * partial["accumulate"]
        first_step = max(0, min(steps, trained_batches // (world * accumulate)))
    val_loader, val_sharded, validation_loader = None, False, None
    if validation_data is not None:
        val_info = pipeline.dataset_info(os.fspath(validation_data), storage_options=options.get("storage_options"))
        if val_info.classes and info.classes and list(val_info.classes) != list(info.classes):
            raise InvalidTrainingInput("training and validation data label different classes; convert both with the "
                                       "same `classes`")
        val_shard = (rank, world) if world > 1 and int(val_info.row_groups) >= world else None
        eval_options = {k: v for k, v in options.items() if k in ("eval_crop", "dct_scale", "verify", "retries",
                                                                  "storage_options", "max_pixels", "stream",
                                                                  "cache_limit")}
        if decode_on_device:
            eval_options.update(decode="gpu")

        def validation_loader(size: int):   # every row once, at the phase's size
            return pipeline.make_torch_loader(os.fspath(validation_data), batch_size=batch_size, image_size=size,
                                              training=False, shard=val_shard, num_epochs=1, shuffle=False,
                                              **loader_device, **eval_options)
        val_loader = validation_loader(size)
        val_sharded = val_shard is not None

    metrics_csv = write_dir / "metrics.csv"
    if history:
        _write_csv(metrics_csv, history)
    ran, epoch_seconds, input_seconds = [], [], 0.0
    shown = contextlib.ExitStack()
    started = time.perf_counter()
    batches = iter(loader)
    if partial:   # after the iterator is made: making it draws from torch's generator
        torch.set_rng_state(partial["rng"])
    try:
        for epoch in range(initial_epoch, epochs):
            if sizes.size_at(epoch) != size:   # a new phase: loaders at its size, the stream going on where it was
                position = loader.state_dict()   # (an epoch of `steps_per_epoch` may end mid-pass)
                del batches   # ends the last phase's workers
                size = sizes.size_at(epoch)
                loader = training_loader(size, epoch)
                loader.load_state_dict(position)
                with torch.random.fork_rng(devices=[]):   # as a resumed run, which sets the saved state after it
                    batches = iter(loader)
                val_loader = validation_loader(size) if validation_loader else None
                log.info("epoch %d: images of %d px", epoch + 1, size)
            trained.train()
            epoch_started = time.perf_counter()
            # loss, correct, count summed on the device: read once an epoch (or backup), not once a step
            sums = torch.zeros(4 if top_k else 3, dtype=torch.float64, device=device)
            if partial and epoch == initial_epoch and rank == 0:   # the epoch's sums before the backup
                saved = [float(v) for v in partial["sums"]][:len(sums)]
                # a backup of a version without top-5 sums: this epoch's top-5 accuracy is not known
                saved += [math.nan] * (len(sums) - len(saved))
                sums += torch.tensor(saved, dtype=torch.float64, device=device)
            first = first_step if epoch == initial_epoch else 0
            advance = shown.enter_context(   # the epoch's progress on rank 0: a bar, or log lines (pinstorm.progress)
                progress_bar(f"epoch {epoch + 1}/{epochs}", steps - first, unit="steps",
                             enabled=None if rank == 0 else False))
            for step in range(first, steps):
                optim.zero_grad(set_to_none=True)
                if recipe.scheduled:   # a function of the step alone, so a resumed run goes on with the same rates
                    rate = recipe.learning_rate_at(epoch * steps + step, steps)
                    for group in optim.param_groups:
                        group["lr"] = rate
                step_ids = []
                for batch in range(accumulate):
                    waited = time.perf_counter()
                    images, labels, *ids = next(batches)
                    input_seconds += time.perf_counter() - waited   # the input stall: the model waits for a batch
                    images = _to_device(images, device, layout)
                    labels = labels.to(device, non_blocking=True)
                    # DDP all-reduces the gradients at the step's last batch only; the others add to them locally
                    syncs = batch == accumulate - 1 or not distributed
                    with contextlib.nullcontext() if syncs else trained.no_sync():
                        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                            logits = step_model(images)
                            loss = torch.nn.functional.cross_entropy(logits.float(), labels,
                                                                     label_smoothing=recipe.label_smoothing)
                        share = loss if accumulate == 1 else loss / accumulate   # the step's mean over its batches
                        (share if scaler is None else scaler.scale(share)).backward()
                    with torch.no_grad():
                        sums += _step_sums(loss * len(labels), logits, labels, top_k)
                    step_ids += ids
                if scaler is not None:
                    scaler.step(optim)
                    scaler.update()
                else:
                    optim.step()
                if ema is not None:
                    ema.update_parameters(model)
                if on_batch is not None:
                    on_batch(epoch, step, step_ids[0] if accumulate == 1 else torch.cat(step_ids))
                if backup_every and (step + 1) % backup_every == 0 and step + 1 < steps:
                    _backup(checkpoint_dir, rank, distributed, model=model, optim=optim, epoch=epoch, step=step + 1,
                            world=world, history=history, model_name=model_name, loader=loader,
                            sums=_sum_across(sums.tolist(), distributed), accumulate=accumulate, ema=ema)
                advance(1)
            shown.close()
            epoch_seconds.append(time.perf_counter() - epoch_started)
            logs = _metrics(_sum_across(sums.tolist(), distributed))
            if recipe.scheduled:   # the rate of the epoch's last step, as TensorFlow's fit logs it
                logs["learning_rate"] = recipe.learning_rate_at((epoch + 1) * steps - 1, steps)
            if val_loader is not None:
                evaluated = _evaluate([model] + ([ema.module] if ema is not None else []), val_loader, device,
                                      distributed and val_sharded, amp, layout, top_k)
                for prefix, metrics in zip(("val_", "val_ema_"), evaluated):
                    logs.update({f"{prefix}{k}": v for k, v in metrics.items()})
            for name, value in logs.items():
                history.setdefault(name, []).append(float(value))
            _write_csv(metrics_csv, history)
            if backup_every:   # with the input position: the next epoch goes on where the stream is
                _backup(checkpoint_dir, rank, distributed, model=model, optim=optim, epoch=epoch + 1, step=0,
                        world=world, history=history, model_name=model_name, loader=loader,
                        sums=[0.0] * len(sums), accumulate=accumulate, ema=ema)
            elif checkpoint_dir is not None and rank == 0:
                checkpoint_dir.mkdir(parents=True, exist_ok=True)
                _save({"format": CHECKPOINT_FORMAT, "epoch": epoch + 1, "model": model.state_dict(),
                       "optimizer": optim.state_dict(), "history": history, "model_name": model_name,
                       **({"ema": ema.state_dict()} if ema is not None else {})},
                      checkpoint_dir / CHECKPOINT_FILE)
            if distributed:
                dist.barrier()   # no rank starts the next epoch (or a relaunch) before the checkpoint is whole
            ran.append(epoch)
            log.info("epoch %d/%d: %s", epoch + 1, epochs, ", ".join(f"{k} {v:.4f}" for k, v in logs.items()))
            for callback in callbacks:
                callback(epoch, dict(logs))
    finally:
        shown.close()
        del batches   # ends the loader's worker processes
    fit_seconds = time.perf_counter() - started

    val_metrics = {}
    if val_loader is not None and ran:   # the last epoch's: `ema_*` for the moving average's
        val_metrics = {name[len("val_"):]: values[-1] for name, values in history.items() if name.startswith("val_")}
    elif val_loader is not None:   # nothing left to train (a finished run resumed): evaluated now
        evaluated = _evaluate([model] + ([ema.module] if ema is not None else []), val_loader, device,
                              distributed and val_sharded, amp, layout, top_k)
        val_metrics = {f"{prefix}{k}": v for prefix, metrics in zip(("", "ema_"), evaluated)
                       for k, v in metrics.items()}
    weights_path = write_dir / WEIGHTS_FILES["torch"]
    _save(model.state_dict(), weights_path)
    ema_weights_path = None
    if ema is not None:
        ema_weights_path = write_dir / EMA_WEIGHTS_FILES["torch"]
        _save(ema.module.state_dict(), ema_weights_path)
    plot_png = None
    if metrics_csv.exists():
        plot_png = plot_curves(read_metrics_csv(metrics_csv), write_dir / "curves.png",
                               title=f"{model_name} (torch): {world} process(es), global batch "
                                     f"{batch_size * world * accumulate}")
    if distributed:
        dist.barrier()   # every rank is past its last read of the checkpoint before rank 0 removes it
    if checkpoint_dir is not None and rank == 0:
        (checkpoint_dir / CHECKPOINT_FILE).unlink(missing_ok=True)
    train_seconds = sum(epoch_seconds)
    images = steps * batch_size * world * accumulate * len(ran)
    return TrainResult(
        history={k: v[len(v) - len(ran):] for k, v in history.items()}, val_metrics=val_metrics, model=model,
        epochs=ran,
        initial_epoch=ran[0] if ran else epochs, global_batch_size=batch_size * world * accumulate, replicas=world,
        steps_per_epoch=steps, seconds=fit_seconds, images_per_second=images / train_seconds if train_seconds else 0.0,
        strategy={**(choice.as_dict() if choice else {"kind": "single-process", "device": str(device)}),
                  "precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(amp, "fp32"),
                  "channels_last": channels_last, "compiled": bool(compiled),
                  "decode": "gpu" if loader.device_decoder is not None else "cpu",
                  **({"cpu_share": loader.dataset.cpu_share} if loader.dataset.cpu_share else {})},
        output_dir=str(write_dir), metrics_csv=str(metrics_csv), plot_png=str(plot_png) if plot_png else None,
        checkpoint_dir=str(checkpoint_dir) if checkpoint_dir else None, weights_path=str(weights_path),
        ema_weights_path=str(ema_weights_path) if ema_weights_path else None,
        num_classes=num_classes, is_chief=rank == 0, input_shards=[list(shard) if shard else None],
        framework="torch", input_stall=min(input_seconds / train_seconds, 1.0) if train_seconds else None,
    )
