"""Constants and helpers shared by the training tests (the fixtures are in conftest_training.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile

import pytest

# AlexNet at 1/8 width on 32 px inputs: a few seconds per fit on 2 cores.
TINY = dict(image_size=32, batch_size=8, model_kwargs={"width": 0.125})
# digits: a mirrored digit is another digit, so no flips
NO_FLIP = {"flip": False, "crop_area": (0.6, 1.0)}


class Processes:
    """Subprocesses started by a test; every one still running at teardown is killed (SIGKILL:
    TensorFlow's multi-worker runtime handles SIGTERM itself and may not exit on it). stderr goes
    to a temporary file so a chatty process never blocks on a full pipe."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []

    def start(self, args, *, env=None, **kwargs) -> subprocess.Popen:
        log = tempfile.TemporaryFile(mode="w+")
        process = subprocess.Popen([sys.executable, *args], env={**os.environ, **(env or {})},
                                   stdout=subprocess.PIPE, stderr=log, text=True, **kwargs)
        process.stderr_log = log
        self.started.append(process)
        return process

    def kill_all(self):
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(10)
            process.stderr_log.close()


def stderr_of(process) -> str:
    process.stderr_log.seek(0)
    return process.stderr_log.read()


def finish(process: subprocess.Popen, timeout: float = 180) -> tuple[str, str]:
    """(stdout, stderr) of a process that must exit 0 within ``timeout`` seconds."""
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{process.args} did not finish in {timeout} s\n{stderr_of(process)[-3000:]}")
    err = stderr_of(process)
    assert process.returncode == 0, f"{process.args} exited {process.returncode}\n{err[-3000:]}"
    return out, err


def served_experiment(http_board, folder) -> str:
    """Pin the run folder ``folder`` on the served board (``http_board``); the experiment as a remote
    reader sees it (``web/<name>``)."""
    from pinstorm import boards

    board, _, url = http_board
    boards.pin(str(folder), name=folder.name, board=board)
    boards.board_register(url, name="web")
    return f"web/{folder.name}"


@contextlib.contextmanager
def rendezvous_store():
    """The store the ranks of a test's process group join, served here on a port the OS picked, as
    torchrun's agent serves its own: no port is chosen before it is bound, so tests running side by side
    never race for one. Yields the environment a rank needs besides RANK and WORLD_SIZE."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        yield dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True")
    finally:
        del store


class Killed(Exception):
    """Raised from ``on_batch``: the run stops after a step, as a crash would."""


def batch_recorder(seen: list, kill_at: tuple[int, int] | None = None):
    """A `train_torch` ``on_batch`` that keeps (epoch, step, ids) and raises ``Killed`` after step ``kill_at``."""

    def on_batch(epoch, step, ids):
        seen.append((epoch, step, ids.tolist()))
        if (epoch, step) == kill_at:
            raise Killed(f"killed after step {step} of epoch {epoch}")

    return on_batch
