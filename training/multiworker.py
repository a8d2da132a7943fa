"""``TF_CONFIG`` helpers for multi-worker runs.

MultiWorkerMirroredStrategy learns the cluster from the ``TF_CONFIG`` environment variable;
these helpers read and write it, tell the chief from the other workers (only the chief may
write shared outputs), and pick free ports for workers started on one machine. Importing
this module does not import TensorFlow.

Workers started on one machine (``local_cluster``, tests, ``spark_train`` on a local master) are
addressed as 127.0.0.1, so peers connect over loopback only. TensorFlow's gRPC server itself
listens on every interface whatever ``TF_CONFIG`` says (TF has no bind-address setting); firewall
the ports on a shared machine.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from .errors import TrainingError


class MultiWorkerError(TrainingError, ValueError):
    """``TF_CONFIG`` is missing, malformed, or describes a task that is not in its cluster."""


def read_tf_config(environ=None) -> dict | None:
    """The parsed ``TF_CONFIG`` of this process, or None when it is unset or empty."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "").strip()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise MultiWorkerError(f"TF_CONFIG is not valid JSON: {exc}") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not any(cluster.get(role) for role in ("chief", "worker")):
        raise MultiWorkerError("TF_CONFIG needs a 'cluster' with 'worker' (and optionally 'chief') addresses")
    task = config.get("task") or {}
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type is not None:
        members = cluster.get(task_type)
        if not isinstance(members, list) or not isinstance(index, int) or not 0 <= index < len(members):
            raise MultiWorkerError(f"TF_CONFIG task {task_type}:{index} is not in the cluster {cluster}")
    return config


def cluster_size(config: dict | None) -> int:
    """How many training processes (chief + workers) the cluster has; 1 without ``TF_CONFIG``."""
    if not config:
        return 1
    cluster = config["cluster"]
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def task_rank(config: dict | None) -> int:
    """This process's position among the training processes (chief first), 0 without ``TF_CONFIG``."""
    if not config:
        return 0
    task = config.get("task") or {}
    if task.get("type") == "chief":
        return 0
    return len(config["cluster"].get("chief", [])) + int(task.get("index", 0))


def is_chief(config: dict | None) -> bool:
    """Whether this process writes the shared outputs (the chief, or worker 0 when there is none)."""
    return task_rank(config) == 0


def make_tf_config(workers: list[str], index: int, task_type: str = "worker") -> str:
    """The ``TF_CONFIG`` JSON for task ``index`` of a cluster of ``workers`` (``host:port`` strings)."""
    if not workers:
        raise MultiWorkerError("a cluster needs at least one worker address")
    if not 0 <= index < len(workers):
        raise MultiWorkerError(f"task index {index} is outside a cluster of {len(workers)} workers")
    return json.dumps({"cluster": {task_type: list(workers)}, "task": {"type": task_type, "index": index}})


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it; the socket is closed for TF to bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def local_cluster(num_workers: int, host: str = "127.0.0.1") -> list[str]:
    """``host:port`` addresses for ``num_workers`` workers started on this machine."""
    return [f"{host}:{free_port(host)}" for _ in range(num_workers)]


def worker_output_dir(base: str | os.PathLike, config: dict | None) -> Path:
    """Where this process may write: ``base`` for the chief, ``base/workers/<rank>`` otherwise.

    Every worker of a multi-worker fit must save (the saves are collective), but only the chief's
    files are the result; the others write beside them so nothing is clobbered.
    """
    base = Path(base)
    return base if is_chief(config) else base / "workers" / f"rank{task_rank(config)}"
