"""``make_strategy``: choose a distribution strategy, prove its all-reduce works, fall back if not.

A broken NCCL does not fail when the strategy is created: it fails (``unhandled system error``)
or hangs at the first all-reduce, deep inside the first training step. So every strategy built
here runs one real replica-context all-reduce before it is handed out, in a thread with a
timeout. ``strategy.reduce`` is no probe: NcclAllReduce quietly reduces to one device for that
call and passes. When the probe fails, the strategy is rebuilt with ``ReductionToOneDevice``
(across workers: the RING collective), the original error is logged, and the choice is
recorded where ``strategy_choice(strategy)`` finds it.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow
from .errors import TrainingError

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import multiworker
from .fallback import error_line, fallback_warning, probe_outcome
from pinstorm.boards.safety import secrets

if TYPE_CHECKING:            # TensorFlow is imported where it is used: importing this module stays cheap,
    import numpy as np       # so the CLI can read STRATEGY_KINDS without loading TensorFlow
    import tensorflow as tf

log = secrets.logger("pinstorm.training")

# the strategy kinds make_strategy accepts; the CLI offers exactly these
STRATEGY_KINDS = ("auto", "mirrored", "multiworker", "one-device")
FALLBACKS = ("one-device", None)
_MIRRORED_OPS = ("auto", "nccl", "hierarchical", "one-device", "collective")
_WORKER_OPS = ("auto", "nccl", "ring", "collective")
_CHOICES: "weakref.WeakKeyDictionary[tf.distribute.Strategy, StrategyChoice]" = weakref.WeakKeyDictionary()


class StrategyError(TrainingError, RuntimeError):
    """A strategy cannot be built as asked (bad option, devices already initialised, ...)."""


class ProbeError(StrategyError):
    """The all-reduce probe failed; ``__cause__`` is the original error."""


class ProbeTimeout(ProbeError):
    """The all-reduce probe did not finish in time (broken NCCL often hangs rather than fails)."""


@dataclass
class StrategyChoice:
    """What ``make_strategy`` built and why; ``describe()`` is one line for logs and reports."""

    kind: str
    devices: list[str]
    requested: str
    cross_device_ops: str
    replicas: int
    probe_seconds: float | None = None
    fallback_from: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        names = ", ".join(d.rsplit("device:", 1)[-1] for d in self.devices)
        return (f"{self.kind} on {self.replicas} replica(s) [{names}] with {self.cross_device_ops}"
                + probe_outcome(self.fallback_from, self.error, self.probe_seconds))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def strategy_choice(strategy: tf.distribute.Strategy) -> StrategyChoice | None:
    """The record ``make_strategy`` kept for ``strategy`` (None for strategies built elsewhere).

    Args:
        strategy: A strategy ``make_strategy`` returned.

    Returns:
        The ``StrategyChoice`` (what was asked, what was built, the probe's result and any fallback), or None.
    """
    return _CHOICES.get(strategy)


# --------------------------------------------------------------------------- devices

def configure_cpu_devices(count: int) -> list[str]:
    """Split the CPU into ``count`` logical devices so mirrored training runs ``count`` replicas.

    TensorFlow fixes its devices when its runtime starts (the first op, or the first device
    listing), so this must run before that; asking again for the same count afterwards is fine.
    """
    if not isinstance(count, int) or count < 1:
        raise StrategyError(f"devices must be a positive integer, got {count!r}")
    tf = tensorflow()

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as exc:
        have = tf.config.list_logical_devices("CPU")
        if len(have) != count:
            raise StrategyError(
                f"TensorFlow was already initialised with {len(have)} logical CPU device(s), so it cannot be "
                f"split into {count} now: call make_strategy(devices={count}) (or configure_cpu_devices) "
                f"before any TensorFlow op runs, or use devices={len(have)}"
            ) from exc
    return [f"/device:CPU:{i}" for i in range(count)]


def _resolve_devices(devices) -> list[str]:
    """Device names for ``devices``: None = every GPU (else the CPU), N = the first N GPUs (else N CPUs)."""
    tf = tensorflow()

    gpus = tf.config.list_physical_devices("GPU")  # listing physical devices does not start the runtime
    if devices is None:
        return [f"/device:GPU:{i}" for i in range(len(gpus))] or ["/device:CPU:0"]
    if isinstance(devices, int) and not isinstance(devices, bool):
        if gpus:
            if devices > len(gpus):
                raise StrategyError(f"asked for {devices} devices but this machine has {len(gpus)} GPU(s)")
            return [f"/device:GPU:{i}" for i in range(devices)]
        return configure_cpu_devices(devices)
    if isinstance(devices, (list, tuple)) and devices and all(isinstance(d, str) for d in devices):
        return list(devices)
    raise StrategyError(f"devices must be None, a count or a list of device names, got {devices!r}")


def _all_gpu(devices: list[str]) -> bool:
    return bool(devices) and all("GPU" in d.upper() for d in devices)


# --------------------------------------------------------------------------- building

def _normalise(name) -> str:
    return str(name).lower().replace("_", "-").replace("reduction-to-one-device", "one-device")


def _mirrored_ops(spec, devices: list[str]):
    """(CrossDeviceOps or None for TF's default, label) for a mirrored strategy."""
    tf = tensorflow()

    if isinstance(spec, tf.distribute.CrossDeviceOps):
        return spec, type(spec).__name__
    name = "collective" if spec is None else _normalise(spec)
    if name == "auto":
        name = "nccl" if _all_gpu(devices) else "collective"
    if name == "nccl":
        return tf.distribute.NcclAllReduce(), "NcclAllReduce"
    if name == "hierarchical":
        return tf.distribute.HierarchicalCopyAllReduce(), "HierarchicalCopyAllReduce"
    if name == "one-device":
        return tf.distribute.ReductionToOneDevice(), "ReductionToOneDevice"
    if name in ("collective", "default"):
        return None, "default collective all-reduce"
    raise StrategyError(f"unknown cross_device_ops {spec!r} for a mirrored strategy; use one of {_MIRRORED_OPS}")


def _worker_implementation(spec):
    tf = tensorflow()

    name = "auto" if spec is None else _normalise(spec)
    implementations = tf.distribute.experimental.CommunicationImplementation
    table = {"auto": "AUTO", "collective": "AUTO", "nccl": "NCCL", "ring": "RING"}
    if name not in table:
        raise StrategyError(
            f"cross_device_ops {spec!r} does not apply across workers (they all-reduce with collectives); "
            f"use one of {_WORKER_OPS}"
        )
    return getattr(implementations, table[name]), f"{table[name]} collective"


def _build(kind: str, devices: list[str], ops_spec):
    tf = tensorflow()

    if kind == "one-device":
        # A one-device MirroredStrategy, not OneDeviceStrategy: the same single replica and no
        # all-reduce, but Keras's BackupAndRestore accepts it (it refuses OneDeviceStrategy), so
        # `checkpoint_dir` resumes on a laptop as it does on a multi-GPU host.
        return tf.distribute.MirroredStrategy(devices[:1]), "none (one device)"
    if kind == "mirrored":
        ops, label = _mirrored_ops(ops_spec, devices)
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops), label
    implementation, label = _worker_implementation(ops_spec)
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options), label


# --------------------------------------------------------------------------- probing

def _all_reduce_once(strategy: tf.distribute.Strategy) -> list[np.ndarray]:
    import numpy as np
    tf = tensorflow()

    @tf.function
    def step():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            value = tf.fill([8], tf.cast(context.replica_id_in_sync_group, tf.float32) + 1.0)
            return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

        return strategy.run(replica_fn)

    return [np.asarray(v) for v in strategy.experimental_local_results(step())]


def probe_all_reduce(strategy: tf.distribute.Strategy, timeout: float = 60.0) -> float:
    """Run one replica-context all-reduce on ``strategy``; return its seconds or raise ProbeError.

    The probe runs in a daemon thread joined with ``timeout``. A thread stuck in a hung
    collective cannot be cancelled: it is abandoned (it may keep holding the devices it
    blocked on, and it dies with the process) and ProbeTimeout is raised.
    """
    import numpy as np

    outcome: dict = {}

    def target():
        try:
            outcome["values"] = _all_reduce_once(strategy)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc

    started = time.perf_counter()
    thread = threading.Thread(target=target, name="pinstorm-all-reduce-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    seconds = time.perf_counter() - started
    if thread.is_alive():
        raise ProbeTimeout(
            f"the all-reduce probe did not finish within {timeout:g} s (hung collective); "
            "its thread was abandoned"
        )
    if "error" in outcome:
        error = outcome["error"]
        raise ProbeError(f"all-reduce probe failed: {error_line(error)}") from error
    replicas = strategy.num_replicas_in_sync
    expected = replicas * (replicas + 1) / 2
    for value in outcome["values"]:
        if not np.allclose(value, expected):
            raise ProbeError(f"all-reduce probe returned {value.tolist()} instead of {expected} on every replica")
    return seconds


# --------------------------------------------------------------------------- entry point

def choose_kind(kind: str, device_count: int, tf_config: dict | None) -> str:
    """What ``kind="auto"`` means here: several workers in TF_CONFIG -> multi-worker, several
    devices -> mirrored, else one device. Other kinds are returned as they are."""
    kind = _normalise(kind)
    if kind not in STRATEGY_KINDS:
        raise StrategyError(f"unknown strategy kind {kind!r}; use one of {STRATEGY_KINDS}")
    if kind != "auto":
        return kind
    if multiworker.cluster_size(tf_config) > 1:
        return "multiworker"
    return "mirrored" if device_count > 1 else "one-device"


def make_strategy(
    kind: str = "auto",
    devices=None,
    cross_device_ops="auto",
    fallback: str | None = "one-device",
    probe: bool = True,
    probe_timeout: float = 60.0,
) -> tf.distribute.Strategy:
    """Build a strategy whose all-reduce has been seen to work.

    ``kind``: ``"mirrored"``, ``"multiworker"`` (cluster from ``TF_CONFIG``), ``"one-device"``
    or ``"auto"`` (multi-worker when ``TF_CONFIG`` names several workers, mirrored when there
    are several devices, else one device). ``devices``: None (every GPU, else the CPU), a
    count (GPUs, or that many logical CPU devices on a machine without GPUs) or device names.
    ``cross_device_ops``: ``"auto"`` (NCCL when every device is a GPU, else TF's default
    collective), ``"nccl"``, ``"hierarchical"``, ``"one-device"`` (ReductionToOneDevice),
    ``"collective"`` or a ``tf.distribute.CrossDeviceOps``; across workers ``"auto"``,
    ``"nccl"`` or ``"ring"``. If the probe fails, ``fallback="one-device"`` rebuilds with
    ReductionToOneDevice (RING across workers) and logs why; ``fallback=None`` raises
    ProbeError with the original error as its cause.

    Args:
        kind: ``"auto"``, ``"mirrored"``, ``"multiworker"`` or ``"one-device"``.
        devices: None (every GPU, else the CPU), a count, or device names.
        cross_device_ops: How replicas all-reduce: ``"auto"``, ``"nccl"``, ``"hierarchical"``,
            ``"one-device"``, ``"collective"``, ``"ring"`` (across workers) or a ``tf.distribute.CrossDeviceOps``.
        fallback: ``"one-device"``: rebuild with ReductionToOneDevice when the probe fails; None: raise.
        probe: Run a small all-reduce first and fall back if it fails or hangs.
        probe_timeout: Seconds the probe may take.

    Returns:
        The ``tf.distribute.Strategy`` (`strategy_choice` gives its record).

    Raises:
        ProbeError: The probe failed and ``fallback`` is None.
    """
    kind = _normalise(kind)
    if kind not in STRATEGY_KINDS:
        raise StrategyError(f"unknown strategy kind {kind!r}; use one of {STRATEGY_KINDS}")
    if fallback not in FALLBACKS:
        raise StrategyError(f"fallback must be 'one-device' or None, got {fallback!r}")
    config = multiworker.read_tf_config()
    if kind == "auto" and multiworker.cluster_size(config) <= 1:
        kind = choose_kind(kind, len(_resolve_devices(devices)), config)
    kind = choose_kind(kind, 1, config)
    if kind == "multiworker":
        if config is None:
            raise StrategyError("kind='multiworker' needs TF_CONFIG naming the cluster (see training.multiworker)")
        worker_devices = _multiworker_devices(devices)
    else:
        worker_devices = _resolve_devices(devices)

    requested = cross_device_ops if isinstance(cross_device_ops, str) or cross_device_ops is None \
        else type(cross_device_ops).__name__
    strategy, label = _build(kind, worker_devices, cross_device_ops)
    choice = StrategyChoice(kind=kind, devices=list(strategy.extended.worker_devices), requested=str(requested),
                            cross_device_ops=label, replicas=strategy.num_replicas_in_sync)
    if probe and kind != "one-device":
        try:
            choice.probe_seconds = probe_all_reduce(strategy, probe_timeout)
        except ProbeError as exc:
            if fallback is None:
                raise
            reason = error_line(exc.__cause__) if exc.__cause__ else str(exc)
            fallback_ops = "ring" if kind == "multiworker" else "one-device"
            log.warning("%s", fallback_warning(label, reason, fallback_ops))
            strategy, fallback_label = _build(kind, worker_devices, fallback_ops)
            choice = StrategyChoice(kind=kind, devices=list(strategy.extended.worker_devices),
                                    requested=str(requested), cross_device_ops=fallback_label,
                                    replicas=strategy.num_replicas_in_sync, fallback_from=label,
                                    error=reason)
            choice.probe_seconds = probe_all_reduce(strategy, probe_timeout)
    _CHOICES[strategy] = choice
    log.info("strategy: %s", choice.describe())
    return strategy


def _multiworker_devices(devices) -> list[str]:
    """MultiWorkerMirroredStrategy uses every visible GPU (else one CPU); ``devices=N`` limits the GPUs."""
    tf = tensorflow()

    gpus = tf.config.list_physical_devices("GPU")
    if devices is None:
        return []
    if isinstance(devices, int) and not isinstance(devices, bool):
        if not gpus:
            if devices != 1:
                raise StrategyError("MultiWorkerMirroredStrategy runs one CPU replica per worker; "
                                    "use devices=None (or 1) on machines without GPUs")
            return []
        if devices > len(gpus):
            raise StrategyError(f"asked for {devices} devices but this machine has {len(gpus)} GPU(s)")
        tf.config.set_visible_devices(gpus[:devices], "GPU")
        return []
    raise StrategyError("across workers, devices must be None or a GPU count per worker")


def uses_gpus(strategy: tf.distribute.Strategy) -> bool:
    """Whether every replica of ``strategy`` runs on a GPU (then mixed precision pays off)."""
    return _all_gpu(list(strategy.extended.worker_devices))
