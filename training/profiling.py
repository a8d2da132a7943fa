"""``profile``: where does the time go, on your board, your dataset and your machine.

Each stage of the path from a board to a training step is timed on its own, with the same
settings a fit would use: fetching pins from the board into a fresh cache (against a raw
parallel copy of the same bytes with fsspec: the floor for moving them), extracting them,
reading the Parquet dataset (no decode), reading + decoding + cropping it (``make_dataset``), a
training step on batches cached in memory (no input cost), and a short real ``train`` whose
speed against the cached steps gives the input-stall share. The slowest stage per epoch names
the bound, with what to change; a JSON report and a bar chart are written.

Fetch and extraction happen once per machine (the cache serves later runs); read, decode and the
step happen every epoch, so they decide training speed. The module is named ``profiling`` so
that ``pinstorm.training.profile`` stays the function.
"""

from __future__ import annotations

from . import keras_env  # noqa: F401  (must precede TensorFlow)
from .errors import TrainingError
from .plots import save_figure

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from pinstorm.boards.safety import secrets
from pinstorm import boards, pipeline
from pinstorm.pipeline import CHECKSUMMED, locate, open_part, read_info, read_row_group

log = secrets.logger("pinstorm.training")

IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png", ".bmp", ".gif", ".webp")
STALL_LIMIT = 0.10          # more than this share of a fit spent waiting for input: input-bound
CONTENTION = 1.5           # input alone this much faster than the step, yet stalling: shared cores
FETCH_FLOOR = 0.7           # fetch below this fraction of a raw copy: pinstorm's overhead, not storage
REPORT_JSON, REPORT_PNG = "profile.json", "profile.png"
EPOCHS = 3                  # timed fits: the first epoch traces; the fastest of the others is kept


class ProfileError(TrainingError, ValueError):
    """The profile cannot run as asked (nothing to measure, unknown pins, ...)."""


@dataclass
class StageTime:
    """One measured stage. ``rate`` in ``unit``/s; ``images_per_second`` puts stages on one scale."""

    name: str
    seconds: float
    amount: float
    unit: str
    images: int = 0
    per_epoch: bool = True
    detail: str = ""

    @property
    def rate(self) -> float:
        return self.amount / self.seconds if self.seconds > 0 else 0.0

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 and self.images else 0.0


@dataclass
class ProfileReport:
    """What ``profile`` measured, the bound it found and what to change."""

    stages: list[StageTime]
    bound: str | None
    advice: list[str]
    stall_share: float | None = None
    fetch_vs_raw: float | None = None
    settings: dict = field(default_factory=dict)
    json_path: str | None = None
    png_path: str | None = None

    def stage(self, name: str) -> StageTime | None:
        return next((s for s in self.stages if s.name == name), None)

    def summary(self) -> dict:
        stages = [dict(asdict(s), rate=s.rate, images_per_second=s.images_per_second) for s in self.stages]
        out = {k: v for k, v in self.__dict__.items() if k != "stages"}
        return secrets.scrub(json.loads(json.dumps(dict(out, stages=stages), default=str)))

    def lines(self) -> list[str]:
        out = []
        for s in self.stages:
            images = f"{s.images_per_second:10,.0f} img/s" if s.images_per_second else " " * 16
            mark = "  <- bound" if s.name == self.bound else ""
            out.append(f"{s.name:<28} {s.rate:12,.1f} {s.unit + '/s':<9} {images}  {s.detail}{mark}")
        if self.stall_share is not None:
            out.append(f"input stall in a real fit: {self.stall_share:.0%}")
        out += [f"- {a}" for a in self.advice]
        return out


# --------------------------------------------------------------------------- board stages

LOCAL_KINDS = ("local", "folder")    # boards whose files are read in place: no download, no index
INDEX_KINDS = ("datatxt", "url")            # boards read through a data.txt index (index_max_age applies)


def _cold_board(board):
    """(``board`` with an empty cache of its own, that cache's folder): a cold fetch, the user's cache untouched.

    ``board``: anything ``boards.resolve_board`` takes (None: the default board; a ``Board``, a registered name,
    ``board://NAME``, an http(s) URL: a url board, a spec dict). Nothing is registered.
    """

    if board is not None and not isinstance(board, (str, dict, boards.Board)):
        raise ProfileError(f"board must be a Board, a registered name, board://NAME, an http(s) URL or a spec "
                           f"dict, not {type(board).__name__}")
    try:
        board = boards.resolve_board(board)   # the one resolver: an http(s) URL is a url board, nothing registered
    except boards.BoardError as e:
        raise ProfileError(str(e)) from e
    cache = tempfile.mkdtemp(prefix="pinstorm-profile-cache-")
    return board.with_cache(cache), cache


def _default_pins(board, max_pins: int) -> list[str]:
    """The first categories of a board made by ``repartition``, else its first pins."""

    try:
        table = boards.pin_get("categories", board=board)
        if hasattr(table, "columns") and "id" in table.columns:
            return [str(i) for i in sorted(table["id"])][:max_pins]
    except Exception:  # noqa: BLE001 - not a repartitioned board: fall back to its pins
        pass
    found = boards.pin_find("", board=board)
    names = [str(n) for n in found["name"]]
    if not names:
        raise ProfileError(f"board {getattr(board, 'name', board)!r} holds no pins to fetch")
    return names[:max_pins]


def _remote_files(clone, pins: list[str], fetched: dict) -> list[tuple[object, str, int]]:
    """(filesystem, remote path, bytes) of every fetched file, for the raw-copy baseline.

    Boards in the pins 1.x layout keep a version's files at ``<board>/<pin>/<version>/<file>``;
    ``describe()`` gives the board's location (a URL or a folder).
    """
    import fsspec

    base = str(clone.describe()).rstrip("/")
    fs = getattr(clone, "fs", None)   # a cloud board's filesystem carries its endpoint and credentials
    if fs is None or not hasattr(fs, "get_file") or base.startswith(("http://", "https://")):
        fs, _ = fsspec.core.url_to_fs(base)
    out = []
    for pin in pins:
        version = str(boards.pin_versions(pin, board=clone)["version"].iloc[-1])
        for path in fetched[pin]:
            parts = Path(path).parts
            if version not in parts:
                raise ProfileError(f"{path}: not in the pins 1.x layout")
            rel = "/".join(parts[parts.index(version) + 1:])
            out.append((fs, f"{base}/{pin}/{version}/{rel}", os.path.getsize(path)))
    return out


def _raw_copy(files, parallel: int, scratch: Path) -> float:
    """Seconds to copy ``files`` with fsspec, ``parallel`` at once, nothing else (no metadata, no checks)."""
    scratch.mkdir(parents=True, exist_ok=True)

    def copy(item):
        index, (fs, remote, _) = item
        fs.get_file(remote, str(scratch / f"{index}"))

    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, parallel)) as pool:
        list(pool.map(copy, enumerate(files)))
    return time.perf_counter() - started


def _is_image(path) -> bool:
    return str(path).lower().endswith(IMAGE_SUFFIXES)


def _board_stages(board, pins, max_pins: int, fetch_parallel: int, scratch: Path):
    """(stages, fetch speed as a fraction of a raw copy or None, the pins fetched, the board's kind)."""

    clone, cache = _cold_board(board)
    try:
        pins = list(pins) if pins else _default_pins(clone, max_pins)
        started = time.perf_counter()
        fetched = boards.pin_get_many(pins, board=clone, parallel=fetch_parallel, extract=False)
        seconds = time.perf_counter() - started
        fetched = {p: [fetched[p]] if isinstance(fetched[p], (str, os.PathLike)) else list(fetched[p]) for p in pins}
        paths = [p for v in fetched.values() for p in v]
        size = sum(os.path.getsize(p) for p in paths)
        stages = [StageTime("board fetch", seconds, size / 1e6, "MB", sum(map(_is_image, paths)), per_epoch=False,
                            detail=f"{len(pins)} pins, {fetch_parallel} in parallel, {size / 1e6:.1f} MB")]
        ratio = None
        try:
            remote = _remote_files(clone, pins, fetched)
            raw_seconds = _raw_copy(remote, fetch_parallel, scratch / "raw-copy")
            stages.append(StageTime("raw fsspec copy (baseline)", raw_seconds, size / 1e6, "MB", per_epoch=False,
                                    detail=f"the same {len(remote)} files, {fetch_parallel} at once"))
            ratio = (raw_seconds / seconds) if seconds > 0 else None
            stages[0].detail += f", {ratio:.2f}x a raw copy"
        except Exception as error:  # noqa: BLE001 - the baseline is optional; say why it is missing
            stages[0].detail += f" (no raw-copy baseline: {error})"
        # the same call again, every file now cached: what listing versions and reading metadata cost
        started = time.perf_counter()
        boards.pin_get_many(pins, board=clone, parallel=fetch_parallel, extract=False)
        metadata = time.perf_counter() - started
        stages.append(StageTime("board metadata", metadata, len(pins), "pins", per_epoch=False,
                                detail=f"the same fetch with every file cached: {_share(metadata, seconds)}"))
        archives = [p for p in paths if str(p).lower().endswith((".zip", ".tar", ".tar.gz", ".tgz", ".gz"))]
        if archives:
            started = time.perf_counter()
            extracted = boards.pin_get_many(pins, board=clone, parallel=fetch_parallel, extract=True)
            total = time.perf_counter() - started
            # the metadata part is timed above; when what is left is within its noise, show the total
            seconds, note = (total - metadata, "metadata time taken out") if total - metadata > 0.2 * total \
                else (total, "metadata included: extraction is within its noise")
            files = [p for v in extracted.values() for p in ([v] if isinstance(v, (str, os.PathLike)) else v)]
            out_bytes = sum(os.path.getsize(p) for p in files if os.path.isfile(p))
            stages.append(StageTime("extraction", seconds, out_bytes / 1e6, "MB", sum(map(_is_image, files)),
                                    per_epoch=False, detail=f"{len(archives)} archives -> {len(files)} files "
                                                            f"({note})"))
        return stages, ratio, pins, clone.kind
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _share(part: float, whole: float) -> str:
    """``part`` as a share of ``whole``, never more than all of it: two timings of noisy runs can cross
    (a cached re-run slower than the cold fetch), and "146% of the fetch" says nothing true."""
    if whole <= 0 or part >= 0.95 * whole:
        return "as long as the fetch itself: the fetch is all metadata and checks"
    return f"{part / whole:.0%} of the fetch"


# --------------------------------------------------------------------------- dataset stages

def _parquet_read(url: str, max_rows: int, min_seconds: float = 0.5, storage_options: dict | None = None) -> StageTime:
    """Rows/s of reading the stored row groups (image and label, no decode), as the reader does.

    A small dataset is read again until ``min_seconds`` have passed, so the rate is not all start-up.
    """

    location = locate(url, storage_options)  # what make_dataset reads, and as it reads it: checked and bounded row groups
    info = read_info(location)
    rows = nbytes = passes = 0
    started = time.perf_counter()
    while rows < max_rows and (passes == 0 or time.perf_counter() - started < min_seconds):
        passes += 1
        for name in sorted(info.files):
            handle = open_part(location, info, name, CHECKSUMMED)
            try:
                for rg in range(handle.num_row_groups):
                    table = read_row_group(handle, location, info, name, rg)
                    rows += table.num_rows
                    nbytes += table.nbytes
            finally:
                handle.close()
            if rows >= max_rows:
                break
    seconds = time.perf_counter() - started
    return StageTime("parquet read", seconds, rows, "rows", rows,
                     detail=f"{rows} rows in {passes} pass(es), {nbytes / seconds / 1e6 if seconds else 0:.0f} MB/s "
                            f"({info.rows} rows stored)")


def _decode(url: str, *, batch: int, image_size: int, parallel, input_options: dict, rows: int,
            max_rows: int) -> StageTime:
    """Images/s of ``make_dataset`` itself: read + decode + crop + resize, with the fit's settings.

    The first batch (graph building, first reads) is not timed; at least one epoch or 20 batches are.
    """

    options = {k: v for k, v in input_options.items()
               if k in ("crop_area", "flip", "engine", "reader_workers", "storage_options")}
    dataset = pipeline.make_dataset(url, batch_size=batch, image_size=(image_size, image_size), training=True,
                                    num_epochs=None, seed=0, parallel=parallel, drop_remainder=True, **options)
    batches = max(1, min(max(rows, 20 * batch), max_rows) // batch)
    iterator = iter(dataset)
    next(iterator)
    images = 0
    started = time.perf_counter()
    for _ in range(batches):
        images += int(next(iterator)[0].shape[0])
    seconds = time.perf_counter() - started
    return StageTime("decode (make_dataset)", seconds, images, "img", images,
                     detail=f"parallel={parallel or 'AUTOTUNE'}, {image_size} px crops")


class _EpochTimes:
    """Keras callback: wall time of each epoch (the first includes tracing and is not used)."""

    def __new__(cls):
        import tf_keras as keras

        class Callback(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.seconds: list[float] = []

            def on_epoch_begin(self, epoch, logs=None):
                self._started = time.perf_counter()

            def on_epoch_end(self, epoch, logs=None):
                self.seconds.append(time.perf_counter() - self._started)

        return Callback()


def _cached_steps(url, strategy, model, *, image_size, batch_size, steps, storage_options=None) -> StageTime:
    """Images/s of ``model``'s training steps on batches decoded once and held in memory: no input cost.

    ``model`` is the one the real fit just trained (compiled, same strategy), so the two timings
    differ only by where batches come from, and are taken one right after the other.
    """
    import numpy as np
    from .keras_env import tensorflow

    tf = tensorflow()

    global_batch = batch_size * strategy.num_replicas_in_sync
    reader = pipeline.make_dataset(url, batch_size=global_batch, image_size=(image_size, image_size), training=True,
                                   num_epochs=1, seed=0, drop_remainder=True, flip=False,
                                   storage_options=storage_options)
    batches = list(reader.take(min(steps, 8)).as_numpy_iterator())
    del reader   # the reader is released: nothing but the step is left to time
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch, drop_remainder=True)
    dataset = dataset.cache().repeat().prefetch(tf.data.AUTOTUNE)
    timer = _EpochTimes()
    model.fit(dataset, epochs=EPOCHS, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    seen = steps * global_batch
    return StageTime("train step (cached input)", min(timer.seconds[1:]), seen, "img", seen,
                     detail=f"{model.name}, {strategy.num_replicas_in_sync} replica(s), global batch {global_batch}")


def _real_fit(url, strategy, *, model_name, model_kwargs, image_size, batch_size, steps, parallel, input_options,
              output_dir):
    """(stage, model) of a short real ``train``: input and step together, as in production."""
    from .fit import train

    timer = _EpochTimes()
    result = train(model_name, url, strategy=strategy, epochs=EPOCHS, steps_per_epoch=steps, batch_size=batch_size,
                   image_size=image_size, parallel=parallel, model_kwargs=model_kwargs, input_options=input_options,
                   output_dir=output_dir, callbacks=[timer], verbose=0, seed=0)
    images = steps * result.global_batch_size
    return StageTime("real fit", min(timer.seconds[1:]), images, "img", images,
                     detail=f"train() for {EPOCHS} epochs of {steps} steps, the fastest after the first"), result.model


# --------------------------------------------------------------------------- verdict

def _verdict(stages: list[StageTime], stall: float | None, fetch_ratio: float | None, *, replicas: int,
             gpus: bool, parallel, fetch_parallel: int, pins: int = 0,
             board_kind: str | None = None) -> tuple[str | None, list[str]]:
    """(the bound, advice). Advice names what to change in Python and on the command line, and is
    given only where it applies to this board (``board_kind``: ``Board.kind``)."""
    by_name = {s.name: s for s in stages}
    advice: list[str] = []
    bound = None
    epoch_stages = [s for s in stages if s.per_epoch and s.images_per_second and s.name != "real fit"]
    step = by_name.get("train step (cached input)")
    inputs = [s for s in epoch_stages if s is not step]
    contention = False
    if stall is not None and step is not None and inputs:
        slowest = min(inputs, key=lambda s: s.images_per_second)
        bound = slowest.name if stall > STALL_LIMIT else step.name
        # alone, the input outruns the step, yet the fit waits: both compete for the same cores
        contention = stall > STALL_LIMIT and slowest.images_per_second > CONTENTION * step.images_per_second
    elif epoch_stages:
        bound = min(epoch_stages, key=lambda s: s.images_per_second).name
    cores = os.cpu_count() or 1
    smaller = "store smaller images (convert(..., max_side=512); pinstorm convert --max-side 512)"
    if contention:
        alone = by_name[bound].images_per_second
        advice.append(f"{stall:.0%} of the fit waits for input although the input alone runs at "
                      f"{alone:,.0f} img/s, {alone / step.images_per_second:.1f}x the "
                      f"step: decoding and training compete for the same {cores} cores. Decode less ({smaller}, "
                      "smaller crops), use fewer replicas per host (--devices), or give the host more cores")
    elif bound == "decode (make_dataset)":
        advice.append(f"decoding bounds training ({by_name[bound].images_per_second:,.0f} img/s"
                      f"{f', {stall:.0%} of the fit waits for input' if stall is not None else ''}): "
                      f"more decode threads (parallel={parallel or 'AUTOTUNE'} now, {cores} cores; --parallel N), "
                      f"{smaller}, or fewer replicas per host (--devices) so decoding keeps more cores")
    elif bound == "parquet read":
        advice.append("reading the Parquet files bounds training: put the dataset on a local SSD (a board:// "
                      "dataset is cached locally on first use) or use larger row groups (convert(..., "
                      "row_group_size_mb=...); pinstorm convert --row-group-size-mb N)")
    elif bound == "train step (cached input)":
        text = (f"the training step bounds throughput; the input keeps up"
                f"{f' (stall {stall:.0%})' if stall is not None else ''}")
        if replicas > 1 and not gpus:
            text += f": {replicas} replicas share {cores} CPU cores here, use fewer replicas per host (--devices)"
        elif gpus:
            text += ": use mixed precision and a larger per-replica batch (--batch-size), or more accelerators"
        else:
            text += ": a faster model or more devices, not a faster pipeline, will help"
        advice.append(text)
    fetch, extract = by_name.get("board fetch"), by_name.get("extraction")
    if fetch is not None:
        advice += _fetch_advice(fetch, by_name, fetch_ratio, fetch_parallel, pins, board_kind)
        if extract is not None and extract.images_per_second and extract.seconds > fetch.seconds:
            advice.append("extraction takes longer than the download: pin categories unzipped "
                          "(repartition(..., zip=False); pinstorm repartition --no-zip) or extract in processes "
                          "(pin_get_many(..., parallel='processes:N'))")
    return bound, advice


def _fetch_advice(fetch: StageTime, by_name: dict, fetch_ratio, fetch_parallel: int, pins: int,
                  board_kind: str | None) -> list[str]:
    """What to change about fetching, for this kind of board only."""
    advice = []
    local = board_kind in LOCAL_KINDS
    raw = by_name.get("raw fsspec copy (baseline)")
    if fetch_ratio is not None and fetch_ratio < FETCH_FLOOR and raw is not None:
        extra_ms = max(0.0, fetch.seconds - raw.seconds) * 1000 * min(fetch_parallel, pins) / max(1, pins)
        advice.append(f"fetching runs at {fetch_ratio:.2f}x a raw copy of the same bytes (about {extra_ms:.0f} ms "
                      "per pin of metadata requests and checks): more parallel fetches "
                      f"(parallel={2 * fetch_parallel} or 'processes:N' in pin_get_many; profile --fetch-parallel "
                      f"{2 * fetch_parallel}), fewer and larger pins")
    elif fetch_ratio is not None and not local:
        advice.append(f"fetching runs at {fetch_ratio:.2f}x a raw copy: the storage itself is the limit; keep "
                      "the board cache on a local SSD so it is fetched once, or bring the data closer")
    metadata = by_name.get("board metadata")
    if metadata is not None and metadata.seconds > 0.5 * fetch.seconds:
        if metadata.seconds >= 0.95 * fetch.seconds:
            text = (f"the fetch is all metadata and checks: with every file cached it takes as long "
                    f"({metadata.seconds:.2f} s)")
        else:
            text = f"{metadata.seconds:.2f} s of the {fetch.seconds:.2f} s fetch is metadata"
        if board_kind in INDEX_KINDS:
            text += (" (listing versions, reading data.txt): raise index_max_age so data.txt is re-read at most "
                     "once a minute (board_datatxt(url, index_max_age=60); pinstorm board register datatxt "
                     "--url URL --option index_max_age=60), and use fewer, larger pins")
        elif local:
            text += (" (a local board is read in place: fetching is listing versions and checking files); "
                     "use fewer, larger pins")
        else:
            text += " (listing versions, reading metadata); use fewer, larger pins"
        advice.append(text)
    return advice


def _chart(report: ProfileReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [s for s in report.stages if s.images_per_second]
    moved = [s for s in report.stages if s.unit == "MB"]
    panels = [p for p in (rated, moved) if p]
    figure, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.5 * max(1, len(panels)), 3.4), squeeze=False)
    for axis, stages in zip(axes[0], panels):
        per_image = stages is rated
        names = [s.name for s in stages][::-1]
        values = [(s.images_per_second if per_image else s.rate) for s in stages][::-1]
        colours = ["#c44e52" if s.name == report.bound else "#4c72b0" for s in stages][::-1]
        axis.barh(names, values, color=colours)
        axis.set_xlabel("images/s" if per_image else "MB/s")
        axis.set_title("per stage (red: the bound)" if per_image else "moving bytes")
        if per_image and max(values) > 20 * max(min(values), 1e-9):
            axis.set_xscale("log")
    figure.suptitle("pinstorm profile" + (f": input stall {report.stall_share:.0%}" if report.stall_share is not None
                                          else ""))
    figure.tight_layout()
    return save_figure(figure, path)


def _write_json(path: Path, data: dict) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data, indent=2, default=str))
    os.replace(temporary, path)


# --------------------------------------------------------------------------- entry point

def profile(
    dataset=None,
    *,
    board=None,
    pins=None,
    max_pins: int = 8,
    model_name: str = "alexnet",
    model_kwargs: dict | None = None,
    image_size: int = 224,
    batch_size: int = 32,
    strategy=None,
    parallel: int | None = None,
    fetch_parallel: int = 8,
    steps: int = 20,
    max_rows: int = 20_000,
    input_options: dict | None = None,
    output_dir=None,
    echo: Callable[[str], None] | None = None,
) -> ProfileReport:
    """Measure each stage from ``board`` to a training step on ``dataset``; name the bound.

    ``board`` (a ``Board``, a registered name or a data.txt URL; fetched into a fresh cache of its
    own, nothing registered) and ``pins`` (default: the first ``max_pins``
    categories of a ``repartition``-made board, else its first pins) profile fetching and
    extraction; ``dataset`` (a Parquet URL from ``convert``) profiles reading, decoding, cached
    training steps and a short real fit of ``steps`` steps, with the model, sizes, ``strategy``
    (default ``make_strategy("auto")``), ``parallel`` decodes and ``input_options`` you would train
    with. Writes ``profile.json`` and ``profile.png`` into ``output_dir`` (default: a new
    temporary folder) and returns a ``ProfileReport``.

    Args:
        dataset: A Parquet dataset URL from `convert`: profiles reading, decoding and training steps
            (None: those stages are not measured).
        board: A ``Board``, a registered board name or a data.txt URL: profiles fetching and extraction
            (None: not measured).
        pins: The pins of ``board`` to fetch (None: the first ``max_pins`` categories of a
            ``repartition``-made board, else its first pins).
        max_pins: How many pins to fetch when ``pins`` is None.
        model_name: The model whose steps are timed (`build_model`).
        model_kwargs: Keyword arguments for the model builder.
        image_size: Square side in pixels the reader resizes to.
        batch_size: Images per step per replica.
        strategy: A ``tf.distribute.Strategy`` (None: ``make_strategy("auto")``).
        parallel: Parallel decode calls of the reader (None: ``tf.data.AUTOTUNE``).
        fetch_parallel: Pins fetched at once.
        steps: Steps of the short real fit.
        max_rows: At most this many rows are read when timing the reader.
        input_options: Reader options for `make_dataset` (`ReaderOptions`), as you would train with.
        output_dir: Where ``profile.json`` and ``profile.png`` go (None: a new temporary folder).
        echo: A function called with each progress line (None: quiet).

    Returns:
        A ``ProfileReport``: each stage's throughput, and the bound named.
    """
    if dataset is None and board is None:
        raise ProfileError("profile() needs a dataset (Parquet URL), a board, or both")
    if steps < 2 or batch_size < 1 or max_rows < 1:
        raise ProfileError(f"steps must be at least 2 and batch_size, max_rows positive (got {steps}, {batch_size}, "
                           f"{max_rows})")
    say = echo or (lambda text: None)
    output = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="pinstorm-profile-"))
    output.mkdir(parents=True, exist_ok=True)
    input_options = dict(input_options or {})
    stages: list[StageTime] = []
    fetch_ratio = stall = board_kind = None
    replicas, gpus = 1, False
    scratch = Path(tempfile.mkdtemp(prefix="pinstorm-profile-scratch-", dir=output))

    def add(stage: StageTime) -> None:
        stages.append(stage)
        say(f"{stage.name:<28} {stage.rate:12,.1f} {stage.unit}/s  {stage.detail}")

    try:
        if board is not None:
            board_stages, fetch_ratio, pins, board_kind = _board_stages(board, pins, max_pins, fetch_parallel,
                                                                        scratch)
            for stage in board_stages:
                add(stage)
        if dataset is not None:
            from .strategy import make_strategy, uses_gpus

            url = os.fspath(dataset)
            info = pipeline.dataset_info(url, storage_options=(input_options or {}).get("storage_options"))
            strategy = strategy or make_strategy("auto")
            replicas, gpus = strategy.num_replicas_in_sync, uses_gpus(strategy)
            global_batch = batch_size * replicas
            if info.rows < global_batch:
                raise ProfileError(f"{url} has {info.rows} rows, fewer than one global batch of {global_batch}")
            add(_parquet_read(url, max_rows, storage_options=(input_options or {}).get("storage_options")))
            add(_decode(url, batch=global_batch, image_size=image_size, parallel=parallel,
                        input_options=input_options, rows=int(info.rows), max_rows=max_rows))
            real, model = _real_fit(url, strategy, model_name=model_name, model_kwargs=model_kwargs,
                                    image_size=image_size, batch_size=batch_size, steps=steps, parallel=parallel,
                                    input_options=input_options, output_dir=scratch / "fit")
            cached = _cached_steps(url, strategy, model, image_size=image_size, batch_size=batch_size, steps=steps,
                                   storage_options=input_options.get("storage_options"))
            add(cached)
            add(real)
            if cached.images_per_second:
                stall = max(0.0, 1.0 - real.images_per_second / cached.images_per_second)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    bound, advice = _verdict(stages, stall, fetch_ratio, replicas=replicas, gpus=gpus, parallel=parallel,
                             fetch_parallel=fetch_parallel, pins=len(pins or []), board_kind=board_kind)
    settings = dict(dataset=os.fspath(dataset) if dataset is not None else None,
                    board=board if isinstance(board, (str, type(None))) else getattr(board, "name", str(board)),
                    pins=list(pins) if pins else None, model_name=model_name, model_kwargs=model_kwargs or {},
                    image_size=image_size, batch_size=batch_size, replicas=replicas, parallel=parallel,
                    fetch_parallel=fetch_parallel, steps=steps, input_options=input_options, cpu_count=os.cpu_count())
    report = ProfileReport(stages, bound, advice, stall, fetch_ratio, settings)
    report.png_path = str(_chart(report, output / REPORT_PNG))
    report.json_path = str(output / REPORT_JSON)
    _write_json(output / REPORT_JSON, report.summary())
    if bound:
        say(f"bound: {bound}")
    for line in advice:
        say(f"- {line}")
    say(f"report: {report.json_path}, chart: {report.png_path}")
    return report
